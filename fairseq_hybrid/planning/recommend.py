"""The advisor's recommendations from measured stage times (pure functions: no timing, so
tests drive them with hand-made stage times).

- ``with_fitted_cells``: a measurement at a few chunk counts, extended to every candidate K
  by the per-chunk overhead + per-token fit (``chunk_choice``).
- ``best_chunks`` / ``best_balance``: the K and the layers-per-device split the simulator
  predicts fastest for N devices.
- ``device_knee``: the device count beyond which one more device gains under 5%.
- ``batch_knee`` / ``memory_limit``: where throughput stops improving as ``--max-tokens``
  grows, and the largest ``--max-tokens`` whose measured peak memory fits a device.
- ``replica_knee``: for data parallelism over machines, the replica count at which the ring
  all-reduce of the gradients stops fitting in the backward pass's time.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from ..parallel.split import even_sizes
from ..chunking.chunk_choice import (
    CANDIDATES, candidate_chunks, cell_times_for, chunk_lengths, fit_cell_costs,
    simplest_within,
)
from ..chunking.wavefront import Link
from .step_time import predict_step
from .stage_times import StageTimes

GAIN_THRESHOLD = 0.05  # "stops improving": the next step up gains less than this
MEMORY_HEADROOM = 0.10  # of a GPU's memory left free by the --max-tokens recommendation


def with_fitted_cells(stage: StageTimes, candidates: Sequence[int] = CANDIDATES) -> StageTimes:
    """``stage`` with cell times for every candidate K (that the batch allows), predicted
    by the fit of each cell's per-chunk overhead and per-token cost to the measured Ks."""
    source_len, target_len = stage.batch.source_len, stage.batch.target_len
    costs = fit_cell_costs(stage.cells, source_len, target_len)
    measured = stage.cells[min(stage.cells)]  # K = 1: chunk 0 is the whole sequence
    lengths = {"encoder": source_len, "decoder": target_len}
    # the bytes a cell hands on grow with its time steps
    per_step = {(side, layer): measured.output_bytes.get((side, layer, 0), 0) / max(length, 1)
                for side, length in lengths.items() for layer in range(measured.layers)}
    cells = {}
    for k in candidate_chunks(source_len, target_len, sorted(set(candidates) | set(stage.cells))):
        predicted = cell_times_for(costs, k, source_len, target_len, measured.layers)
        predicted.output_bytes = {
            key: int(per_step[(key[0], key[1])] * _steps(lengths[key[0]], k, key[2]))
            for key in predicted.forward
        }
        predicted.state_bytes = measured.state_bytes
        cells[k] = predicted
    return replace(stage, cells=cells)


def _steps(length: int, chunks: int, chunk: int) -> int:
    return chunk_lengths(length, chunks)[chunk]


@dataclass(frozen=True)
class Prediction:
    """One configuration's predicted step: seconds by part (``predict_step``) and target
    tokens per second for a batch of ``tokens`` target tokens."""
    devices: int
    chunks: int
    balance: Optional[str]
    parts: Dict[str, float]
    tokens: int

    @property
    def step_s(self) -> float:
        return self.parts["total"]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def backward_s(self) -> float:
        return sum(v for k, v in self.parts.items() if k.endswith("_backward"))


def predict(stage: StageTimes, devices: int, chunks: int, schedule: str, link: Link = Link(),
            balance: Optional[str] = None, tokens: Optional[int] = None) -> Prediction:
    parts = predict_step(stage, devices, chunks, schedule, link, balance)
    return Prediction(devices, chunks, balance, parts,
                      tokens if tokens is not None else stage.batch.target_tokens)


def best_chunks(stage: StageTimes, devices: int, schedule: str, link: Link = Link(),
                balance: Optional[str] = None, tokens: Optional[int] = None) -> Prediction:
    """The fastest K among the stage's cell tables (the fewest within ``chunk_choice.TIE_TOLERANCE``);
    one device never chunks."""
    options = [1] if devices == 1 else sorted(stage.cells)
    predictions = [predict(stage, devices, k, schedule, link, balance, tokens) for k in options]
    return simplest_within(predictions, lambda p: p.step_s)


def balances(layers: int, devices: int) -> List[str]:
    """Every contiguous split of ``layers`` over ``devices`` (each at least one layer),
    the even one first."""
    even = even_sizes(layers, devices)
    splits = [list(c) for c in itertools.product(range(1, layers + 1), repeat=devices)
              if sum(c) == layers]
    splits.sort(key=lambda split: split != even)
    return [",".join(map(str, split)) for split in splits]


def best_balance(stage: StageTimes, devices: int, schedule: str, link: Link = Link(),
                 tokens: Optional[int] = None) -> Tuple[Prediction, bool]:
    """The fastest layers-per-device split (each with its best K), and whether it is the
    even default (kept unless another is faster by more than ``chunk_choice.TIE_TOLERANCE``)."""
    options = [best_chunks(stage, devices, schedule, link, split, tokens)
               for split in balances(stage.model.layers, devices)]
    chosen = simplest_within(options, lambda p: p.step_s)
    return chosen, chosen is options[0]


def device_knee(by_devices: Dict[int, Prediction], threshold: float = GAIN_THRESHOLD) -> int:
    """The smallest device count whose next count gains under ``threshold`` in tokens/s
    (the largest count when every step gains)."""
    counts = sorted(by_devices)
    for count, following in zip(counts, counts[1:]):
        if by_devices[following].tokens_per_s < by_devices[count].tokens_per_s * (1 + threshold):
            return count
    return counts[-1]


def batch_knee(tokens_per_s: Dict[int, float], threshold: float = GAIN_THRESHOLD) -> int:
    """The smallest ``--max-tokens`` within ``threshold`` of the best throughput measured
    (the mini-batch procedure: grow the batch until throughput stops improving)."""
    best = max(tokens_per_s.values())
    return min(m for m, tps in tokens_per_s.items() if tps >= best * (1 - threshold))


def memory_limit(peak_bytes: Dict[int, int], capacity_bytes: int,
                 headroom: float = MEMORY_HEADROOM) -> Optional[int]:
    """The largest ``--max-tokens`` whose peak memory, extrapolated by a least-squares
    line through the measured (max-tokens, peak bytes) points, stays under ``capacity``
    minus ``headroom``; None without two points or capacity."""
    points = [(m, b) for m, b in peak_bytes.items() if b > 0]
    if len(points) < 2 or capacity_bytes <= 0:
        return None
    n = len(points)
    mean_x = sum(m for m, _ in points) / n
    mean_y = sum(b for _, b in points) / n
    var = sum((m - mean_x) ** 2 for m, _ in points)
    slope = sum((m - mean_x) * (b - mean_y) for m, b in points) / var if var else 0.0
    intercept = mean_y - slope * mean_x
    budget = capacity_bytes * (1 - headroom)
    if slope <= 0:
        return None
    return max(0, int((budget - intercept) / slope))


def allreduce_s(grad_bytes: int, replicas: int, link_gbps: float, latency_s: float) -> float:
    """Seconds of a ring all-reduce of ``grad_bytes`` over ``replicas`` machines joined by a
    ``link_gbps`` gigabit/s link: 2 (R-1) steps, each sending 1/R of the bytes."""
    if replicas <= 1:
        return 0.0
    steps = 2 * (replicas - 1)
    return steps * (latency_s + grad_bytes / replicas / (link_gbps * 1e9 / 8))


@dataclass(frozen=True)
class ReplicaAdvice:
    replicas: int  # the most replicas whose all-reduce still fits in backward's time
    allreduce_s: float
    backward_s: float
    tokens_per_s: float  # replicas x batch tokens / (step + the all-reduce's exposed part)
    next_allreduce_s: float  # of one replica more
    overlapped: bool = False  # torch DDP (buckets during backward) rather than legacy_ddp


def replica_knee(step: Prediction, grad_bytes: int, link_gbps: float, latency_s: float,
                 limit: int = 1024, overlapped: bool = False) -> ReplicaAdvice:
    """The largest replica count R (at most ``limit``) whose all-reduce takes no longer than
    the step's backward (it could hide behind backward); 1 when even two replicas' does not.
    tokens/s are predicted as the backend the plugin picks runs it: ``overlapped`` (torch
    DDP, one device per process) adds only what of the all-reduce outlasts backward;
    otherwise (legacy_ddp, several devices per process) the all-reduce follows backward."""
    best = 1
    for replicas in range(2, limit + 1):
        if allreduce_s(grad_bytes, replicas, link_gbps, latency_s) > step.backward_s:
            break
        best = replicas
    cost = allreduce_s(grad_bytes, best, link_gbps, latency_s)
    exposed = max(0.0, cost - step.backward_s) if overlapped else cost
    return ReplicaAdvice(best, cost, step.backward_s, best * step.tokens / (step.step_s + exposed),
                         allreduce_s(grad_bytes, best + 1, link_gbps, latency_s), overlapped)
