"""The host's side of a hybrid step: the CPU time the one Python process spends issuing each
pipeline cell, head shard and worker round trip, measured with a model so small that the
work itself is negligible (``planning/host_bound.py`` charges it; the GPU profiles take
its value as an assumption).

    python -m benchmarks.host_time [--device cpu] [--devices 4] [--chunks 8] [--steps 20]

It runs real training steps (``hybrid_cross_entropy`` forward and backward through the
engine) of a 4+4 x 8 model on ``--devices`` copies of ``--device`` with ``--chunks`` time
chunks, and records, per task the engine hands to a device worker, that worker thread's
CPU time (``time.thread_time``: what the thread computed, not what it waited for, so a busy
machine inflates it little). On a GPU (``--device cuda``: the GPU listed N times) the same
numbers are the host's issue time of each task, without the kernels it queues. Thread CPU
time includes ATen's dispatch, which runs without the interpreter lock: the numbers are an
upper estimate of the lock-held (serialised) part.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_hybrid.parallel.worker import DeviceWorkers
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize

from fairseq_hybrid.jsonio import write_json_atomic
from .models import build_model, synthetic_sample

TINY_MODEL = ModelSize(4, 8, 8, 40, dropout=0.1, dropout_out=0.0)  # the WMT preset's shape of dropout
TINY_BATCH = BatchSize(4, 16, 16)
KINDS = ("cell_forward", "cell_backward", "shard_forward", "shard_backward")


def task_kind(description: str) -> str:
    """Which of ``KINDS`` (or "other") a worker task is, from the engine's description."""
    if description.startswith("backward of head shard"):
        return "shard_backward"
    if description.startswith("head shard"):
        return "shard_forward"
    if description.startswith("backward of the bridge"):
        return "other"
    if description.startswith("backward of "):
        return "cell_backward"
    if description.startswith(("encoder layer", "decoder layer")):
        return "cell_forward"
    return "other"


class RecordingWorkers:
    """Wraps a ``DeviceWorkers``' ``run_all`` to record each task's thread CPU seconds."""

    def __init__(self, workers: DeviceWorkers) -> None:
        self.workers = workers
        self.records: List[Tuple[str, float]] = []
        self.calls = 0
        self._run_all = workers.run_all
        workers.run_all = self.run_all  # type: ignore[method-assign]

    def run_all(self, tasks: Sequence[Tuple[int, str, Callable[[], Any]]], *args: Any,
                **kwargs: Any) -> List[Any]:
        self.calls += 1

        def timed(description: str, fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                start = time.thread_time()
                try:
                    return fn()
                finally:
                    self.records.append((description, time.thread_time() - start))
            return run

        return self._run_all([(i, d, timed(d, fn)) for i, d, fn in tasks], *args, **kwargs)


def round_trip_cpu_seconds(workers: DeviceWorkers, repeats: int = 200) -> float:
    """The process's CPU seconds of one ``run_all`` of no-op tasks on every worker (handing
    out, waking the workers, waiting): the host cost of one clock cycle's barrier."""
    tasks = [(index, "no-op", lambda: None) for index in range(len(workers.devices))]
    for _ in range(20):
        workers.run_all(tasks)
    start = time.process_time()
    for _ in range(repeats):
        workers.run_all(tasks)
    return (time.process_time() - start) / repeats


def measure_host_times(device: str = "cpu", devices: int = 4, chunks: int = 8, steps: int = 20,
                       progress: Callable[[str], None] = lambda message: None) -> Dict[str, Any]:
    """Median thread CPU seconds per task kind (``KINDS``), the round trip, and the
    process's CPU seconds per step and their part outside the workers' tasks."""
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion

    if devices < 2 or devices > TINY_MODEL.layers:
        raise ValueError(f"--devices {devices}: 2 to {TINY_MODEL.layers} (one per layer at most)")
    if chunks < 1:
        raise ValueError(f"--chunks {chunks}: at least 1")
    if steps < 1:
        raise ValueError(f"--steps {steps}: at least 1")
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    model, task = build_model(TINY_MODEL)
    dev = torch.device(device)
    model.runtime.cpu_threads = 1
    engine = model.runtime.build_engine(devices=(dev,) * devices, chunks=chunks)
    model.runtime.use_engine(engine)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1)
    sample = synthetic_sample(task.target_dictionary, TINY_BATCH)
    try:
        round_trip = round_trip_cpu_seconds(engine.workers)
        recorder = RecordingWorkers(engine.workers)
        per_step: List[float] = []
        by_kind: Dict[str, List[float]] = {kind: [] for kind in (*KINDS, "other")}
        calls = 0
        for step in range(steps + 1):  # the first: warm-up
            recorder.records.clear()
            recorder.calls = 0
            start = time.process_time()
            model.zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if step > 0:
                per_step.append(time.process_time() - start)
                calls = recorder.calls  # the same every step
                for description, seconds in recorder.records:
                    by_kind[task_kind(description)].append(seconds)
            progress(f"host time: step {step}/{steps}")
        counts = {kind: len(values) // steps for kind, values in by_kind.items()}
        medians = {kind: statistics.median(values) if values else 0.0
                   for kind, values in by_kind.items()}
        step_cpu = statistics.median(per_step)
        in_tasks = sum(medians[kind] * counts[kind] for kind in medians)
        return {
            "what": "thread CPU seconds of each task the engine hands a worker, a tiny model "
                    "(work negligible): the host's issue time per cell, shard, round trip",
            "device": f"{devices} x {dev}", "chunks": chunks, "steps": steps,
            "model": TINY_MODEL.__dict__, "batch": TINY_BATCH.__dict__,
            "seconds": {kind: medians[kind] for kind in KINDS},
            "tasks_per_step": {kind: counts[kind] for kind in KINDS},
            "round_trip_s": round_trip, "round_trips_per_step": calls,
            "step_cpu_s": step_cpu,
            "outside_tasks_s": step_cpu - in_tasks - calls * round_trip,
        }
    finally:
        model.runtime.close()
        torch.set_num_threads(saved)


def format_host_times(report: Dict[str, Any]) -> str:
    seconds, counts = report["seconds"], report["tasks_per_step"]
    lines = [f"host CPU time per task on {report['device']}, K={report['chunks']} "
             f"(median of {report['steps']} steps):"]
    for kind in KINDS:
        lines.append(f"  {kind:<16}{seconds[kind] * 1e6:>8.0f} us  x {counts[kind]} per step")
    lines.append(f"  {'round trip':<16}{report['round_trip_s'] * 1e6:>8.0f} us  x "
                 f"{report['round_trips_per_step']} per step")
    lines.append(f"  step {report['step_cpu_s'] * 1e3:.1f} ms of process CPU time, "
                 f"{report['outside_tasks_s'] * 1e3:.1f} ms of it outside the tasks and round trips")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]")
    parser.add_argument("--devices", type=int, default=4, help="copies of --device (2-4)")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args(argv)
    try:
        report = measure_host_times(args.device, args.devices, args.chunks, args.steps)
    except ValueError as error:
        sys.exit(f"host_time.py: error: {error}")
    print(format_host_times(report))
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
