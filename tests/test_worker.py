"""One worker thread per device (fairseq_hybrid/parallel/worker.py): tasks run on their
device's thread, and a failure reaches the caller with its traceback, nothing hanging."""
import threading
import time

import pytest
import torch

from fairseq_hybrid.parallel.worker import DeviceWorkers, WorkerError


def test_worker_failure_reaches_the_caller_and_nothing_hangs():
    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])
    names = workers.run_all([(0, "a", lambda: threading.current_thread().name),
                             (1, "b", lambda: threading.current_thread().name)])
    assert names[0] != names[1]

    def boom():
        raise ValueError("bad shape 7")

    with pytest.raises(WorkerError, match=r"layer 3 failed on worker 1 \(cpu\): ValueError: bad shape 7") as error:
        workers.run_all([(0, "fine", lambda: 1), (1, "layer 3", boom)])
    assert isinstance(error.value.__cause__, ValueError)
    assert error.value.__cause__.__traceback__ is not None
    assert workers.run_all([(1, "after", lambda: 42)]) == [42]  # the worker still serves
    workers.close()


def test_worker_failure_inside_training_propagates():
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
    from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths

    dictionary = make_dictionary()
    model = make_model(dictionary, encoder_layers=2, decoder_layers=2)
    model.runtime.configure(devices=(torch.device("cpu"),) * 2, chunks=2)
    batch = make_batch(dictionary, random_lengths(4, seed=2))
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.0)
    criterion(model, batch)
    layer = model.decoder.stack.layers[1]
    layer.weight_ih_l0.data = layer.weight_ih_l0.data[:, :3]  # a broken layer
    with pytest.raises(WorkerError, match="decoder layer 1 chunk 0 failed on worker 1"):
        criterion(model, batch)


def test_while_waiting_runs_on_the_calling_thread_while_the_tasks_run():
    """The task waits for an event only ``while_waiting`` sets: it returns True only if
    the calling thread ran it after handing the task out and before waiting for it."""
    workers = DeviceWorkers([torch.device("cpu")])
    started, released = threading.Event(), threading.Event()
    seen = []

    def task():
        started.set()
        return released.wait(timeout=10)

    def meanwhile():
        seen.append((threading.current_thread() is threading.main_thread(), started.wait(timeout=10)))
        released.set()

    assert workers.run_all([(0, "waits", task)], while_waiting=meanwhile) == [True]
    assert seen == [(True, True)]
    workers.close()


def thread_counts(workers: DeviceWorkers) -> list:
    """torch's thread count as each worker's thread sees it."""
    return workers.run_all([(i, "threads", torch.get_num_threads) for i in range(len(workers.devices))])


def test_cpu_workers_split_the_cores_unless_the_user_chose_a_thread_count(monkeypatch):
    from fairseq_hybrid.parallel import worker

    for name in worker.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(worker, "TORCH_THREADS_AT_IMPORT", torch.get_num_threads())
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 8)
    workers = DeviceWorkers([torch.device("cpu")] * 2)
    try:
        assert workers.cpu_threads == 4 and thread_counts(workers) == [4, 4]
    finally:
        workers.close()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torch read it at start: get_num_threads is the user's
    monkeypatch.setattr(worker.torch, "get_num_threads", lambda: 1)
    assert worker.cpu_threads_per_worker(2) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(worker, "TORCH_THREADS_AT_IMPORT", 3)  # torch.set_num_threads(1) after import
    assert worker.cpu_threads_per_worker(2) == 1


def ctrl_c():
    raise KeyboardInterrupt


def test_ctrl_c_in_an_inline_task_reaches_the_caller_as_ctrl_c():
    """A KeyboardInterrupt (Ctrl-C lands on the main thread, which runs the inline tasks) is
    not a worker's failure: it goes on as it is, so that fairseq-train ends as on Ctrl-C,
    even when another task failed too."""
    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])

    def boom():
        raise ValueError("bad shape 7")

    for tasks in ([(0, "fine", lambda: 1), (1, "inline", ctrl_c)],
                  [(0, "broken", boom), (1, "inline", ctrl_c)]):
        with pytest.raises(KeyboardInterrupt):
            workers.run_all(tasks, inline_device=torch.device("cpu"))
    assert workers.run_all([(0, "after", lambda: 42)]) == [42]
    workers.close()


def test_ctrl_c_in_an_inline_task_goes_on_at_once_but_after_the_workers_tasks_end():
    """Ctrl-C stops the inline tasks still to run (and ``while_waiting``), yet reaches the
    caller only once every worker's task has ended: nothing is left running."""
    workers = DeviceWorkers([torch.device("cpu", 0), torch.device("cpu")])
    ran = []

    def slow():
        time.sleep(0.3)
        ran.append("worker")

    tasks = [(0, "slow", slow), (1, "inline", ctrl_c), (1, "later inline", lambda: ran.append("inline"))]
    with pytest.raises(KeyboardInterrupt):
        workers.run_all(tasks, inline_device=torch.device("cpu"),
                        while_waiting=lambda: ran.append("while waiting"))
    assert ran == ["worker"]
    workers.close()
