"""What one device's measurement yields and the step model reads: every stage of the step
(``StageTimes``, the pipeline's cells as ``chunking.cell_timing.CellTimes`` for each
chunk count), and the host's time to issue each task (``HostTimes``: a profile's, or
none where the times were measured)."""
from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Dict, Optional, Sequence, Tuple

from ..chunking.cell_timing import CellTimes
from .sizes import BatchSize, ModelSize


@dataclass(frozen=True)
class HostTimes:
    """Seconds of the one Python process's own time to issue each task of a step (the
    interpreter lock serialises them across the device workers): a pipeline cell's
    forward and backward task, a head shard's, one ``run_all`` round trip (a clock cycle's
    barrier), one collective (broadcast, reduction, all-reduce, scatter, gather)."""
    cell_forward: float
    cell_backward: float
    shard_forward: float
    shard_backward: float
    round_trip: float
    collective: float

    def scaled(self, factor: float) -> "HostTimes":
        return HostTimes(*(factor * value for value in astuple(self)))


@dataclass
class StageTimes:
    """Everything the simulator needs, measured on one device."""
    model: ModelSize
    batch: BatchSize
    threads: int
    repeats: int
    cells: Dict[int, CellTimes]  # K -> cell times
    embed_forward: float
    embed_backward: float
    head_forward: Dict[int, float]  # shard sentences -> seconds
    head_backward: Dict[int, float]
    head_param_bytes: int
    head_input_bytes_per_sentence: int  # H and S rows one shard receives (and returns grads of)
    rest: float  # gradient clipping + optimizer step
    cycle_overhead: Dict[int, float]  # workers -> seconds per run_all round trip
    device: str = "cpu"
    # parameter bytes of what is not an LSTM layer (embeddings, bridges, head: the head
    # with the top layers, the rest on device 0) and of encoder + decoder layer l: how the
    # optimizer step's work splits over devices
    param_bytes_master: int = 0
    param_bytes_layer: Tuple[int, ...] = ()
    peak_bytes: int = 0  # the device's peak memory during the measurement (CUDA; 0 elsewhere)
    activation_bytes: int = 4  # element size of activations and gradients (float32 here)
    host: Optional[HostTimes] = None  # the host's issue times (None: no host bound charged)

    def rest_share(self, layer_device: Sequence[int]) -> float:
        """The largest fraction of the parameters any one device holds (1 without counts):
        embeddings and bridges on device 0, the master head with the top layers."""
        total = self.param_bytes_master + sum(self.param_bytes_layer)
        if not self.param_bytes_layer or total == 0:
            return 1.0
        per_device = self.layer_bytes_per_device(layer_device)
        per_device[0] += self.param_bytes_master - self.head_param_bytes
        per_device[layer_device[-1]] += self.head_param_bytes
        return max(per_device.values()) / total

    def layer_bytes_per_device(self, layer_device: Sequence[int]) -> Dict[int, float]:
        """Parameter bytes of the LSTM layers on each device (every device of the map, and
        device 0)."""
        per_device: Dict[int, float] = {d: 0.0 for d in {0, *layer_device}}
        for layer, device in enumerate(layer_device):
            per_device[device] += self.param_bytes_layer[layer]
        return per_device

    def head_times(self, sentences: int) -> Tuple[float, float]:
        """Forward and backward seconds of one head shard of ``sentences`` sentences: as
        measured, else interpolated linearly between the nearest measured sizes, else scaled
        in proportion from the nearest one (outside the measured range)."""
        if sentences <= 0:
            return 0.0, 0.0
        if sentences in self.head_forward:
            return self.head_forward[sentences], self.head_backward[sentences]
        # linear interpolation between the nearest measured shard sizes
        sizes = sorted(self.head_forward)
        lower = max([s for s in sizes if s <= sentences], default=sizes[0])
        upper = min([s for s in sizes if s >= sentences], default=sizes[-1])
        if lower == upper:
            scale = sentences / lower
            return self.head_forward[lower] * scale, self.head_backward[lower] * scale
        w = (sentences - lower) / (upper - lower)
        return tuple(  # type: ignore[return-value]
            (1 - w) * table[lower] + w * table[upper]
            for table in (self.head_forward, self.head_backward)
        )
