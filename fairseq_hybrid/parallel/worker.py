"""One worker thread per device (as torchgpipe does).

A device's worker issues all of that device's work, so one device's Python and launch
overhead never serialises the others; on CPU "devices" the workers run on separate cores
for real (torch ops release the GIL). ``run_all`` runs a batch of tasks (one clock cycle,
or one head shard per device) and waits for all of them; a task's exception reaches the
caller with its original traceback chained, a Ctrl-C on the calling thread goes on as
Ctrl-C, and nothing is left running either way.

The only device-specific code: a CUDA worker sets its thread's current device once, and
then issues everything on that device's current (default) stream; and a backward running
on a GPU's autograd thread runs that GPU's tasks itself (``autograd_device_thread``). Work on another device
is ordered by torch itself: a cross-device ``Tensor.to`` waits for both devices' current
streams (a GPU -> CPU copy waits for the kernels that made its input), and ``run_all``
returns only after each task has issued its work. So no events are needed, and the same
code runs on CPU devices, GPUs, a mix, or one GPU listed twice (two workers, one stream).
(The head's two collectives run on a thread of their own, on side streams ordered by
events: ``collective_worker.py``; ``close`` stops it with the workers, ``on_close``.)
"""
from __future__ import annotations

import os
from contextlib import ExitStack
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch


def autograd_device_thread(grads: Sequence[Optional[torch.Tensor]]) -> Optional[torch.device]:
    """Called in a custom autograd function's ``backward`` with its incoming gradients:
    the CUDA device whose autograd thread is running it, or None.

    torch's autograd runs a node on the thread of the device of its first CUDA incoming
    gradient (one thread per GPU, current device set to it), and CPU-only nodes on the
    thread that called ``.backward()``. A backward that hands per-cell ``backward`` calls
    to the workers must run that device's own calls itself: the device's autograd thread
    is busy waiting for the workers, so a worker's call for a graph on that device would
    never be served. Calls for other devices (their graphs confined to their device) are
    served by their own autograd threads, or run on the worker itself on a CPU device."""
    if any(g is not None and g.is_cuda for g in grads):
        return torch.device("cuda", torch.cuda.current_device())
    return None


class WorkerError(RuntimeError):
    """A task failed on a device worker; ``__cause__`` is the original exception."""


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
TORCH_THREADS_AT_IMPORT = torch.get_num_threads()


def user_thread_count() -> Optional[int]:
    """The torch thread count the user chose, if any: through ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` (torch starts with it), or ``torch.set_num_threads`` called after
    this module was imported (the calling thread's count then differs from torch's start)."""
    current = torch.get_num_threads()
    if any(os.environ.get(name) for name in THREAD_VARIABLES) or current != TORCH_THREADS_AT_IMPORT:
        return current
    return None


def cpu_threads_per_worker(num_cpu_workers: int) -> int:
    """Each CPU worker's torch threads: the user's count where they chose one (every
    worker then runs with it, as every thread of a torch program would), else the cores
    split between the CPU workers (at least one thread each)."""
    chosen = user_thread_count()
    if chosen is not None:
        return chosen
    return max(1, (os.cpu_count() or 1) // max(1, num_cpu_workers))


class DeviceWorkers:
    """A single-thread executor per entry of ``devices`` (``cpu,cpu`` gives two)."""

    def __init__(self, devices: Sequence[torch.device], cpu_threads: Optional[int] = None) -> None:
        """``cpu_threads``: torch threads of each CPU device's worker (default:
        ``cpu_threads_per_worker``)."""
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
        self.on_close: List[Callable[[], None]] = []  # what else stops with these threads

    def _init_thread(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        elif device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)

    def run_all(
        self, tasks: Sequence[Tuple[int, str, Callable[[], Any]]],
        inline_device: Optional[torch.device] = None,
        while_waiting: Optional[Callable[[], Any]] = None,
    ) -> List[Any]:
        """Run ``(worker_index, description, fn)`` tasks; return their results in order.
        ``while_waiting`` runs on the calling thread once the tasks are handed out (the
        pipeline draws its next dropout mask there instead of before the cycle).

        Grad mode and autocast (``--amp``) are carried over from the calling thread (both
        are thread-local in torch, as ``torch.nn.parallel.parallel_apply`` knows). Tasks of
        workers whose device is ``inline_device`` run on the calling thread instead (see
        ``autograd_device_thread``), after the others were handed out.
        """
        grad_enabled = torch.is_grad_enabled()
        autocast = [(kind, torch.get_autocast_dtype(kind)) for kind in ("cuda", "cpu")
                    if torch.is_autocast_enabled(kind)]

        def with_grad_mode(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                with torch.set_grad_enabled(grad_enabled), ExitStack() as modes:
                    for kind, dtype in autocast:
                        modes.enter_context(torch.autocast(kind, dtype=dtype))
                    return fn()
            return run

        futures: List[Future] = []
        submitted: List[Future] = []
        inline: List[Tuple[Future, Callable[[], Any]]] = []
        for index, _, fn in tasks:
            future: Future = Future()
            if inline_device is not None and self.devices[index] == inline_device:
                inline.append((future, fn))
            else:
                future = self._executors[index].submit(with_grad_mode(fn))
                submitted.append(future)
            futures.append(future)
        try:  # Ctrl-C (KeyboardInterrupt) or an exit here goes on as it is
            for future, fn in inline:
                try:
                    future.set_result(fn())
                except Exception as error:  # reported below, like a worker's
                    future.set_exception(error)
            if while_waiting is not None:
                while_waiting()
        finally:
            wait(submitted)  # nothing is left running, whatever happened here
        for future, (index, description, _) in zip(futures, tasks):
            error: Optional[BaseException] = future.exception()
            if error is not None:
                raise WorkerError(
                    f"{description} failed on worker {index} ({self.devices[index]}): "
                    f"{type(error).__name__}: {error}"
                ) from error
        return [future.result() for future in futures]

    def close(self) -> None:
        """Stop the threads (and what ``on_close`` lists: the engine's collective worker)."""
        for executor in self._executors:
            executor.shutdown(wait=True)
        for stop in self.on_close:
            stop()
