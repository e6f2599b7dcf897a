"""Tests of fairseq_hybrid/parallel/head_collectives.py."""
import pytest
import torch

from fairseq_hybrid.parallel.collective_worker import CollectiveWorker
from fairseq_hybrid.parallel.head_collectives import HeadGradients
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths


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


def test_the_step_reduction_exists_only_where_the_head_trains():
    from fairseq_hybrid.model.head import AttentionHead

    head = AttentionHead(4, 3, 5, 7, dropout=0.0)
    assert isinstance(HeadGradients.for_head(head), HeadGradients)
    with torch.no_grad():
        assert HeadGradients.for_head(head) is None
    head.requires_grad_(False)
    assert HeadGradients.for_head(head) is None


def test_the_gate_hands_the_issued_sums_to_the_parameters_once():
    """One reduction per step reaches the gate: issued once (a second issue, or one after
    the gate ran, is the caller's to reduce on the spot); the gate passes the source's
    gradient through and returns the sums as the parameters' gradients."""
    params = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    collectives = CollectiveWorker([torch.device("cpu")], inline=True)
    gradients = HeadGradients(params)
    source = torch.ones(4, requires_grad=True)
    out = gradients.gate(source)
    sums = [torch.full((2,), 2.0), torch.full((3,), 5.0)]
    assert gradients.issue(lambda: sums, collectives, [0], [0])
    assert not gradients.issue(lambda: pytest.fail("issued twice"), collectives, [0], [0])
    (3 * out).sum().backward()
    assert torch.equal(source.grad, torch.full((4,), 3.0))
    assert torch.equal(params[0].grad, sums[0]) and torch.equal(params[1].grad, sums[1])
    assert not gradients.issue(lambda: sums, collectives, [0], [0])  # the gate has run
    assert gradients.take() is None


def test_a_gate_with_nothing_issued_leaves_the_parameters_alone():
    params = [torch.zeros(2, requires_grad=True)]
    gradients = HeadGradients(params)
    source = torch.ones(3, requires_grad=True)
    gradients.gate(source).sum().backward()
    assert torch.equal(source.grad, torch.ones(3)) and params[0].grad is None
