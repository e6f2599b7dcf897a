"""The head's sentence shards as units of work: ``ShardLoss`` (head + loss, what one
device runs on its sentences) and, for CPU devices, ``staged_shard_losses``, which runs
every shard's forward *and backward* on its device's worker.

Why the staging: CPU autograd runs one ``.backward()`` on a single thread, so shards whose
forward ran in parallel on the workers would run their backward (two thirds of the head's
work) one after another. Here the shards are one autograd node: its forward runs each
shard on its worker from detached leaves (a slice of H and S, and the head's parameters),
and its backward runs each shard's own ``backward`` on the same worker, in parallel, then
joins the slices' gradients and sums the parameters' (the data-parallel reduction). Each
worker computes with its own replica of the head whose parameters share the master's
storage (``HeadReplicas``): no copies, and no two threads swapping one module's
parameters (``functional_call`` would, and a checkpointed chunk's recompute in backward
would then see the wrong ones).
CUDA needs none of this (autograd runs one thread per GPU): see ``engine.py``.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from .head import AttentionHead
from .loss import HeadLoss, TokenLoss
from .worker import DeviceWorkers

Span = Tuple[int, int]


class ShardLoss(nn.Module):
    """The head plus its loss, as one module so ``replicate``/``parallel_apply`` can run it."""

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


class HeadReplicas:
    """One replica of the head per worker, made once; before each step its parameters are
    pointed at the master's (``.data``, no copy on the master's device) and its gradients
    cleared, so each replica's ``.grad`` holds exactly its shard's contribution."""

    def __init__(self) -> None:
        self._replicas: Dict[int, AttentionHead] = {}

    def for_shard(self, index: int, head: AttentionHead, device: torch.device) -> AttentionHead:
        replica = self._replicas.get(index)
        if replica is None:
            replica = self._replicas[index] = copy.deepcopy(head)
        replica.train(head.training)
        own = dict(replica.named_parameters())
        for name, param in head.named_parameters():
            target = own[name]
            target.data = param.data if param.device == device else param.data.to(device)
            target.requires_grad_(param.requires_grad)
            target.grad = None
        return replica


class ShardWork:
    """What the staged node needs to run the shards: for each non-empty shard its worker
    index, sentence span, token span (of the pre-drawn combine mask) and module (the
    loss around that worker's head replica)."""

    def __init__(
        self, workers: DeviceWorkers, devices: Sequence[torch.device],
        shards: Sequence[Tuple[int, Span, Span]], modules: Sequence[ShardLoss],
        names: Sequence[str],
    ) -> None:
        self.workers = workers
        self.devices = devices
        self.shards = shards
        self.modules = modules
        self.names = names


class _StagedShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx, work: ShardWork, padding_mask: Tensor, target: Tensor,
                combine_mask: Optional[Tensor], features: Tensor, sources: Tensor,
                *params: Tensor):
        ctx.set_materialize_grads(False)

        def shard_forward(index: int, sentences: Span, tokens: Span, module: ShardLoss) -> Callable[[], tuple]:
            device = work.devices[index]
            start, end = sentences

            def run() -> tuple:
                f_leaf = features[start:end].detach().to(device).requires_grad_(features.requires_grad)
                s_leaf = sources[start:end].detach().to(device).requires_grad_(sources.requires_grad)
                mask = None if combine_mask is None else combine_mask[tokens[0]:tokens[1]].to(device)
                with torch.enable_grad():
                    result = module(f_leaf, s_leaf, padding_mask[start:end].to(device),
                                    target[start:end].to(device), mask)
                return result, (f_leaf, s_leaf, dict(module.named_parameters()))

            return run

        outputs = work.workers.run_all([
            (index, f"head shard {index}", shard_forward(index, sentences, tokens, module))
            for (index, sentences, tokens), module in zip(work.shards, work.modules)
        ])
        ctx.work, ctx.outputs = work, outputs
        ctx.like = (features, sources)
        master = features.device
        results = [r for r, _ in outputs]
        loss = torch.stack([r.loss.detach().to(master) for r in results]).sum()
        nll = torch.stack([r.nll_loss.to(master) for r in results]).sum()
        counts = [r.n_correct.to(master) for r in results if r.n_correct is not None]
        correct = torch.stack(counts).sum() if counts else nll.new_zeros(())
        ctx.mark_non_differentiable(nll, correct)
        return loss, nll, correct

    @staticmethod
    def backward(ctx, grad_loss: Optional[Tensor], _grad_nll, _grad_correct):
        work: ShardWork = ctx.work
        features, sources = ctx.like
        n_params = len(work.names)
        if grad_loss is None:
            return (None,) * (6 + n_params)

        def shard_backward(result: HeadLoss, device: torch.device) -> Callable[[], None]:
            def run() -> None:
                torch.autograd.backward(result.loss, grad_loss.to(device))
            return run

        work.workers.run_all([
            (index, f"backward of head shard {index}", shard_backward(result, work.devices[index]))
            for (index, _, _), (result, _) in zip(work.shards, ctx.outputs)
        ])
        master = features.device
        feature_grad = torch.zeros_like(features) if features.requires_grad else None
        source_grad = torch.zeros_like(sources) if sources.requires_grad else None
        param_grads: List[Optional[Tensor]] = [None] * n_params
        for (_, (start, end), _), (_, (f_leaf, s_leaf, p_leaves)) in zip(work.shards, ctx.outputs):
            if feature_grad is not None and f_leaf.grad is not None:
                feature_grad[start:end] = f_leaf.grad.to(master)
            if source_grad is not None and s_leaf.grad is not None:
                source_grad[start:end] = s_leaf.grad.to(master)
            for i, name in enumerate(work.names):
                grad = p_leaves["head." + name].grad
                if grad is not None:
                    grad = grad.to(master)
                    param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
        ctx.outputs = None  # free the shards' graphs
        return (None, None, None, None, feature_grad, source_grad, *param_grads)


def staged_shard_losses(
    head: AttentionHead, loss_fn: TokenLoss, replicas: HeadReplicas, workers: DeviceWorkers,
    devices: Sequence[torch.device], shards: Sequence[Tuple[int, Span, Span]],
    features: Tensor, sources: Tensor, padding_mask: Tensor, target: Tensor,
    combine_mask: Optional[Tensor],
) -> HeadLoss:
    """Summed loss, nll and correct count of the shards, forward and backward of each on
    its own worker. ``shards``: (worker index, sentence span, token span), non-empty."""
    params: Dict[str, Tensor] = dict(head.named_parameters())
    modules = [ShardLoss(replicas.for_shard(index, head, devices[index]), loss_fn)
               for index, _, _ in shards]
    work = ShardWork(workers, devices, shards, modules, list(params))
    loss, nll, correct = _StagedShards.apply(
        work, padding_mask, target, combine_mask, features, sources, *params.values()
    )
    return HeadLoss(loss, nll, correct if loss_fn.count_correct else None)
