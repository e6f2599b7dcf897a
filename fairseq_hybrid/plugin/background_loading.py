"""fairseq's background batch loading stopped before the interpreter exits (installed by
``fairseq_patches.apply`` for every model loaded with the plugin).

fairseq's ``BufferedIterator`` (every training and validation epoch with
``--data-buffer-size`` > 0, the default) builds batches in a daemon thread,
``iterators.BackgroundConsumer``. A training that stops before its epoch ends (``--max-update``,
``--patience``, a stop on a bad loss) leaves that thread building the next batches — torch
code in C++ — when Python exits, and a daemon thread caught in C++ by the interpreter's
shutdown aborts the process: "terminate called without an active exception", exit status
134, after a training that finished and saved (a recipe with ``set -e`` then fails).

The patch lets each consumer stop between batches once the interpreter exits: an ``atexit``
handler says so and waits for the consumers still running (at most ``JOIN_SECONDS`` each,
the time one batch takes to build). Until then nothing changes: the consumer runs
fairseq's own ``run`` with the same source and queue, only looked at between batches
(each ``put``).
"""
from __future__ import annotations

import atexit
import functools
import queue
import threading
from typing import Any

from fairseq.data import iterators

JOIN_SECONDS = 30.0
_EXITING = threading.Event()


class _Exiting(BaseException):
    """Raised in a consumer once the interpreter exits (not an ``Exception``, so fairseq's
    ``run`` does not hand it to the training as a loading error)."""


class _PutUntilExit:
    """The consumer's queue, whose ``put`` gives up when the interpreter exits instead of
    waiting for room that no training will make."""

    def __init__(self, wrapped: queue.Queue) -> None:
        self._wrapped = wrapped

    def put(self, item: Any) -> None:
        while True:
            if _EXITING.is_set():
                raise _Exiting
            try:
                self._wrapped.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


def stop_consumers() -> None:
    """Tell every running consumer the interpreter exits and wait for it (``atexit``)."""
    _EXITING.set()
    for thread in threading.enumerate():
        if isinstance(thread, iterators.BackgroundConsumer) and thread is not threading.current_thread():
            thread.join(JOIN_SECONDS)


def stop_at_exit() -> None:
    """Install the patch (idempotent)."""
    original = iterators.BackgroundConsumer.run
    if getattr(original, "_hybrid_stoppable", False):
        return

    @functools.wraps(original)
    def run(self: iterators.BackgroundConsumer) -> None:
        # fairseq's own run on a queue that stops it at exit: it puts each batch as soon as
        # it is built, so the next put is the point between batches
        self._queue = _PutUntilExit(self._queue)
        try:
            original(self)
        except _Exiting:
            pass

    run._hybrid_stoppable = True
    iterators.BackgroundConsumer.run = run
    atexit.register(stop_consumers)
