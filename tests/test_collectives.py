"""The head's two collectives (parallel/transfer.py ``broadcast``, ``reduce_add``) and when
the replicas are refreshed (parallel/head_shards.py ``HeadReplicas``): values, the ledger's
routes, one coalesced ``torch.nn.parallel.comm`` call where the devices are distinct GPUs (here
stood in for by CPU functions: no GPU on this machine), and the refresh at the step's start."""
import pytest
import torch

from fairseq_hybrid.parallel import transfer
from fairseq_hybrid.parallel.transfer import Transfers
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths

CPU = torch.device("cpu")


def test_broadcast_on_cpu_devices_shares_the_tensors_and_records_each_destination():
    moves = Transfers([CPU, CPU, CPU])
    tensors = [torch.arange(6.0), torch.ones(2, 3, dtype=torch.float64)]
    out = moves.broadcast(tensors, 0, [0, 1, 2], "head_params")
    assert all(a is b for index in (0, 1, 2) for a, b in zip(out[index], tensors))
    each = 6 * 4 + 6 * 8
    assert moves.ledger.snapshot() == {(0, 1, "head_params"): each, (0, 2, "head_params"): each}


def test_reduce_add_sums_in_index_order_skipping_missing_contributions():
    moves = Transfers([CPU, CPU, CPU])
    a, b, c = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]), torch.tensor([100.0, 200.0])
    sums = moves.reduce_add({2: [c, None], 0: [a, torch.ones(1)], 1: [b, None]}, 0, "head_backward")
    assert torch.equal(sums[0], torch.tensor([111.0, 222.0])) and torch.equal(sums[1], torch.ones(1))
    assert moves.ledger.snapshot() == {(1, 0, "head_backward"): 8, (2, 0, "head_backward"): 8}


def fake_gpus(monkeypatch, calls):
    """``torch.nn.parallel.comm``'s coalesced collectives as CPU functions that log their calls."""
    def broadcast_coalesced(tensors, devices):
        calls.append(("broadcast", [t.clone() for t in tensors], list(devices)))
        return [list(tensors)] + [[t.clone() for t in tensors] for _ in devices[1:]]

    def reduce_add_coalesced(inputs, destination):
        calls.append(("reduce", [list(i) for i in inputs], destination))
        return [sum(group[1:], group[0].clone()) for group in zip(*inputs)]

    monkeypatch.setattr(transfer.comm, "broadcast_coalesced", broadcast_coalesced)
    monkeypatch.setattr(transfer.comm, "reduce_add_coalesced", reduce_add_coalesced)


def test_distinct_gpus_get_one_coalesced_call_each_way(monkeypatch):
    calls = []
    fake_gpus(monkeypatch, calls)
    gpus = [torch.device("cuda", i) for i in range(3)]
    moves = Transfers(gpus)
    tensors = [torch.arange(4.0), torch.arange(2.0)]
    out = moves.broadcast(tensors, 0, [0, 1, 2], "head_params")
    assert [c[0] for c in calls] == ["broadcast"] and calls[0][2] == gpus
    assert out[0][0] is tensors[0] and torch.equal(out[2][1], tensors[1]) and out[2][1] is not tensors[1]
    grads = {i: [torch.full((4,), float(i + 1)), torch.full((2,), 10.0 * (i + 1))] for i in range(3)}
    sums = moves.reduce_add(grads, 0, "head_backward")
    assert [c[0] for c in calls] == ["broadcast", "reduce"] and calls[1][2] == gpus[0]
    assert torch.equal(sums[0], torch.full((4,), 6.0)) and torch.equal(sums[1], torch.full((2,), 60.0))
    routes = moves.ledger.snapshot()
    assert routes[(0, 2, "head_params")] == 24 and routes[(2, 0, "head_backward")] == 24


def test_a_repeated_gpu_or_a_missing_gradient_is_not_one_collective(monkeypatch):
    calls = []
    fake_gpus(monkeypatch, calls)
    repeated = [torch.device("cuda", 0), torch.device("cuda", 0)]
    assert not transfer._distinct_gpus(repeated) and transfer._distinct_gpus(repeated[:1])
    out = Transfers(repeated).broadcast([torch.ones(2)], 0, [0, 1], "head_params")
    assert out[1][0] is out[0][0] and calls == []  # the same GPU: the same tensors, no copy
    moves = Transfers([torch.device("cuda", 0), torch.device("cuda", 1)])
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self)  # CPU stand-in
    sums = moves.reduce_add({0: [torch.ones(2)], 1: [None]}, 0, "head_backward")
    assert calls == [] and torch.equal(sums[0], torch.ones(2))


@pytest.mark.parametrize("devices", [2, 3])
def test_the_replicas_are_refreshed_once_at_the_start_of_each_step(devices):
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=torch.float32, encoder_layers=3, decoder_layers=3).train()
    batch = make_batch(dictionary, random_lengths(6, seed=2), seed=2)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1)
    model.runtime.configure(devices=(torch.device("cpu"),) * devices, chunks=2)
    net = batch["net_input"]
    try:
        engine = model.runtime.engine
        root = engine.plan.head_device  # the master head: with the top layers
        assert root == devices - 1 and next(model.decoder.head.parameters()).device == engine.plan.head_master
        params = sum(p.numel() * 4 for p in model.decoder.head.parameters())
        engine.ledger.clear()
        model(**net, features_only=True, hybrid=True)  # the step's model-parallel part
        copied = {route: n for route, n in engine.ledger.snapshot().items() if route[2] == "head_params"}
        assert copied == {(root, i, "head_params"): params for i in range(devices - 1)}
        loss, _, _ = criterion(model, batch)  # a whole step: one refresh, not two
        loss.backward()
        assert engine.ledger.snapshot()[(root, 0, "head_params")] == 2 * params
        # a head run without the model-parallel part first refreshes on its own
        features, extra = model(**net, features_only=True, hybrid=True)
        engine.head_replicas._fresh = ()
        engine.ledger.clear()
        target = model.get_targets(batch, None)
        model.runtime.head_loss(features, extra["encoder_out"], target, criterion_loss(criterion, model))
        assert engine.ledger.snapshot()[(root, 0, "head_params")] == params
        replica = engine.head_replicas._replicas[0]
        for mine, master in zip(replica.parameters(), model.decoder.head.parameters()):
            assert torch.equal(mine, master)
    finally:
        model.runtime.close()


def criterion_loss(criterion, model):
    from fairseq_hybrid.model.loss import TokenLoss

    return TokenLoss(padding_idx=criterion.padding_idx, epsilon=criterion.eps, chunk_tokens=0,
                     features_are_combined=model.decoder.features_are_combined)
