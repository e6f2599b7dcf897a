"""One worker thread per device (as torchgpipe does).

A device's worker issues all of that device's work, so one device's Python and launch
overhead never serialises the others; on CPU "devices" the workers run on separate cores
for real (torch ops release the GIL). ``run_all`` runs a batch of tasks (one clock cycle,
or one head shard per device) and waits for all of them; a task's exception reaches the
caller with its original traceback chained, and nothing is left waiting.

The only device-specific code: a CUDA worker sets its thread's current device once, and
then issues everything on that device's current (default) stream. Work on another device
is ordered by torch itself: a cross-device ``Tensor.to`` waits for both devices' current
streams (a GPU -> CPU copy waits for the kernels that made its input), and ``run_all``
returns only after each task has issued its work. So no events are needed, and the same
code runs on CPU devices, GPUs, a mix, or one GPU listed twice (two workers, one stream).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch


class WorkerError(RuntimeError):
    """A task failed on a device worker; ``__cause__`` is the original exception."""


def cpu_threads_per_worker(num_cpu_workers: int) -> int:
    """Split the cores between the CPU workers (at least one thread each)."""
    return max(1, (os.cpu_count() or 1) // max(1, num_cpu_workers))


class DeviceWorkers:
    """A single-thread executor per entry of ``devices`` (``cpu,cpu`` gives two)."""

    def __init__(self, devices: Sequence[torch.device], cpu_threads: Optional[int] = None) -> None:
        """``cpu_threads``: torch threads of each CPU device's worker (default: the cores
        split between them)."""
        self.devices = list(devices)
        cpu_workers = sum(1 for d in self.devices if d.type == "cpu")
        self.cpu_threads = cpu_threads or cpu_threads_per_worker(cpu_workers)
        self._executors = [
            ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"hybrid-{index}-{device}",
                initializer=self._init_thread,
                initargs=(device,),
            )
            for index, device in enumerate(self.devices)
        ]

    def _init_thread(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        elif device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)

    def run_all(
        self, tasks: Sequence[Tuple[int, str, Callable[[], Any]]]
    ) -> List[Any]:
        """Run ``(worker_index, description, fn)`` tasks; return their results in order.

        Grad mode is carried over from the calling thread (it is thread-local in torch).
        """
        grad_enabled = torch.is_grad_enabled()

        def with_grad_mode(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                with torch.set_grad_enabled(grad_enabled):
                    return fn()
            return run

        futures: List[Future] = [
            self._executors[index].submit(with_grad_mode(fn)) for index, _, fn in tasks
        ]
        wait(futures)
        for future, (index, description, _) in zip(futures, tasks):
            error: Optional[BaseException] = future.exception()
            if error is not None:
                raise WorkerError(
                    f"{description} failed on worker {index} ({self.devices[index]}): "
                    f"{type(error).__name__}: {error}"
                ) from error
        return [future.result() for future in futures]

    def close(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True)
