"""The head's two collectives off the calling thread: ``CollectiveWorker`` runs each one
(the replicas' parameter broadcast at the step's start, the reduction of their gradients
after the head's backward) on a thread of its own while the device workers run the
pipeline's cells, and hands back a ``PendingCollective`` that the engine waits on only
where the result is used (``head_shards.py``: the broadcast before the first shard's
forward; the reduction once the pipeline's backward is done, before the backward call
returns and anything reads a gradient).

One code path for every device kind. On CPU devices the thread is the whole mechanism
(torch ops release the interpreter lock, so the collective's copies and sums run beside
the cells). On GPUs the thread issues each collective on a side stream of every device it
touches: the side streams first wait for an event recorded, when the collective was
issued, on the current stream of each device it reads from (its inputs are final there);
when it is done it records an event on each side stream, which the consumer's current
stream waits for (``PendingCollective.wait``: the host then only waits for the issue, the
device for the work), and its outputs, made on the side streams, are marked as used by the
consumer's streams for torch's caching allocator (``Tensor.record_stream``).

A failure inside a collective reaches the waiting caller as a ``WorkerError`` naming the
collective, its original exception chained; nothing is left waiting.

``FAIRSEQ_HYBRID_INLINE_COLLECTIVES=1`` (read when the worker is made) runs every collective
on the calling thread when it is issued, on the current streams, as the engine did before
it overlapped them: an internal switch for ``benchmarks.ab``, not a user option.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .worker import WorkerError

INLINE_VARIABLE = "FAIRSEQ_HYBRID_INLINE_COLLECTIVES"
Events = List[Tuple[torch.device, "torch.cuda.Event"]]


def inline_requested() -> bool:
    """Whether ``FAIRSEQ_HYBRID_INLINE_COLLECTIVES`` asks for the collectives inline."""
    return os.environ.get(INLINE_VARIABLE, "").strip() not in ("", "0")


def _recorded(stream: "torch.cuda.Stream") -> "torch.cuda.Event":
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _cuda_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The CUDA tensors inside a collective's result (tensors, lists, dicts of them)."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _cuda_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _cuda_tensors(item)


class PendingCollective:
    """A collective handed to the ``CollectiveWorker``; ``wait`` gives its result."""

    def __init__(self, description: str, future: Future) -> None:
        self.description = description
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self) -> Any:
        """The collective's result, once it is done (on GPUs: once it is issued, the
        caller's current streams ordered after it). Raises ``WorkerError`` if it failed."""
        try:
            result, done_events = self._future.result()
        except Exception as error:  # Ctrl-C while waiting (KeyboardInterrupt) goes on as it is
            raise WorkerError(f"{self.description} failed on the collective worker: "
                              f"{type(error).__name__}: {error}") from error
        for device, event in done_events:
            torch.cuda.current_stream(device).wait_event(event)
        for tensor in _cuda_tensors(result):
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
        return result


class CollectiveWorker:
    """One thread (started on first use) that runs the collectives of an engine's
    ``devices`` one after another, in the order they were issued."""

    def __init__(self, devices: Sequence[torch.device], cpu_threads: int = 1,
                 inline: Optional[bool] = None) -> None:
        """``cpu_threads``: the thread's torch threads (it adds, the cells compute);
        ``inline``: run each collective on the calling thread (default: the
        ``FAIRSEQ_HYBRID_INLINE_COLLECTIVES`` switch)."""
        self.devices = list(devices)
        self.cpu_threads = cpu_threads
        self.inline = inline_requested() if inline is None else inline
        self._executor: Optional[ThreadPoolExecutor] = None
        self._side_streams: Dict[torch.device, torch.cuda.Stream] = {}

    def submit(self, description: str, collective: Callable[[], Any],
               reads: Sequence[int], writes: Sequence[int]) -> PendingCollective:
        """Issue ``collective`` (a function of the tensors it was given), which reads the
        devices of indices ``reads`` and writes those of ``writes``; ``description``
        names it in a failure."""
        if self.inline:
            future: Future = Future()
            try:
                future.set_result((collective(), []))
            except BaseException as error:  # reported by wait, like the thread's
                future.set_exception(error)
            return PendingCollective(description, future)
        read_gpus = self._gpus(reads)
        ready = [(device, _recorded(torch.cuda.current_stream(device))) for device in read_gpus]
        touched = self._gpus([*reads, *writes])
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybrid-collectives",
                                                initializer=torch.set_num_threads,
                                                initargs=(self.cpu_threads,))
        return PendingCollective(description, self._executor.submit(
            self._on_side_streams, collective, ready, touched))

    def _gpus(self, indices: Sequence[int]) -> List[torch.device]:
        devices = {self.devices[i] for i in indices}
        return sorted((d for d in devices if d.type == "cuda"), key=lambda d: d.index or 0)

    def _on_side_streams(self, collective: Callable[[], Any], ready: Events,
                         touched: Sequence[torch.device]) -> Tuple[Any, Events]:
        """On the worker's thread: ``collective`` on a side stream of each GPU it touches,
        after the events its inputs were ready at; the events it is done at."""
        with ExitStack() as streams:
            for device in touched:
                stream = self._side_streams.get(device)
                if stream is None:
                    stream = self._side_streams[device] = torch.cuda.Stream(device)
                streams.enter_context(torch.cuda.stream(stream))
            for device, event in ready:
                torch.cuda.current_stream(device).wait_event(event)
            result = collective()
            return result, [(device, _recorded(torch.cuda.current_stream(device)))
                            for device in touched]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
