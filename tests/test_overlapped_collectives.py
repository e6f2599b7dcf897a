"""The head's two collectives overlapped with the pipeline (parallel/collective_worker.py,
head_collectives.py): the same numbers and ledger as summing on the spot, the broadcast
and the reduction really running while pipeline cells run (each one waits for a cell to
start, which only a concurrent run lets happen), a failure on the collective worker
reported in one line without a hang, and the inline switch the A/B benchmark uses."""
import threading

import pytest
import torch

from fairseq_hybrid.parallel import collective_worker, transfer
from fairseq_hybrid.parallel.collective_worker import CollectiveWorker
from fairseq_hybrid.parallel.head_collectives import HeadGradients
from fairseq_hybrid.parallel.worker import WorkerError
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths, traced_steps, use_devices

CPU = torch.device("cpu")


def training_setup(devices="cpu,cpu", chunks=2, seed=4, **options):
    dictionary = make_dictionary()
    layers = max(2, len(devices.split(",")))
    model = make_model(dictionary, encoder_layers=layers, decoder_layers=layers, **options).train()
    batches = [make_batch(dictionary, random_lengths(7, seed=seed + i), seed=seed + i) for i in range(2)]
    for batch in batches:
        batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    use_devices(model, devices, chunks)
    return model, HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1), batches


def accumulated_step(model, criterion, batches):
    """Two forward/backward passes accumulated into .grad (as --update-freq 2): the
    losses, every gradient and the ledger."""
    model.zero_grad(set_to_none=True)
    model.runtime.engine.ledger.clear()
    losses = []
    for batch in batches:
        loss, _, _ = criterion(model, batch)
        loss.backward()
        losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, grads, model.runtime.engine.ledger.snapshot()


@pytest.mark.parametrize("devices, options", [
    ("cpu,cpu", {}),
    ("cpu,cpu,cpu", {"share_decoder_input_output_embed": True}),  # the output layer's weight
    ("cpu,cpu", {"share_all_embeddings": True}),                   # gets three contributions
    ("cpu,cpu,cpu", {"input_feeding": True}),
])
def test_overlapped_gives_the_bits_and_bytes_of_summing_on_the_spot(monkeypatch, devices, options):
    """Reference: the head's backward summing the replicas' gradients itself and returning
    them (no gate: the engine before it overlapped its collectives)."""
    model, criterion, batches = training_setup(devices, **options)
    try:
        overlapped = accumulated_step(model, criterion, batches)
        with monkeypatch.context() as patch:
            patch.setattr(HeadGradients, "for_head", classmethod(lambda cls, head: None))
            on_the_spot = accumulated_step(model, criterion, batches)
    finally:
        model.runtime.close()
    (losses, grads, ledger), (ref_losses, ref_grads, ref_ledger) = overlapped, on_the_spot
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name, grad in grads.items():
        assert torch.equal(grad, ref_grads[name]), name
    assert ledger == ref_ledger and any(route[2] == "head_params" for route in ledger)


def wait_for_a_cell(monkeypatch, name, started, prefix):
    """``Transfers.<name>`` made to wait until a pipeline cell whose task description
    starts with ``prefix`` has started; records the thread it ran on."""
    real = getattr(transfer.Transfers, name)
    threads = []

    def waiting(self, *args):
        threads.append(threading.current_thread().name)
        if not started.wait(timeout=60):
            raise TimeoutError(f"no {prefix!r} cell started while {name} ran")
        return real(self, *args)

    monkeypatch.setattr(transfer.Transfers, name, waiting)
    return threads


def signal_cells(engine, started, prefix):
    run_all = engine.workers.run_all

    def signalling(tasks, *args, **kwargs):
        def flagged(fn):
            def run():
                started.set()
                return fn()
            return run
        tasks = [(w, d, flagged(fn) if d.startswith(prefix) else fn) for w, d, fn in tasks]
        return run_all(tasks, *args, **kwargs)

    engine.workers.run_all = signalling


@pytest.mark.parametrize("collective, prefix", [
    ("broadcast_unrecorded", "encoder layer"),         # runs while the pipeline's forward does
    ("reduce_add_unrecorded", "backward of decoder"),  # while the pipeline's backward does
])
def test_each_collective_runs_while_pipeline_cells_run(monkeypatch, collective, prefix):
    """The collective cannot finish before a pipeline cell of its phase has started: run
    before the pipeline (as it was) it would wait in vain and fail."""
    model, criterion, batches = training_setup()
    started = threading.Event()
    try:
        engine = model.runtime.engine
        threads = wait_for_a_cell(monkeypatch, collective, started, prefix)
        signal_cells(engine, started, prefix)
        loss, _, _ = criterion(model, batches[0])
        loss.backward()
        assert all(p.grad is not None for p in model.decoder.head.parameters())
    finally:
        model.runtime.close()
    assert threads == ["hybrid-collectives_0"]


def test_the_inline_switch_runs_the_collectives_on_the_calling_thread(monkeypatch):
    monkeypatch.setenv(collective_worker.INLINE_VARIABLE, "1")
    model, criterion, batches = training_setup()
    seen = []
    for name in ("broadcast_unrecorded", "reduce_add_unrecorded"):
        real = getattr(transfer.Transfers, name)

        def recorded(self, *args, _real=real, _name=name):
            seen.append((_name, threading.current_thread() is threading.main_thread()))
            return _real(self, *args)

        monkeypatch.setattr(transfer.Transfers, name, recorded)
    try:
        assert model.runtime.engine.collectives.inline
        loss, _, _ = criterion(model, batches[0])
        loss.backward()
    finally:
        model.runtime.close()
    assert seen == [("broadcast_unrecorded", True), ("reduce_add_unrecorded", True)]


@pytest.mark.parametrize("collective, description", [
    ("broadcast_unrecorded", "the broadcast of the head's parameters"),
    ("reduce_add_unrecorded", "the reduction of the head's gradients"),
])
def test_a_failing_collective_is_one_line_and_the_next_step_trains(monkeypatch, collective, description):
    model, criterion, batches = training_setup()
    real = getattr(transfer.Transfers, collective)

    def broken(self, *args):
        raise RuntimeError("link down")

    outcome = {}

    def step():
        try:
            loss, _, _ = criterion(model, batches[0])
            loss.backward()
        except BaseException as error:  # handed to the test's thread
            outcome["error"] = error

    try:
        monkeypatch.setattr(transfer.Transfers, collective, broken)
        runner = threading.Thread(target=step)
        runner.start()
        runner.join(timeout=120)
        assert not runner.is_alive(), "the step hangs"
        error = outcome["error"]
        assert isinstance(error, WorkerError) and "\n" not in str(error)
        assert str(error) == f"{description} failed on the collective worker: RuntimeError: link down"
        assert isinstance(error.__cause__, RuntimeError)
        monkeypatch.setattr(transfer.Transfers, collective, real)
        model.zero_grad(set_to_none=True)
        loss, _, _ = criterion(model, batches[0])
        loss.backward()
        assert all(p.grad is not None for p in model.decoder.head.parameters())
    finally:
        model.runtime.close()


def test_a_step_that_stops_before_the_head_leaves_nothing_for_the_next(monkeypatch):
    """The pipeline fails after the broadcast was issued: the next step's numbers are a
    fresh step's (the untaken broadcast and the unused gate are dropped)."""
    model, criterion, batches = training_setup()
    try:
        _, reference, _ = accumulated_step(model, criterion, batches[:1])
        layer = model.decoder.stack.layers[1]
        weight = layer.weight_ih_l0.data
        layer.weight_ih_l0.data = weight[:, :3]  # a broken layer
        with pytest.raises(WorkerError, match="decoder layer 1 chunk 0 failed"):
            criterion(model, batches[0])
        layer.weight_ih_l0.data = weight
        _, grads, _ = accumulated_step(model, criterion, batches[:1])
    finally:
        model.runtime.close()
    assert grads.keys() == reference.keys()
    assert all(torch.equal(grads[name], reference[name]) for name in grads)


def test_the_collective_worker_keeps_issue_order_and_reports_a_failure():
    worker = CollectiveWorker([CPU, CPU], inline=False)
    order = []
    first = worker.submit("first", lambda: order.append(1) or "a", reads=[0], writes=[1])
    second = worker.submit("second", lambda: order.append(2) or "b", reads=[1], writes=[0])
    assert (second.wait(), first.wait(), order) == ("b", "a", [1, 2])
    failed = worker.submit("the third", lambda: 1 / 0, reads=[0], writes=[1])
    with pytest.raises(WorkerError, match=r"^the third failed on the collective worker: "
                                          r"ZeroDivisionError: division by zero$"):
        failed.wait()
    assert worker.submit("after", lambda: 7, reads=[0], writes=[0]).wait() == 7
    worker.close()


def test_the_step_trace_shows_the_collectives_inside_the_pipelines_phases(monkeypatch, capsys):
    """A real traced run on cpu,cpu: in every step the broadcast is issued before the
    pipeline's first forward cell starts and waited for after its last ends, the
    reduction likewise around the pipeline's backward cells. Ordering facts that hold
    however the threads are scheduled (that each runs while cells run is shown without
    the scheduler's say, in ``test_each_collective_runs_while_pipeline_cells_run``)."""
    from benchmarks import step_trace
    from fairseq_hybrid.planning import BatchSize, ModelSize

    trace, records = traced_steps(monkeypatch, ModelSize(2, 16, 16, 400), BatchSize(16, 9, 9))
    for step in records:
        assert sorted(entry.name for entry in step.collectives) == sorted(step_trace.OVERLAPS)
        for entry in step.collectives:
            cells = step.cells(step_trace.OVERLAPS[entry.name])
            first_start, last_end = min(s for s, _ in cells), max(e for _, e in cells)
            assert entry.issued < first_start < last_end < entry.waited, entry
            assert entry.issued <= entry.started <= entry.ended <= entry.waited, entry
    times = trace["median_s"]
    for name in step_trace.OVERLAPS:
        assert 0 <= times[f"{name} ran while pipeline cells ran"] <= times[f"{name} ran"]
    printed = step_trace.format_trace(trace)
    assert "head reduction" in printed and "while pipeline cells ran" in printed
    assert "one device, one chunk" not in printed
