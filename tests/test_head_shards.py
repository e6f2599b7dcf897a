"""Tests of fairseq_hybrid/parallel/head_shards.py."""
import pytest
import torch

from fairseq_hybrid.model.head import AttentionHead
from fairseq_hybrid.model.loss import TokenLoss
from fairseq_hybrid.parallel.collective_worker import CollectiveWorker
from fairseq_hybrid.parallel.head_collectives import HeadReplicas
from fairseq_hybrid.parallel.head_shards import (
    Shard, ShardInputs, ShardLoss, plan_shards, sentence_shards, sharded_head_loss,
)
from fairseq_hybrid.parallel.transfer import Transfers
from fairseq_hybrid.parallel.worker import DeviceWorkers

CPU = torch.device("cpu")
PAD = 1


def test_shards_take_contiguous_sentences_and_the_tokens_they_select():
    assert plan_shards([3, 1, 4, 1, 5], 2) == [Shard(0, (0, 3), (0, 8)), Shard(1, (3, 5), (8, 14))]
    assert plan_shards([2, 0, 7], 3) == [Shard(0, (0, 1), (0, 2)), Shard(1, (1, 2), (2, 2)),
                                         Shard(2, (2, 3), (2, 9))]
    # fewer sentences than devices: the devices without a sentence get no shard
    assert sentence_shards(2, 4) == [(0, (0, 1)), (1, (1, 2))]
    assert plan_shards([4, 6], 4) == [Shard(0, (0, 1), (0, 4)), Shard(1, (1, 2), (4, 10))]


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_the_sharded_head_gives_the_whole_batchs_loss_and_gradients(devices):
    """Loss, nll, correct count and the gradients of H, S and every head parameter equal
    the head and loss run once over the whole batch (float64)."""
    torch.manual_seed(0)
    head = AttentionHead(6, 5, 4, 11, dropout=0.0).double()
    loss_fn = TokenLoss(padding_idx=PAD, epsilon=0.1, chunk_tokens=0, count_correct=True)
    features = torch.randn(5, 4, 6, dtype=torch.float64, requires_grad=True)
    sources = torch.randn(5, 7, 5, dtype=torch.float64, requires_grad=True)
    padding = torch.zeros(5, 7, dtype=torch.bool)
    padding[2:, 5:] = True
    target = torch.randint(2, 11, (5, 4))
    target[1, 2:] = PAD
    target[4, 1:] = PAD

    reference = ShardLoss(head, loss_fn)(features, sources, padding, target)
    expected = torch.autograd.grad(reference.loss, [features, sources, *head.parameters()])

    workers = DeviceWorkers([CPU] * devices)
    collectives = CollectiveWorker([CPU] * devices)
    workers.on_close.append(collectives.close)
    try:
        replicas = HeadReplicas(Transfers([CPU] * devices), devices - 1, collectives)
        shards = plan_shards(loss_fn.selection(target).sum(dim=1).tolist(), devices)
        result = sharded_head_loss(head, loss_fn, replicas, workers, shards,
                                   ShardInputs(features, sources, padding, target, None))
        grads = torch.autograd.grad(result.loss, [features, sources, *head.parameters()])
    finally:
        workers.close()
    torch.testing.assert_close(result.loss, reference.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(result.nll_loss, reference.nll_loss, rtol=1e-12, atol=0)
    assert int(result.n_correct) == int(reference.n_correct)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
