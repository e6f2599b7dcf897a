"""One parallel mechanism for every device kind (CPU devices, GPUs, a mix): what makes the
code a GPU runs the code these CPU tests run, checked on CPU devices.

- every pipeline cell and head shard runs forward and backward on its device's worker;
- each cell's and shard's autograd graph holds only its own leaves and its own parameters
  (no edge crosses devices), so its backward can run alone on its device — on GPUs that
  is what keeps a worker's ``backward`` from waiting on a busy autograd thread;
- when a backward runs on a device's own autograd thread (a GPU), that device's tasks run
  on that thread instead of its worker (simulated here for ``cpu``)."""
import threading

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from fairseq_hybrid.parallel import head_shards, pipeline
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.worker import DeviceWorkers
from helpers import assert_same, loss_and_grads, setup, use_devices

pytestmark = pytest.mark.usefixtures("full_precision_reference")


def graph_leaves(tensors):
    """The tensors whose gradients a backward from ``tensors`` would accumulate."""
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen, leaves = set(), []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            leaves.append(fn.variable)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return leaves


def same_tensors(actual, allowed):
    return all(any(a is b for b in allowed) for a in actual)


@pytest.mark.parametrize("devices,chunks", [("cpu,cpu", 3), ("cpu,cpu,cpu,cpu", 2)])
def test_every_graph_is_confined_to_its_cell_or_shard(monkeypatch, devices, chunks):
    _, task, model, batch = setup(torch.float64, seed=11, encoder_hidden_size=10,
                                  decoder_hidden_size=14)
    assert model.decoder.has_bridge
    checked = {"cells": 0, "bridges": 0, "shards": 0}
    backward_cells = pipeline.WavefrontPipeline.backward_cells

    def check_cells(self, records, *args, **kwargs):
        for (side, layer, _), record in records.items():
            stack = self.stacks[side]
            own = [record.input_leaf, *(record.state_leaves or ()),
                   *stack.layers[layer].parameters()]
            assert same_tensors(graph_leaves([record.output, *record.state]), own)
            checked["cells"] += 1
            if record.bridge is not None:
                bridge = [*record.bridge.inputs, *model.decoder.bridge_hidden.parameters(),
                          *model.decoder.bridge_cell.parameters()]
                assert same_tensors(graph_leaves(record.bridge.outputs), bridge)
                checked["bridges"] += 1
        return backward_cells(self, records, *args, **kwargs)

    forward_task = head_shards.ShardedHeadRun.forward_task

    def check_shard(self, shard, inputs):
        run = forward_task(self, shard, inputs)

        def checked_run():
            result, (f_leaf, s_leaf, params) = run()
            assert same_tensors(graph_leaves([result.loss]), [f_leaf, s_leaf, *params])
            checked["shards"] += 1
            return result, (f_leaf, s_leaf, params)
        return checked_run

    monkeypatch.setattr(pipeline.WavefrontPipeline, "backward_cells", check_cells)
    monkeypatch.setattr(head_shards.ShardedHeadRun, "forward_task", check_shard)
    use_devices(model, devices, chunks)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=4)
    loss_and_grads(hybrid, model, batch)
    layers = model.encoder.num_layers
    assert checked["cells"] == 2 * layers * chunks
    assert checked["bridges"] == layers
    assert checked["shards"] == devices.count("cpu")


def test_backward_on_a_device_thread_runs_that_devices_tasks_there(monkeypatch):
    """On a GPU the staged nodes' backward runs on that GPU's autograd thread, which then
    runs its own device's cells and shards itself; pretend ``cpu`` is such a device."""
    _, task, model, batch = setup(torch.float64, seed=12, encoder_hidden_size=10,
                                  decoder_hidden_size=14)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    threads = []
    original = DeviceWorkers.run_all

    def recording_run_all(self, tasks, inline_device=None, while_waiting=None):
        def wrap(description, fn):
            def run():
                threads.append((description, threading.current_thread().name, inline_device))
                return fn()
            return run
        return original(self, [(i, d, wrap(d, fn)) for i, d, fn in tasks], inline_device, while_waiting)

    monkeypatch.setattr(DeviceWorkers, "run_all", recording_run_all)
    for module in (pipeline, head_shards):
        monkeypatch.setattr(module, "autograd_device_thread", lambda grads: torch.device("cpu"))
    use_devices(model, "cpu,cpu,cpu", 3)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)
    backward = [(d, name) for d, name, inline in threads if d.startswith("backward of")]
    forward = [(d, name) for d, name, inline in threads if not d.startswith("backward of")]
    assert backward and all(name == threading.current_thread().name for _, name in backward)
    assert any(d.startswith("backward of the bridge") for d, _ in backward)
    assert forward and all(name.startswith("hybrid-") for _, name in forward)


def test_inline_tasks_fail_like_worker_tasks():
    from fairseq_hybrid.parallel.worker import WorkerError

    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])
    try:
        def boom():
            raise ValueError("bad cell")
        with pytest.raises(WorkerError, match="cell 1 failed on worker 1 .cpu.: ValueError: bad cell"):
            workers.run_all([(0, "cell 0", lambda: 1), (1, "cell 1", boom)], torch.device("cpu"))
        assert workers.run_all([(0, "a", lambda: 1), (1, "b", lambda: 2)], torch.device("cpu")) == [1, 2]
    finally:
        workers.close()


def test_every_cell_and_shard_runs_forward_and_backward_on_its_worker(monkeypatch):
    """One mechanism for every device kind: each pipeline cell's and each head shard's
    forward and backward are issued on the worker of its device, none on the caller's
    thread or autograd's."""
    from fairseq_hybrid.parallel.worker import DeviceWorkers

    issued = []
    original = DeviceWorkers.run_all

    def recording_run_all(self, tasks, inline_device=None, while_waiting=None):
        issued.extend(description for _, description, _ in tasks)
        return original(self, tasks, inline_device, while_waiting)

    monkeypatch.setattr(DeviceWorkers, "run_all", recording_run_all)
    _, task, model, batch = setup(torch.float64, seed=21)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    use_devices(model, "cpu,cpu,cpu", 4)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)
    cells = 2 * 4 * 4  # encoder + decoder, 4 layers, 4 chunks
    assert sum(d.startswith(("encoder", "decoder")) for d in issued) == cells
    assert sum(d.startswith("backward of encoder") or d.startswith("backward of decoder")
               for d in issued) == cells
    assert sum(d.startswith("head shard") for d in issued) == 3
    assert sum(d.startswith("backward of head shard") for d in issued) == 3


def test_one_device_with_chunks_and_validation_use_the_same_pipeline():
    """One device with K > 1 chunks trains through the staged pipeline, and evaluation
    (no grad) runs the same cells and shards without recording a graph."""
    _, task, model, batch = setup(torch.float64, seed=8)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1)
    use_devices(model, "cpu", 3)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)
    use_devices(model, "cpu,cpu", 2)
    with torch.no_grad():
        loss, _, logging = hybrid(model, batch)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, reference[0], rtol=1e-10, atol=0)
    torch.testing.assert_close(logging["nll_loss"], reference[2]["nll_loss"], rtol=1e-10, atol=0)




def test_workers_run_under_the_callers_autocast_and_grad_mode():
    """fairseq's --amp wraps the forward in autocast, which is thread-local: the workers
    must compute under it too (as torch's parallel_apply does)."""
    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])
    a = torch.randn(4, 4)

    def task():
        return torch.mm(a, a).dtype, torch.is_grad_enabled()
    try:
        assert workers.run_all([(0, "x", task), (1, "y", task)]) == [(torch.float32, True)] * 2
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            assert workers.run_all([(0, "x", task), (1, "y", task)]) == [(torch.bfloat16, False)] * 2
    finally:
        workers.close()
