"""Where a multi-device training step's time goes, measured: every task the engine hands
its device workers is timed, step by step, and the step is split into its phases.

    python -m benchmarks.step_trace --preset small --devices cpu,cpu --chunks 6 --steps 5

For each phase (the pipeline's forward, the head's forward, the head's backward, the
pipeline's backward) it reports the wall time the calling thread spent waiting for the
workers and each worker's busy time in it (wall - busy = that worker's idle time: the
wavefront's fill and drain, the per-cycle barrier); then the calling thread's time outside
every phase (the serial part: embeddings, dropout draws not overlapped, the gradient
reduction, autograd's own work) and the update (clip + Adam). Then the head's two
collectives on the engine's collective worker: how long each ran, how much of that while
pipeline cells ran on the device workers, and how long after it was issued the step waited
for it (the broadcast before the head's forward, the reduction once the pipeline's
backward is done). Medians over the timed steps, after ``--warm-up`` untimed ones; one
torch thread per CPU device, as the scaling benchmark's ``cpu,cpu`` configuration. This is
the measurement behind the CPU diagnosis in docs/performance.md; ``benchmarks.
pipeline_model --validate`` times whole steps only.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_hybrid.planning import BENCHMARK_PRESETS, BatchSize, ModelSize
from fairseq_hybrid.planning.measure import median

from .models import build_model, synthetic_sample

PHASES = ("pipeline forward", "head forward", "head backward", "pipeline backward")
COLLECTIVES = {"broadcast": "head broadcast", "reduction": "head reduction"}
# the pipeline phase each collective is issued to overlap
OVERLAPS = {"head broadcast": "pipeline forward", "head reduction": "pipeline backward"}


def phase_of(description: str) -> str:
    """The phase of a worker task, from the description the engine gives it."""
    backward = description.startswith("backward")
    if "head shard" in description:
        return "head backward" if backward else "head forward"
    return "pipeline backward" if backward else "pipeline forward"


def collective_of(description: str) -> str:
    """The collective's name in the trace, from the description the engine gives it."""
    return next((name for word, name in COLLECTIVES.items() if word in description), description)


@dataclass
class CollectiveRecord:
    """One collective on the collective worker: when it was issued, ran and was waited for
    (``perf_counter`` seconds; ``waited`` None if nothing waited for it)."""
    name: str
    issued: float
    started: float = float("nan")
    ended: float = float("nan")
    waited: Optional[float] = None


@dataclass
class StepRecord:
    """One step's calls to ``run_all`` (phase, start, end), tasks (worker, phase, start,
    end) and collectives."""
    calls: List[Tuple[str, float, float]] = field(default_factory=list)
    tasks: List[Tuple[int, str, float, float]] = field(default_factory=list)
    collectives: List[CollectiveRecord] = field(default_factory=list)

    def cells(self, phase: str) -> List[Tuple[float, float]]:
        """(start, end) of the step's tasks in ``phase``."""
        return [(start, end) for _, p, start, end in self.tasks if p == phase]


def traced(run_all: Callable[..., Any], record: Callable[[], StepRecord]) -> Callable[..., Any]:
    """``DeviceWorkers.run_all`` that times every task and the call itself."""
    def run(tasks, inline_device=None, while_waiting=None):
        step = record()

        def timed(worker: int, phase: str, fn: Callable[[], Any]) -> Callable[[], Any]:
            def go() -> Any:
                start = time.perf_counter()
                try:
                    return fn()
                finally:
                    step.tasks.append((worker, phase, start, time.perf_counter()))
            return go

        phase = phase_of(tasks[0][1]) if tasks else "other"
        start = time.perf_counter()
        result = run_all([(w, d, timed(w, phase_of(d), fn)) for w, d, fn in tasks],
                         inline_device, while_waiting)
        step.calls.append((phase, start, time.perf_counter()))
        return result
    return run


class _TimedPending:
    """A pending collective whose ``wait`` is timed."""

    def __init__(self, pending: Any, entry: CollectiveRecord) -> None:
        self._pending, self._entry = pending, entry

    def wait(self) -> Any:
        try:
            return self._pending.wait()
        finally:
            self._entry.waited = time.perf_counter()


def traced_submit(submit: Callable[..., Any], record: Callable[[], StepRecord]) -> Callable[..., Any]:
    """``CollectiveWorker.submit`` that records when each collective is issued, runs and
    is waited for."""
    def run(description: str, collective: Callable[[], Any], reads, writes) -> _TimedPending:
        entry = CollectiveRecord(collective_of(description), time.perf_counter())
        record().collectives.append(entry)

        def timed() -> Any:
            entry.started = time.perf_counter()
            try:
                return collective()
            finally:
                entry.ended = time.perf_counter()
        return _TimedPending(submit(description, timed, reads, writes), entry)
    return run


def overlapped_seconds(span: Tuple[float, float], intervals: Sequence[Tuple[float, float]]) -> float:
    """Seconds of ``span`` during which at least one of ``intervals`` ran."""
    start, end = span
    covered, reach = 0.0, start
    for first, last in sorted(intervals):
        first, last = max(first, reach), min(last, end)
        if last > first:
            covered += last - first
            reach = last
    return covered


def trace_steps(size: ModelSize, batch: BatchSize, devices: str, chunks: int, steps: int,
                warm_up: int = 2) -> Dict[str, Any]:
    """Train ``steps`` + ``warm_up`` steps of ``size`` on a synthetic ``batch`` over
    ``devices`` (one torch thread each) with ``chunks`` time chunks; the timed steps'
    medians as a dict (seconds)."""
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
    from fairseq_hybrid.plugin.placement_options import parse_devices

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, task = build_model(size)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1)
    sample = synthetic_sample(task.target_dictionary, batch)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-6, foreach=True)
    model.runtime.cpu_threads = 1
    engine = model.runtime.build_engine(devices=parse_devices(devices), chunks=chunks, balance=None)
    model.runtime.use_engine(engine)
    current = [StepRecord()]
    engine.workers.run_all = traced(engine.workers.run_all, lambda: current[0])
    engine.collectives.submit = traced_submit(engine.collectives.submit, lambda: current[0])
    rows: List[Dict[str, float]] = []
    try:
        for index in range(warm_up + steps):
            current[0] = StepRecord()
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            before_update = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            end = time.perf_counter()
            if index >= warm_up:
                rows.append(step_row(current[0], end - start, end - before_update,
                                     len(engine.plan.devices)))
    finally:
        model.runtime.close()
        torch.set_num_threads(saved_threads)
    return {"devices": devices, "chunks": chunks, "steps": steps,
            "median_s": {key: median([row[key] for row in rows]) for key in rows[0]}}


def step_row(step: StepRecord, seconds: float, update: float, workers: int) -> Dict[str, float]:
    """One step's phase walls, per-worker busy times, serial time and update."""
    row: Dict[str, float] = defaultdict(float)
    row["step"], row["update"] = seconds, update
    for phase, start, end in step.calls:
        row[f"{phase} wall"] += end - start
    for worker, phase, start, end in step.tasks:
        row[f"{phase} busy w{worker}"] += end - start
    waited = sum(end - start for _, start, end in step.calls)
    row["serial (outside the workers' phases, without the update)"] = seconds - waited - update
    for worker in range(workers):
        row[f"busy w{worker}"] = sum(end - start for w, _, start, end in step.tasks if w == worker)
    for entry in step.collectives:
        row[f"{entry.name} ran"] += entry.ended - entry.started
        row[f"{entry.name} ran while pipeline cells ran"] += overlapped_seconds(
            (entry.started, entry.ended),
            [(s, e) for _, phase, s, e in step.tasks if phase.startswith("pipeline")])
        if entry.waited is not None:
            row[f"{entry.name} issued to waited"] += entry.waited - entry.issued
    return dict(row)


def format_trace(trace: Dict[str, Any]) -> str:
    times = trace["median_s"]
    lines = [f"{trace['devices']}, {trace['chunks']} chunk(s): step {times['step'] * 1e3:.1f} ms "
             f"(median of {trace['steps']})"]
    workers = sorted(k for k in times if k.startswith("busy w"))
    for phase in PHASES:
        if f"{phase} wall" in times:
            busy = ", ".join(f"w{w[-1]} {times.get(f'{phase} busy {w[5:]}', 0.0) * 1e3:.1f}"
                             for w in workers)
            lines.append(f"  {phase:18s} wall {times[f'{phase} wall'] * 1e3:7.1f} ms   busy {busy}")
    serial = next(k for k in times if k.startswith("serial"))
    lines.append(f"  {serial}: {times[serial] * 1e3:.1f} ms; update (clip + Adam) "
                 f"{times['update'] * 1e3:.1f} ms")
    if any(f"{phase} wall" in times for phase in PHASES):
        lines.append("  busy per worker: " + ", ".join(f"{w[5:]} {times[w] * 1e3:.1f} ms" for w in workers))
    else:
        lines.append("  (one device, one chunk: the plain model on the calling thread, no workers)")
    for name in COLLECTIVES.values():
        if f"{name} ran" in times:
            inside = times[f"{name} ran while pipeline cells ran"]
            waited = times.get(f"{name} issued to waited", 0.0)
            lines.append(f"  {name:18s} ran {times[f'{name} ran'] * 1e3:.2f} ms on the collective "
                         f"worker, {inside * 1e3:.2f} ms of it while pipeline cells ran; waited for "
                         f"{waited * 1e3:.1f} ms after it was issued (across the {OVERLAPS[name]})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(BENCHMARK_PRESETS), default="small")
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=2)
    parser.add_argument("--json", help="also write the medians here")
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.steps < 1 or args.warm_up < 0:
        parser.error(f"--chunks {args.chunks} / --steps {args.steps} / --warm-up {args.warm_up}: "
                     "chunks and steps must be at least 1, warm-up at least 0")
    preset = BENCHMARK_PRESETS[args.preset]
    trace = trace_steps(preset.model, preset.batch, args.devices, args.chunks, args.steps, args.warm_up)
    print(format_trace(trace))
    if args.json:
        from fairseq_hybrid.jsonio import write_json_atomic
        write_json_atomic(trace, args.json)


if __name__ == "__main__":
    main()
