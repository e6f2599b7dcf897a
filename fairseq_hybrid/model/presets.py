"""The architectures' sizes: the values each ``--arch`` preset of ``hybrid_lstm`` gives the
options it owns when the user leaves them unset. The one table: the plugin's config applies
it (``plugin/config.apply_preset``), and the planning models and the benchmarks read their
model sizes from it.

hybrid_lstm: small, for tests and the bundled sample; hybrid_lstm_wmt_en_de: fairseq's
lstm_luong_wmt_en_de sizes (4+4 layers x 1000) without input feeding, no dropout between
layers. A preset's missing entries come from hybrid_lstm.
"""
from __future__ import annotations

from typing import Any, Dict, List

BASE_PRESET = "hybrid_lstm"

PRESETS: Dict[str, Dict[str, Any]] = {
    BASE_PRESET: dict(
        encoder_embed_dim=256, encoder_hidden_size=256, encoder_layers=2,
        decoder_embed_dim=256, decoder_hidden_size=256, decoder_layers=2,
        decoder_out_embed_dim=256,
    ),
    "hybrid_lstm_wmt_en_de": dict(
        encoder_embed_dim=1000, encoder_hidden_size=1000, encoder_layers=4,
        decoder_embed_dim=1000, decoder_hidden_size=1000, decoder_layers=4,
        decoder_out_embed_dim=1000, encoder_dropout_out=0.0, decoder_dropout_out=0.0,
    ),
}


def preset_values(name: str) -> Dict[str, Any]:
    """Every value preset ``name`` sets: its own over hybrid_lstm's."""
    return {**PRESETS[BASE_PRESET], **PRESETS[name]}


def preset_options(name: str) -> List[str]:
    """Preset ``name``'s values as fairseq-train options (``--encoder-layers 2 ...``), for
    an architecture that does not set them itself (fairseq's ``lstm``)."""
    options: List[str] = []
    for key, value in preset_values(name).items():
        options += ["--" + key.replace("_", "-"), str(value)]
    return options
