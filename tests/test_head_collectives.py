"""Tests of fairseq_hybrid/parallel/head_collectives.py."""
import pytest
import torch

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
