"""Choosing ``--pipeline-chunks`` by the performance model (pure functions, no timing).

A cell's time is fitted as ``overhead + per_step * steps``: a fixed cost per (layer,
chunk) call (launch, Python, the copies of its state) and a cost per time step of the
chunk (``steps`` time steps of every sentence of the batch). More chunks shorten the
pipeline's fill and drain but pay the overhead once per chunk; the simulator of the
schedule the code issues (``wavefront.simulate_pipeline``) weighs the two for each
candidate K, and ``choose_chunks`` takes the fastest.

Only the pipeline (the LSTM layers' forward and backward) depends on K: embeddings, the
head and the optimizer step do not, so candidates are compared by the pipeline's seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ..parallel.schedule import Key, chunk_bounds
from .wavefront import CellTimes, Link, pipeline_makespans

CostKey = Tuple[str, int, str]  # (side, layer, "forward" | "backward")
CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)
# near-ties go to fewer chunks: a prediction this close to the best is within the noise
TIE_TOLERANCE = 0.02


@dataclass(frozen=True)
class LinearCost:
    """Seconds of one cell: ``overhead_s + per_step_s * steps``."""

    overhead_s: float
    per_step_s: float

    def __call__(self, steps: int) -> float:
        return self.overhead_s + self.per_step_s * steps


@dataclass
class ChunkChoice:
    """What ``choose_chunks`` decided and why: the chosen K, every candidate's predicted
    pipeline seconds per step (forward + backward of the LSTM layers), the fitted costs,
    and (filled by whoever measured) how long the measurement took."""

    chunks: int
    predicted_s: Dict[int, float]
    costs: Dict[CostKey, LinearCost] = field(default_factory=dict)
    schedule: str = "cycle"
    measured_s: float = 0.0
    probes: Tuple[int, ...] = ()
    sentences: int = 0  # of the measured batch (a time step of a chunk is this many tokens)

    def fitted(self, direction: str) -> Tuple[float, float]:
        """Mean per-chunk overhead (s) and per-token cost (s) of the cells, one direction."""
        costs = [c for (_, _, d), c in self.costs.items() if d == direction]
        if not costs:
            return 0.0, 0.0
        overhead = sum(c.overhead_s for c in costs) / len(costs)
        per_step = sum(c.per_step_s for c in costs) / len(costs)
        return overhead, per_step / max(self.sentences, 1)

    def lines(self) -> List[str]:
        best = self.predicted_s[self.chunks]
        lines = [f"pipeline chunks: {self.chunks}, chosen by the performance model from "
                 f"{self.measured_s:.2f} s of measurement (K = {', '.join(map(str, self.probes))}; "
                 f"{self.schedule} schedule)",
                 ]
        if self.costs:
            (fo, ft), (bo, bt) = self.fitted("forward"), self.fitted("backward")
            lines.append(f"fitted per cell (mean): forward {fo * 1e3:.3f} ms per chunk + {ft * 1e6:.3f} us per "
                         f"token, backward {bo * 1e3:.3f} ms per chunk + {bt * 1e6:.3f} us per token")
        lines.append("    K  predicted pipeline s/step (LSTM fwd+bwd; the rest does not depend on K)")
        for k, seconds in sorted(self.predicted_s.items()):
            mark = "  <- chosen" if k == self.chunks else f"  {seconds / best - 1:+.1%}"
            lines.append(f"  {k:>3}  {seconds:.4f}{mark}")
        return lines


def chunk_lengths(length: int, chunks: int) -> List[int]:
    """Time steps of each chunk, as ``parallel.schedule.chunk_bounds`` splits them."""
    return [end - start for start, end in chunk_bounds(length, chunks)]


def fit_linear(points: Sequence[Tuple[float, float]]) -> LinearCost:
    """Least squares ``seconds = overhead + per_step * steps`` over (steps, seconds)
    points; neither coefficient below zero (a negative fit is noise)."""
    if not points:
        return LinearCost(0.0, 0.0)
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:  # one chunk length only: all of it per step
        return LinearCost(0.0, mean_y / mean_x if mean_x else 0.0)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    slope = max(slope, 0.0)
    intercept = mean_y - slope * mean_x
    if intercept < 0:  # refit through the origin
        slope = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
        intercept = 0.0
    return LinearCost(intercept, slope)


def fit_cell_costs(
    cells: Mapping[int, CellTimes], source_len: int, target_len: int,
) -> Dict[CostKey, LinearCost]:
    """One ``LinearCost`` per (side, layer, direction) from cells measured at several K."""
    lengths = {"encoder": source_len, "decoder": target_len}
    points: Dict[CostKey, List[Tuple[float, float]]] = {}
    for chunks, times in cells.items():
        for direction, table in (("forward", times.forward), ("backward", times.backward)):
            for (side, layer, chunk), seconds in table.items():
                steps = chunk_lengths(lengths[side], chunks)[chunk]
                points.setdefault((side, layer, direction), []).append((steps, seconds))
    return {key: fit_linear(values) for key, values in points.items()}


def cell_times_for(
    costs: Mapping[CostKey, LinearCost], chunks: int, source_len: int, target_len: int,
    layers: int, output_bytes: Optional[Mapping[Key, int]] = None, state_bytes: int = 0,
) -> CellTimes:
    """The cell times the fitted costs predict for ``chunks`` chunks (target_len 0: the
    encoder only, as with input feeding)."""
    forward: Dict[Key, float] = {}
    backward: Dict[Key, float] = {}
    sides = {"encoder": chunk_lengths(source_len, chunks), "decoder": chunk_lengths(target_len, chunks)}
    for side, steps in sides.items():
        for layer in range(layers):
            for chunk, length in enumerate(steps):
                forward[(side, layer, chunk)] = costs[(side, layer, "forward")](length)
                backward[(side, layer, chunk)] = costs[(side, layer, "backward")](length)
    return CellTimes(chunks, len(sides["encoder"]), len(sides["decoder"]), layers, forward,
                     backward, dict(output_bytes or {}), state_bytes)


def pipeline_seconds(
    cells: CellTimes, layer_device: Sequence[int], schedule: str = "cycle",
    cycle_overhead: float = 0.0, link: Link = Link(),
    slowdown: Optional[Mapping[int, float]] = None,
) -> float:
    """Predicted forward + backward seconds of the pipeline (as ``planning.step_time.predict_step``
    runs it: on one CPU device K = 1 is the plain model, one autograd thread backward)."""
    return sum(pipeline_makespans(cells, layer_device, schedule, cycle_overhead, link, slowdown))


T = TypeVar("T")


def simplest_within(options: Sequence[T], seconds: Callable[[T], float],
                    tolerance: float = TIE_TOLERANCE) -> T:
    """The first of ``options`` (ordered simplest first: fewer chunks, the even balance)
    whose predicted seconds are within ``tolerance`` of the fastest: predictions this close
    count as equal, and the simpler setting wins. The one tie rule of the model's choices."""
    best = min(seconds(option) for option in options)
    return next(option for option in options if seconds(option) <= best * (1 + tolerance))


def candidate_chunks(source_len: int, target_len: int,
                     candidates: Sequence[int] = CANDIDATES) -> List[int]:
    """The candidates a batch of these lengths can use (no more chunks than time steps)."""
    longest = max(source_len, target_len, 1)
    return [k for k in candidates if k <= longest] or [1]


def choose_chunks(
    costs: Mapping[CostKey, LinearCost], source_len: int, target_len: int,
    layer_device: Sequence[int], schedule: str = "cycle", cycle_overhead: float = 0.0,
    candidates: Optional[Sequence[int]] = None, link: Link = Link(),
    slowdown: Optional[Mapping[int, float]] = None, tolerance: float = TIE_TOLERANCE,
) -> ChunkChoice:
    """The fastest K by the model (the fewest chunks among those within ``tolerance`` of
    the fastest), with every candidate's predicted pipeline seconds."""
    layers = len(layer_device)
    predicted = {}
    for k in candidates or candidate_chunks(source_len, target_len):
        cells = cell_times_for(costs, k, source_len, target_len, layers)
        predicted[k] = pipeline_seconds(cells, layer_device, schedule, cycle_overhead, link, slowdown)
    chosen = simplest_within(sorted(predicted), predicted.__getitem__, tolerance)
    return ChunkChoice(chosen, predicted, dict(costs), schedule)
