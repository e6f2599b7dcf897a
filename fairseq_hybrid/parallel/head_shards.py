"""The head's data parallelism, in one place: sentences split into one ``Shard`` per
device, each shard's head + loss run forward *and backward* on its device's worker, the
shard losses summed on device 0 and the head's parameter gradients reduced to the master
copy (one coalesced reduction, ``Transfers.reduce_add``). One mechanism for every device
kind (CPU devices, GPUs, a mix, a repeated GPU).

How: the shards are one autograd node (``_ShardedHead``). Its forward runs each shard on
its worker from detached leaves (a slice of H and S, and the head's parameters, seen
through that worker's head replica); its backward runs each shard's own ``backward`` on
the same worker, in parallel, then joins the slices' gradients and sums the parameters'
(the data-parallel reduction). Why not one ``.backward()`` over all shards: CPU autograd
runs it on a single thread, so the shards' backward (two thirds of the head's work) would
run one after another; on GPUs the worker's call only waits for its kernels to be queued.

Each shard's graph holds only its own leaves (its slices of H and S copied to its device,
and its replica's parameters): no autograd edge crosses devices, so each shard's backward
runs alone on its device (on GPUs the device that runs this node's backward runs its own
shard itself: ``worker.autograd_device_thread``).

Each worker computes with its own replica of the head (``head_collectives.HeadReplicas``)
whose parameters share the master's storage on the master's device and are broadcast to
the other devices at the start of the step (as torch's ``replicate`` does): no two threads
ever swap one module's parameters (``functional_call`` would, and a checkpointed chunk's
recompute in backward would then see the wrong ones). The two collectives run on the
engine's collective worker, overlapped with the pipeline (``head_collectives.py``): the
reduction is issued as soon as the shards' backward has made the replicas' gradients, and
its sums reach the master's parameters through the gate on the pipeline's input. Without
grad (validation) the same node runs forward only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..model.head import AttentionHead
from ..model.loss import HeadLoss, TokenLoss, sum_head_losses
from .collective_worker import CollectiveWorker
from .head_collectives import Gradients, HeadGradients, HeadReplicas
from .placement import shard_bounds
from .transfer import Transfers
from .worker import DeviceWorkers, autograd_device_thread

Span = Tuple[int, int]


@dataclass(frozen=True)
class Shard:
    """One device's part of the head: its worker, its sentences (rows of the batch) and
    their selected target tokens (rows of the pre-drawn combine mask)."""

    worker: int
    sentences: Span
    tokens: Span


def sentence_shards(sentences: int, num_devices: int) -> List[Tuple[int, Span]]:
    """(worker, contiguous sentence range) of each device that gets sentences."""
    return [(worker, (start, end)) for worker, (start, end)
            in enumerate(shard_bounds(sentences, num_devices)) if end > start]


def plan_shards(tokens_per_sentence: Sequence[int], num_devices: int) -> List[Shard]:
    """``sentence_shards`` with the selected target tokens each one covers."""
    shards, last = [], 0
    for worker, (start, end) in sentence_shards(len(tokens_per_sentence), num_devices):
        first, last = last, last + sum(tokens_per_sentence[start:end])
        shards.append(Shard(worker, (start, end), (first, last)))
    return shards


@dataclass
class ShardInputs:
    """The whole batch's head inputs where they were made; each shard takes its slices
    straight from there: H from the top decoder layer's device, S from the top encoder
    layer's, the rest from device 0."""

    features: Tensor  # B x T x D, H
    sources: Tensor  # B x S x Ds, encoder states
    padding_mask: Tensor  # B x S, on device 0
    target: Tensor  # B x T, on device 0
    combine_mask: Optional[Tensor]  # selected tokens x D_c on device 0, or None (no dropout)
    features_device: int = 0  # device index of ``features``
    sources_device: int = 0  # device index of ``sources``


class _ShardedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: "ShardedHeadRun", inputs: ShardInputs, features: Tensor,
                sources: Tensor, *params: Tensor):
        ctx.set_materialize_grads(False)
        outputs = run.workers.run_all(
            [(shard.worker, f"head shard {shard.worker}", run.forward_task(shard, inputs))
             for shard in run.shards]
        )
        move = run.transfers

        def gathered(shard: Shard, result: HeadLoss) -> HeadLoss:
            def back(t: Optional[Tensor]) -> Optional[Tensor]:
                return None if t is None else move.to(t.detach(), shard.worker, 0, "head_forward")
            return HeadLoss(back(result.loss), back(result.nll_loss), back(result.n_correct))

        total = sum_head_losses([gathered(shard, result)
                                 for shard, (result, _) in zip(run.shards, outputs)])
        ctx.run, ctx.outputs, ctx.like = run, outputs, (features, sources)
        ctx.sources = (inputs.features_device, inputs.sources_device)
        nll = total.nll_loss
        correct = total.n_correct if total.n_correct is not None else nll.new_zeros(())
        ctx.mark_non_differentiable(nll, correct)
        return total.loss.detach(), nll, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll, _grad_correct):
        # the loss is the only differentiable output: backward runs only when it has a grad
        run: ShardedHeadRun = ctx.run
        features, sources = ctx.like
        n_params = len(run.param_names)
        run.workers.run_all(
            [(shard.worker, f"backward of head shard {shard.worker}",
              run.backward_task(shard, result, grad_loss))
             for shard, (result, _) in zip(run.shards, ctx.outputs)],
            autograd_device_thread([grad_loss]),
        )
        move, phase = run.transfers, "head_backward"
        from_h, from_s = ctx.sources
        feature_grad = torch.zeros_like(features) if features.requires_grad else None
        source_grad = torch.zeros_like(sources) if sources.requires_grad else None
        for shard, (_, leaves) in zip(run.shards, ctx.outputs):
            start, end = shard.sentences
            f_leaf, s_leaf, _ = leaves
            if feature_grad is not None and f_leaf.grad is not None:  # dH straight back
                feature_grad[start:end] = move.to(f_leaf.grad, shard.worker, from_h, phase)
            if source_grad is not None and s_leaf.grad is not None:
                source_grad[start:end] = move.to(s_leaf.grad, shard.worker, from_s, phase)
        # the data-parallel reduction: the replicas' gradients summed onto the master
        param_grads = run.reduce_gradients({shard.worker: [p.grad for p in leaves[2]] for
                                            shard, (_, leaves) in zip(run.shards, ctx.outputs)})
        param_grads += [None] * (n_params - len(param_grads))
        ctx.outputs = None  # free the shards' graphs
        return (None, None, feature_grad, source_grad, *param_grads)


@dataclass
class ShardedHeadRun:
    """One step's sharded head: the shards, the worker pool, and each shard's replica."""

    workers: DeviceWorkers
    transfers: Transfers
    shards: Sequence[Shard]
    replicas: Dict[int, AttentionHead]  # worker -> the head replica it computes with
    loss_fn: TokenLoss
    param_names: Sequence[str]
    grad_enabled: bool
    root: int  # device index of the master head: where the gradients are summed
    collectives: CollectiveWorker
    gradients: Optional[HeadGradients] = None  # the step's gate, if ``features`` set one

    def reduce_gradients(self, grads: Dict[int, Gradients]) -> Gradients:
        """The replicas' gradients (worker -> its list) summed onto the master head's
        device: handed to the collective worker when the step's gate takes the sums
        (nothing returned here), else summed on the spot. Recorded in the ledger now."""
        move, root, phase = self.transfers, self.root, "head_backward"
        move.record_reduce(grads, root, phase)
        if self.gradients is not None and self.gradients.issue(
                lambda: move.reduce_add_unrecorded(grads, root), self.collectives,
                reads=list(grads), writes=[root]):
            return []
        return move.reduce_add_unrecorded(grads, root)

    def forward_task(self, shard: Shard, inputs: ShardInputs):
        replica = self.replicas[shard.worker]
        start, end = shard.sentences
        move, here, phase = self.transfers, shard.worker, "head_forward"

        def leaf(tensor: Tensor, source: int) -> Tensor:
            return move.leaf(tensor[start:end], source, here, phase).requires_grad_(
                self.grad_enabled and tensor.requires_grad)

        def run() -> tuple:
            f_leaf = leaf(inputs.features, inputs.features_device)
            s_leaf = leaf(inputs.sources, inputs.sources_device)
            mask = inputs.combine_mask
            if mask is not None:
                mask = move.to(mask[shard.tokens[0]:shard.tokens[1]], 0, here, phase)
            encoder_out = {"encoder_out": s_leaf, "encoder_padding_mask":
                           move.to(inputs.padding_mask[start:end], 0, here, phase)}
            with torch.set_grad_enabled(self.grad_enabled):
                result = self.loss_fn(replica, f_leaf, encoder_out,
                                      move.to(inputs.target[start:end], 0, here, phase), mask)
            params = dict(replica.named_parameters())
            return result, (f_leaf, s_leaf, [params[name] for name in self.param_names])

        return run

    def backward_task(self, shard: Shard, result: HeadLoss, grad_loss: Tensor):
        def run() -> None:
            if result.loss.requires_grad:
                torch.autograd.backward(
                    result.loss, self.transfers.to(grad_loss, 0, shard.worker, "head_backward"))
        return run


def sharded_head_loss(
    head: AttentionHead, loss_fn: TokenLoss, replicas: HeadReplicas, workers: DeviceWorkers,
    shards: Sequence[Shard], inputs: ShardInputs, gradients: Optional[HeadGradients] = None,
) -> HeadLoss:
    """Summed loss, nll and correct count of the shards, each shard's forward (and, when
    grad is on, backward) on its own worker. ``gradients``: the step's gate that takes the
    reduction of the head's gradients (None: the head's backward returns them itself)."""
    params = dict(head.named_parameters())
    run = ShardedHeadRun(
        workers, replicas.transfers, shards,
        replicas.for_shards(head, [shard.worker for shard in shards]),
        loss_fn, list(params), torch.is_grad_enabled(), replicas.root, replicas.collectives,
        gradients,
    )
    loss, nll, correct = _ShardedHead.apply(
        run, inputs, inputs.features, inputs.sources, *params.values()
    )
    return HeadLoss(loss, nll, correct if loss_fn.count_correct else None)


class ShardLoss(nn.Module):
    """The head plus its loss as one module, on one shard's inputs (the benchmarks time
    it as the unit of the head's work)."""

    def __init__(self, head: AttentionHead, loss_fn: TokenLoss) -> None:
        super().__init__()
        self.head = head
        self.loss_fn = loss_fn

    def forward(
        self, features: Tensor, sources: Tensor, padding_mask: Tensor, target: Tensor,
        combine_mask: Optional[Tensor] = None,
    ) -> HeadLoss:
        encoder_out = {"encoder_out": sources, "encoder_padding_mask": padding_mask}
        return self.loss_fn(self.head, features, encoder_out, target, combine_mask)
