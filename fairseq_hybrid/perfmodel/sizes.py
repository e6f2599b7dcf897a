"""The sizes the performance model works with: model and batch shapes, the link between
devices, and the benchmark presets (the model and synthetic batch built from them are the
benchmarks' own: ``benchmarks/models.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

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
    batch: BatchSize  # measured on this CPU
    quick_batch: BatchSize
    note: str = ""
    gpu_batch: Optional[BatchSize] = None  # what a GPU trains with (modelled by profiles)


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
        gpu_batch=BatchSize(250, 32, 32),  # --max-tokens 8000
    ),
}


def layer_map(devices: int, layers: int, balance: Optional[str] = None) -> Tuple[int, ...]:
    """Layer -> device index, as fairseq_hybrid.parallel.placement plans it (``balance``:
    layers per device as the advisor writes them, e.g. ``2,1,1``)."""
    counts = None if balance is None else tuple(int(count) for count in balance.split(","))
    return build_plan((torch.device("cpu"),) * devices, counts, 1, layers, layers).layer_device
