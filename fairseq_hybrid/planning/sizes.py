"""The sizes the performance model works with: model and batch shapes, and the benchmark
presets (an architecture preset's sizes, a vocabulary, the batches measured; the model and
synthetic batch built from them are the benchmarks' own: ``benchmarks/models.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from ..model.presets import preset_values
from ..parallel.placement import build_plan


@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    embed: int
    vocab: int
    dropout: float = 0.1  # --dropout (embeddings in; between layers and H_c unless overridden)
    dropout_out: Optional[float] = None  # between layers and on H_c (None: --dropout)
    decoder_hidden: Optional[int] = None  # None: ``hidden`` (another size adds the bridge)

    @property
    def decoder_size(self) -> int:
        """The decoder's hidden size: the attention's query and H's width."""
        return self.decoder_hidden or self.hidden

    @property
    def has_bridge(self) -> bool:
        """Encoder and decoder sizes differ: decoder layer l starts from a bridged state."""
        return self.decoder_size != self.hidden

    @classmethod
    def of_preset(cls, arch: str, vocab: int, dropout: float = 0.1) -> "ModelSize":
        """The sizes of architecture preset ``arch`` (``model/presets.py``), with ``vocab``
        and ``--dropout``."""
        values = preset_values(arch)
        hidden, decoder_hidden = values["encoder_hidden_size"], values["decoder_hidden_size"]
        return cls(values["encoder_layers"], hidden, values["encoder_embed_dim"], vocab, dropout,
                   values.get("encoder_dropout_out"), None if decoder_hidden == hidden else decoder_hidden)


@dataclass(frozen=True)
class BatchSize:
    sentences: int
    source_len: int
    target_len: int

    @property
    def target_tokens(self) -> int:
        return self.sentences * self.target_len

    @property
    def source_tokens(self) -> int:
        return self.sentences * self.source_len


@dataclass(frozen=True)
class Preset:
    """A benchmark preset: an architecture preset (``model/presets.py``: its sizes) with a
    vocabulary and the batches the benchmarks measure."""
    arch: str
    vocab: int
    batch: BatchSize  # measured on this CPU
    quick_batch: BatchSize
    note: str = ""
    gpu_batch: Optional[BatchSize] = None  # what a GPU trains with (modelled by profiles)

    @property
    def model(self) -> ModelSize:
        return ModelSize.of_preset(self.arch, self.vocab)


BENCHMARK_PRESETS: Dict[str, Preset] = {
    # hybrid_lstm: 2+2 layers x 256, vocab 8K; 160 x 25 = 4000 target tokens
    "small": Preset("hybrid_lstm", 8000, BatchSize(160, 25, 25), BatchSize(160, 25, 25)),
    # hybrid_lstm_wmt_en_de: 4+4 x 1000, dropout between layers / on H_c 0, vocab 32K.
    # A realistic GPU batch is 64-128 x ~25-30; on this CPU that is too slow to measure
    # per chunk count, so the batch is scaled down (stated in the report).
    "wmt": Preset(
        "hybrid_lstm_wmt_en_de", 32000, BatchSize(32, 27, 27), BatchSize(16, 25, 25),
        note="batch scaled down from 64-128 sentences for CPU measurement",
        gpu_batch=BatchSize(250, 32, 32),  # --max-tokens 8000
    ),
}


def layer_map(devices: int, layers: int, balance: Optional[str] = None) -> Tuple[int, ...]:
    """Layer -> device index, as fairseq_hybrid.parallel.placement plans it (``balance``:
    layers per device as the advisor writes them, e.g. ``2,1,1``)."""
    counts = None if balance is None else tuple(int(count) for count in balance.split(","))
    return build_plan((torch.device("cpu"),) * devices, counts, 1, layers, layers).layer_device
