"""Timing every (side, layer, chunk) cell of the wavefront, forward and backward, through
the pipeline's own ``forward_cells``/``backward_cells``: a worker stand-in runs the cells one
at a time (inline on the calling thread, or each on its own device's worker thread) and
records each one's seconds (a ``wavefront.CellTimes``). Used on the real model's devices by
``auto_chunks`` (``--pipeline-chunks auto``) and on one device by ``planning.measure``."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..parallel.interface import HybridModel
from ..parallel.pipeline import WavefrontPipeline
from ..parallel.placement import PlacementPlan
from ..parallel.schedule import DECODER, ENCODER, Key, ScheduleCell, chunk_bounds, clock_cycles, describe
from .wavefront import CellTimes


def device_clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` after the device has finished its queued work (CUDA kernels
    run asynchronously; CPU work is done when the call returns)."""
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


class TimingWorkers:
    """Stands in for ``worker.DeviceWorkers``: runs the tasks one at a time and records
    each one's wall time, in issue order. Without ``delegate`` each task runs inline on the
    calling thread (one device, timed with ``clock``); with the real ``DeviceWorkers`` as
    ``delegate`` each runs alone on its device's worker (that worker's torch threads and
    current CUDA device), timed there with its device's clock."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 delegate: Optional[Any] = None) -> None:
        self.records: List[Tuple[str, float]] = []
        self.clock = clock
        self.delegate = delegate

    def run_all(self, tasks: Sequence[Tuple[int, str, Callable[[], Any]]],
                inline_device: Optional[torch.device] = None,
                while_waiting: Optional[Callable[[], Any]] = None) -> List[Any]:
        """The tasks one after another, each timed alone; ``while_waiting`` (a mask draw)
        after them, outside every cell's time."""
        results = []
        for index, description, fn in tasks:
            clock = self.clock if self.delegate is None else device_clock(self.delegate.devices[index])

            def timed(fn: Callable[[], Any] = fn, clock: Callable[[], float] = clock) -> Tuple[Any, float]:
                start = clock()
                result = fn()
                return result, clock() - start

            if self.delegate is None:
                result, seconds = timed()
            else:
                result, seconds = self.delegate.run_all([(index, description, timed)])[0]
            results.append(result)
            self.records.append((description, seconds))
        if while_waiting is not None:
            while_waiting()
        return results


def _check_issue_order(records: Sequence[Tuple[str, float]], expected: Sequence[str]) -> None:
    """The pipeline issued one task per cell, in clock-cycle order (else the timings
    would be attributed to the wrong cells)."""
    issued = [description for description, _ in records]
    if issued != list(expected):
        raise RuntimeError(
            "pipeline_model: the pipeline's tasks no longer match clock_cycles order "
            f"(first issued: {issued[:3]}, expected: {list(expected)[:3]})"
        )


def time_cells(
    model: HybridModel, plan: PlacementPlan, workers: TimingWorkers, source: torch.Tensor, lengths: torch.Tensor,
    target: Optional[torch.Tensor], masks: Dict[str, List[Optional[torch.Tensor]]],
) -> CellTimes:
    """Time one forward and one backward of every cell of ``model``'s pipeline over
    ``plan`` (its devices and ``plan.chunks``), with ``workers`` running the cells.
    ``source``/``target``: embedded inputs (time x batch x dim; ``target`` None = the
    encoder only); ``masks``: per side, each layer's dropout mask. The parameters'
    ``.grad`` are filled: callers that train afterwards save and restore them."""
    layers = model.encoder.num_layers
    pipeline = WavefrontPipeline.for_model(model, plan, workers)
    source = source.detach().requires_grad_(True)
    if target is not None:
        target = target.detach().requires_grad_(True)
    spans = {ENCODER: chunk_bounds(source.size(0), plan.chunks),
             DECODER: [] if target is None else chunk_bounds(target.size(0), plan.chunks)}
    masks = {ENCODER: masks[ENCODER], DECODER: masks.get(DECODER) or [None] * layers}
    workers.records.clear()
    with torch.enable_grad():
        outputs, states, records = pipeline.forward_cells(source, lengths.cpu(), target, spans, masks)
    cycles = clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), layers)
    order: List[Key] = [(c.side, c.layer, c.chunk) for cycle in cycles for c in cycle]
    _check_issue_order(workers.records, [describe(c) for cycle in cycles for c in cycle])
    forward = {key: seconds for key, (_, seconds) in zip(order, workers.records)}
    output_bytes = {key: out.numel() * out.element_size() for key, out in outputs.items()}
    some_state = next(iter(states.values()))
    state_bytes = sum(t.numel() * t.element_size() for t in some_state)
    workers.records.clear()
    top = layers - 1
    top_grads: Dict[str, Optional[torch.Tensor]] = {}
    for side, inputs in ((ENCODER, source), (DECODER, target)):
        if inputs is not None:
            out = outputs[(side, top, 0)]
            top_grads[side] = torch.randn(inputs.size(0), inputs.size(1), out.size(-1),
                                          device=out.device, dtype=out.dtype)
    pipeline.backward_cells(records, spans, top_grads, [(None, None)] * layers)
    reverse_order = [(c.side, c.layer, c.chunk) for cycle in reversed(cycles) for c in cycle]
    # a bridge's backward (sizes differ) runs on device 0 right after its decoder layer's
    # chunk 0: counted as part of that cell
    cell_records: List[Tuple[str, float]] = []
    bridge = "backward of the bridge into decoder layer "
    for description, seconds in workers.records:
        if description.startswith(bridge):
            cell = "backward of " + describe(ScheduleCell(DECODER, int(description[len(bridge):]), 0))
            index = [name for name, _ in cell_records].index(cell)
            cell_records[index] = (cell, cell_records[index][1] + seconds)
        else:
            cell_records.append((description, seconds))
    _check_issue_order(cell_records,
                       ["backward of " + describe(c) for cycle in reversed(cycles) for c in cycle])
    backward = {key: seconds for key, (_, seconds) in zip(reverse_order, cell_records)}
    return CellTimes(plan.chunks, len(spans[ENCODER]), len(spans[DECODER]), layers, forward,
                     backward, output_bytes, state_bytes)
