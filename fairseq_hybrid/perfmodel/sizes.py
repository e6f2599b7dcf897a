"""The sizes the performance model works with: model and batch shapes, the link between
devices, the benchmark presets, and the model and synthetic batch built from them."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

import torch

Key = Tuple[str, int, int]  # (side, layer, chunk), as parallel/pipeline.py keys its cells


@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    embed: int
    vocab: int
    dropout: float = 0.1  # --dropout (embeddings in; between layers and H_c unless overridden)
    dropout_out: Optional[float] = None  # between layers and on H_c (None: --dropout)
    decoder_hidden: Optional[int] = None  # None: ``hidden`` (another size adds the bridge)


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
class Link:
    """A device-to-device transfer: ``latency_s + bytes / bandwidth`` (bandwidth 0 = free,
    as for CPU devices sharing memory)."""
    bandwidth_bytes_per_s: float = 0.0
    latency_s: float = 0.0

    def cost(self, nbytes: float, count: int = 1) -> float:
        if self.bandwidth_bytes_per_s <= 0:
            return 0.0
        return count * self.latency_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Preset:
    model: ModelSize
    batch: BatchSize
    quick_batch: BatchSize
    note: str = ""


PRESETS: Dict[str, Preset] = {
    # hybrid_lstm defaults: 2+2 layers x 256, vocab 8K; 160 x 25 = 4000 target tokens
    "small": Preset(ModelSize(2, 256, 256, 8000), BatchSize(160, 25, 25), BatchSize(160, 25, 25)),
    # hybrid_lstm_wmt_en_de: 4+4 x 1000, dropout between layers / on H_c 0, vocab 32K.
    # A realistic GPU batch is 64-128 x ~25-30; on this CPU that is too slow to measure
    # per chunk count, so the batch is scaled down (stated in the report).
    "wmt": Preset(
        ModelSize(4, 1000, 1000, 32000, dropout=0.1, dropout_out=0.0),
        BatchSize(32, 27, 27), BatchSize(16, 25, 25),
        note="batch scaled down from 64-128 sentences for CPU measurement",
    ),
}


def build_model(size: ModelSize, seed: int = 0) -> Tuple[Any, Any]:
    """A ``HybridLSTMModel`` (float32, train mode) and its fairseq-like task."""
    from fairseq.data import Dictionary

    import fairseq_hybrid  # noqa: F401  (registers model and criterion)
    from fairseq_hybrid.plugin.config import HybridLSTMConfig
    from fairseq_hybrid.plugin.hybrid_lstm import HybridLSTMModel

    dictionary = Dictionary()
    for index in range(size.vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{index}")
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    options = dict(
        encoder_embed_dim=size.embed, encoder_hidden_size=size.hidden,
        encoder_layers=size.layers, decoder_embed_dim=size.embed,
        decoder_hidden_size=size.decoder_hidden or size.hidden, decoder_layers=size.layers,
        decoder_out_embed_dim=size.embed, dropout=size.dropout,
        max_source_positions=1024, max_target_positions=1024,
    )
    if size.dropout_out is not None:
        options.update(encoder_dropout_out=size.dropout_out, decoder_dropout_out=size.dropout_out)
    torch.manual_seed(seed)
    model = HybridLSTMModel.build_model(HybridLSTMConfig(**options), task)
    return model.float().train(), task


def synthetic_sample(dictionary: Any, batch: BatchSize, seed: int = 1) -> dict:
    """A collated batch of random tokens, every sentence of the same lengths (no padding)."""
    generator = torch.Generator().manual_seed(seed)
    low, high, eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def tokens(length: int) -> torch.Tensor:
        body = torch.randint(low, high, (batch.sentences, length), generator=generator)
        body[:, -1] = eos
        return body

    source, target = tokens(batch.source_len), tokens(batch.target_len)
    prev = torch.cat([torch.full((batch.sentences, 1), eos), target[:, :-1]], dim=1)
    return {
        "id": torch.arange(batch.sentences),
        "nsentences": batch.sentences,
        "ntokens": batch.target_tokens,
        "net_input": {
            "src_tokens": source,
            "src_lengths": torch.full((batch.sentences,), batch.source_len),
            "prev_output_tokens": prev,
        },
        "target": target,
    }


def layer_map(devices: int, layers: int, balance: Optional[str] = None) -> Tuple[int, ...]:
    """Layer -> device index, as fairseq_hybrid.parallel.placement plans it."""
    from fairseq_hybrid.parallel.placement import build_plan

    return build_plan(",".join(["cpu"] * devices), balance, 1, layers, layers).layer_device
