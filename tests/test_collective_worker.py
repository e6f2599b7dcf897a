"""Tests of fairseq_hybrid/parallel/collective_worker.py."""
import threading

import pytest
import torch

from fairseq_hybrid.parallel.collective_worker import INLINE_VARIABLE, CollectiveWorker, inline_requested
from fairseq_hybrid.parallel.worker import WorkerError

CPU = torch.device("cpu")


@pytest.mark.parametrize("value,inline", [(None, False), ("", False), ("0", False), (" 0 ", False),
                                          ("1", True), ("yes", True)])
def test_the_inline_switch_is_read_when_the_worker_is_made(monkeypatch, value, inline):
    if value is None:
        monkeypatch.delenv(INLINE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(INLINE_VARIABLE, value)
    assert inline_requested() is inline
    worker = CollectiveWorker([CPU])
    monkeypatch.setenv(INLINE_VARIABLE, "0" if inline else "1")  # read once, at construction
    assert worker.inline is inline
    assert CollectiveWorker([CPU], inline=not inline).inline is (not inline)


def test_inline_collectives_run_when_issued_on_the_calling_thread_and_fail_when_waited_on():
    worker = CollectiveWorker([CPU, CPU], inline=True)
    ran = []
    pending = worker.submit("the sum", lambda: ran.append(threading.current_thread()) or 3,
                            reads=[0], writes=[1])
    assert ran == [threading.current_thread()] and pending.done()
    assert pending.wait() == 3
    failed = worker.submit("the broken one", lambda: [][1], reads=[0], writes=[1])  # no raise yet
    with pytest.raises(WorkerError, match=r"^the broken one failed on the collective worker: IndexError"):
        failed.wait()
    interrupted = worker.submit("the interrupted one", ctrl_c, reads=[0], writes=[1])
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is not the collective's failure: it goes on as it is
        interrupted.wait()
    assert worker._executor is None  # inline: no thread was ever started


def ctrl_c():
    raise KeyboardInterrupt


def test_the_thread_uses_its_own_torch_thread_count_and_starts_again_after_close():
    worker = CollectiveWorker([CPU, CPU], cpu_threads=1, inline=False)
    assert worker._executor is None  # started on first use
    try:
        name, threads = worker.submit("probe", lambda: (threading.current_thread().name,
                                                        torch.get_num_threads()),
                                      reads=[0], writes=[1]).wait()
        assert name.startswith("hybrid-collectives") and threads == 1
        worker.close()
        assert worker._executor is None
        assert worker.submit("again", lambda: 5, reads=[1], writes=[0]).wait() == 5
    finally:
        worker.close()
