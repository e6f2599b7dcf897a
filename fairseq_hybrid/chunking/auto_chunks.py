"""``--pipeline-chunks auto``: before the first update, time the real model's cells on the
real devices at the first batch's shapes, fit each cell's per-chunk overhead and per-step
cost (``chunk_choice``), and take the K the wavefront simulator predicts fastest.

The measurement leaves training exactly as it was: the random number generators are
forked (the dropout masks it draws are not the run's), the parameters' gradients are
saved and restored, and nothing is updated. Chunks never change the numbers, only the
speed, so the choice is safe to make automatically; a resumed run decides again.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .cell_timing import TimingWorkers, time_cells
from .chunk_choice import ChunkChoice, candidate_chunks, choose_chunks, fit_cell_costs
from .wavefront import CellTimes
from ..parallel.interface import HybridModel
from ..parallel.pipeline import pipeline_inputs
from ..parallel.placement import PlacementPlan
from ..parallel.worker import DeviceWorkers

ROUNDS = 2  # timed rounds per probe K, after one warm-up round


def probe_chunks(source_len: int, target_len: int) -> Tuple[int, ...]:
    """The chunk counts timed: 1 (the longest cells) and the largest candidate the batch
    allows (the shortest): the two ends of the line each cell's cost is fitted to."""
    largest = candidate_chunks(source_len, target_len)[-1]
    return (1, largest) if largest > 1 else (1,)


def schedule_of(plan: PlacementPlan) -> str:
    """The simulator's schedule for these devices: dataflow on GPUs, a barrier per clock
    cycle on CPU devices."""
    return "cuda" if any(d.type == "cuda" for d in plan.devices) else "cycle"


def run_all_overhead(workers: DeviceWorkers, repeats: int = 50, warm_up: int = 5) -> float:
    """Median seconds of one ``run_all`` round trip of no-op tasks on every worker (the
    per-clock-cycle cost of the barrier), after ``warm_up`` untimed ones."""
    tasks = [(index, "no-op", lambda: None) for index in range(len(workers.devices))]
    for _ in range(warm_up):
        workers.run_all(tasks)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        workers.run_all(tasks)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_cell_times(
    model: HybridModel, plan: PlacementPlan, workers: DeviceWorkers, src_tokens: torch.Tensor,
    src_lengths: torch.Tensor, prev_output_tokens: torch.Tensor, probes: Sequence[int],
    rounds: int = ROUNDS,
) -> Dict[int, CellTimes]:
    """Per-cell forward and backward seconds (median of ``rounds``, after a warm-up) of the
    real model on ``plan``'s devices for each K in ``probes``, each cell alone on its
    device's worker. RNG states and gradients are left as they were."""
    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    cuda = sorted({d.index for d in plan.devices if d.type == "cuda"})
    timer = TimingWorkers(delegate=workers)
    samples: Dict[int, List[Any]] = {k: [] for k in probes}
    try:
        with torch.random.fork_rng(devices=cuda), torch.enable_grad():
            top = plan.device_of_layer(model.encoder.num_layers - 1)
            draws = model.draw_step(src_tokens, prev_output_tokens, top_device=top)
            source, target, masks = pipeline_inputs(draws)
            for round_index in range(rounds + 1):
                for chunks in probes:
                    for p in params:
                        p.grad = None
                    timing = time_cells(model, replace(plan, chunks=chunks), timer,
                                        source, src_lengths, target, masks)
                    if round_index > 0:
                        samples[chunks].append(timing)
    finally:
        for p, grad in zip(params, saved_grads):
            p.grad = grad
    layers = model.encoder.num_layers
    cells = {}
    for chunks, runs in samples.items():
        first = runs[0]
        cells[chunks] = CellTimes(
            chunks, first.source_chunks, first.target_chunks, layers,
            {key: statistics.median(r.forward[key] for r in runs) for key in first.forward},
            {key: statistics.median(r.backward[key] for r in runs) for key in first.backward},
            first.output_bytes, first.state_bytes,
        )
    return cells


def choose_for_batch(
    model: HybridModel, plan: PlacementPlan, workers: DeviceWorkers, src_tokens: torch.Tensor,
    src_lengths: torch.Tensor, prev_output_tokens: torch.Tensor,
) -> ChunkChoice:
    """Measure (``measure_cell_times``), fit and choose K for this batch's shapes."""
    started = time.perf_counter()
    source_len = src_tokens.size(1)
    target_len = 0 if model.decoder.input_feeding else prev_output_tokens.size(1)
    probes = probe_chunks(source_len, target_len)
    cells = measure_cell_times(model, plan, workers, src_tokens, src_lengths,
                               prev_output_tokens, probes)
    costs = fit_cell_costs(cells, source_len, target_len)
    overhead = run_all_overhead(workers)
    choice = choose_chunks(costs, source_len, target_len, plan.layer_device, schedule_of(plan),
                           overhead)
    choice.measured_s = time.perf_counter() - started
    choice.probes = probes
    choice.sentences = src_tokens.size(0)
    return choice
