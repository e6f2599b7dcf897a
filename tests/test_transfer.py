"""Tests of fairseq_hybrid/parallel/transfer.py."""
import pytest
import torch

from fairseq_hybrid.parallel import transfer
from fairseq_hybrid.parallel.transfer import TransferLedger, Transfers

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


def test_the_ledger_counts_by_index_and_a_move_counts_its_gradient_back():
    ledger = TransferLedger()
    move = Transfers([torch.device("cpu")] * 3, ledger)
    x = torch.ones(4, 5, requires_grad=True)
    y = move.differentiable(x, 2, 0, "head_forward", "head_backward")
    assert move.to(x, 1, 1, "head_forward") is x  # same index: no record
    (y * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((4, 5), 3.0))
    assert ledger.snapshot() == {(2, 0, "head_forward"): 80, (0, 2, "head_backward"): 80}
    with pytest.raises(ValueError, match="phase 'elsewhere'"):
        ledger.record(0, 1, "elsewhere", 1)
