"""The wavefront's schedule, pure (no torch, no devices): the cells, the clock cycles they
are issued in, what each cell depends on, and the time chunks.

The batch is split along time into chunks (encoder and decoder separately). Cell
(layer l, chunk k) of a side starts from the state that cell (l, k-1) left, on the output
of cell (l-1, k). Work is issued in clock cycles — encoder cell (l, k) in cycle l + k,
decoder cell (l, k) in cycle K_src + l + k — so layer l computes chunk k while layer l+1
computes chunk k-1; decoder layer l starts from encoder layer l's final state. Backward
runs the same cycles in reverse order, gradients flowing back along the same edges.

Two layers, three source chunks E0-E2 and three target chunks D0-D2:

    cycle      0    1    2    3    4    5    6
    layer 0   E0   E1   E2   D0   D1   D2
    layer 1        E0   E1   E2   D0   D1   D2

The engine (``pipeline.py``) runs this schedule; the chunk chooser's simulator and the
planning models read the same functions, so a change of rule reaches all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .split import Span, even_sizes, spans

ENCODER, DECODER = "encoder", "decoder"
Key = Tuple[str, int, int]  # (side, layer, chunk): a schedule cell
DIRECTIONS = ("forward", "backward")


def chunk_bounds(length: int, chunks: int) -> List[Span]:
    """At most ``chunks`` contiguous, non-empty, near-equal time spans covering
    [0, length)."""
    return spans(even_sizes(length, min(chunks, length))) if length else []


@dataclass(frozen=True)
class ScheduleCell:
    """One unit of the wavefront's schedule: layer ``layer`` of the encoder or decoder
    (``side``) over time chunk ``chunk``."""

    side: str
    layer: int
    chunk: int

    @property
    def key(self) -> Key:
        return (self.side, self.layer, self.chunk)


def describe(cell: ScheduleCell) -> str:
    """The cell's task name on its worker (``"backward of "`` + this for its backward)."""
    return f"{cell.side} layer {cell.layer} chunk {cell.chunk}"


def input_cell(cell: ScheduleCell) -> Optional[Key]:
    """The cell whose output this cell reads: the layer below on the same chunk (none for
    layer 0, which reads the embeddings)."""
    return None if cell.layer == 0 else (cell.side, cell.layer - 1, cell.chunk)


def state_cell(cell: ScheduleCell, source_chunks: int) -> Optional[Key]:
    """The cell whose final state this cell continues from: its layer's previous chunk;
    for decoder chunk 0, the encoder layer's last chunk (through the bridge); for encoder
    chunk 0, none (zeros). With ``input_cell``, the wavefront's whole dependency rule:
    forward, backward and the performance models all use these two."""
    if cell.chunk > 0:
        return (cell.side, cell.layer, cell.chunk - 1)
    if cell.side == ENCODER:
        return None
    return (ENCODER, cell.layer, source_chunks - 1)


def clock_cycles(source_chunks: int, target_chunks: int, layers: int) -> List[List[ScheduleCell]]:
    """The cells of each clock cycle, in order (backward: the same cycles reversed)."""
    cycles: Dict[int, List[ScheduleCell]] = {}
    for layer in range(layers):
        for chunk in range(source_chunks):
            cycles.setdefault(layer + chunk, []).append(ScheduleCell(ENCODER, layer, chunk))
        for chunk in range(target_chunks):
            cycles.setdefault(source_chunks + layer + chunk, []).append(
                ScheduleCell(DECODER, layer, chunk)
            )
    return [cycles[c] for c in sorted(cycles)]


def dependencies(
    key: Key, source_chunks: int, direction: str, layers: int, target_chunks: int,
) -> List[Tuple[Key, str]]:
    """The cells whose results cell ``key`` needs in ``direction``: (cell, kind) with kind
    "output" (from layer l-1 forward, l+1 backward) or "state" (the same layer). Forward is
    ``input_cell`` and ``state_cell``; backward inverts them."""
    def needs(cell: ScheduleCell) -> List[Tuple[Optional[Key], str]]:
        return [(input_cell(cell), "output"), (state_cell(cell, source_chunks), "state")]

    if direction == "forward":
        return [(dep, kind) for dep, kind in needs(ScheduleCell(*key)) if dep is not None]
    if direction != "backward":
        raise ValueError(f"direction {direction!r}: one of {DIRECTIONS}")
    return [
        (other.key, kind)
        for cycle in clock_cycles(source_chunks, target_chunks, layers) for other in cycle
        for dep, kind in needs(other) if dep == key
    ]
