"""The head's two collectives in a step, each issued on the engine's collective worker
(``collective_worker.py``) and waited on only where its result is used:

- ``HeadReplicas``: one replica of the head per worker. At the step's start
  (``HybridEngine.features``) the master head's parameters are broadcast to the replicas'
  devices (``refresh`` issues it); the broadcast runs while the embeddings and the
  pipeline's forward do, and the step's first head run (``for_shards``) waits for it and
  sets each replica's parameters to the values — the master's own tensors on its device,
  copies on the others (as torch's ``replicate`` does) — with their gradients cleared, so
  each replica's ``.grad`` then holds exactly its shard's contribution. A head run without
  a refresh since the last one (a caller that skips ``features``) refreshes first.
- ``HeadGradients``: the step's reduction of the replicas' gradients onto the master head.
  The head's backward (``head_shards._ShardedHead``) issues it as soon as the shards'
  backward has made them and returns no gradient for the master's parameters; the sums
  come back into autograd through a gate that ``HybridEngine.features`` puts on the
  pipeline's input (the embedded source): an identity in forward whose backward — run by
  autograd only once the pipeline's backward has made the source's gradient — waits for
  the reduction and returns its sums as the master parameters' gradients. So the reduction
  runs while the pipeline's backward does, and autograd accumulates the same sums into
  ``.grad`` (parameter hooks fire as before) before ``backward()`` returns, before anything
  (clipping, the optimizer) reads a gradient. A head backward with no gate waiting for it
  (a head run without ``features``, a second backward through a retained graph) reduces on
  the spot and returns the sums itself, as the engine did before it overlapped them.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..model.head import AttentionHead
from .collective_worker import CollectiveWorker, PendingCollective
from .transfer import Transfers

Gradients = List[Optional[Tensor]]


class HeadReplicas:
    """One replica of the head per worker, made once, refreshed at each step's start."""

    def __init__(self, transfers: Transfers, root: int, collectives: CollectiveWorker) -> None:
        self._replicas: Dict[int, AttentionHead] = {}
        self._fresh: Tuple[int, ...] = ()  # the workers refreshed for the coming head run
        self._pending: Optional[PendingCollective] = None  # the broadcast not yet taken
        self.transfers = transfers
        self.root = root  # device index of the master head
        self.collectives = collectives

    def refresh(self, head: AttentionHead, workers: Sequence[int]) -> None:
        """Issue the broadcast of ``head``'s values to the devices of ``workers`` (the
        ledger records it now); the coming head run sets the replicas to them."""
        # a broadcast no head run took (its step stopped before the head) is dropped: the
        # worker runs collectives in issue order, so the new one comes after it anyway
        tensors = [param.data for param in head.parameters()]
        destinations = list(workers)
        self.transfers.record_broadcast(tensors, self.root, destinations, "head_params")
        self._pending = self.collectives.submit(
            "the broadcast of the head's parameters",
            lambda: self.transfers.broadcast_unrecorded(tensors, self.root, destinations),
            reads=[self.root], writes=destinations)
        self._fresh = tuple(workers)

    def for_shards(self, head: AttentionHead, workers: Sequence[int]) -> Dict[int, AttentionHead]:
        """The replicas of ``workers`` for one head run, set to the values of the refresh
        issued for it (refreshed first unless it was)."""
        if self._fresh != tuple(workers) or self._pending is None:
            self.refresh(head, workers)
        pending, self._pending, self._fresh = self._pending, None, ()
        values = pending.wait()
        params = list(head.parameters())
        for worker in workers:
            replica = self._replicas.get(worker)
            if replica is None:
                replica = self._replicas[worker] = copy.deepcopy(head)
            # a deep copy lists its parameters in the head's order: no lookup by name
            for param, target, value in zip(params, replica.parameters(), values[worker]):
                target.data = value
                target.requires_grad_(param.requires_grad)
                target.grad = None
            replica.train(head.training)
        return {worker: self._replicas[worker] for worker in workers}


class HeadGradients:
    """One step's reduction of the head's gradients, from the head's backward that issues
    it to the gate that waits for it (see the module doc)."""

    def __init__(self, params: Sequence[Tensor]) -> None:
        self.params = list(params)  # the master head's parameters, in ``named_parameters`` order
        self._pending: Optional[PendingCollective] = None
        self._open = True  # the gate has not run yet: a reduction issued now reaches it

    @classmethod
    def for_head(cls, head: AttentionHead) -> Optional["HeadGradients"]:
        """The step's reduction, or None when grad is off or the head trains nothing."""
        params = list(head.parameters())
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in params):
            return None
        return cls(params)

    def gate(self, source: Tensor) -> Tensor:
        """``source`` (the pipeline's input) as the gate's output."""
        return _AwaitHeadGradients.apply(self, source, *self.params)

    def issue(self, reduce: Callable[[], Gradients], collectives: CollectiveWorker,
              reads: Sequence[int], writes: Sequence[int]) -> bool:
        """Hand ``reduce`` to ``collectives`` if the gate will take its sums (True); else
        False and the caller reduces on the spot."""
        if not self._open or self._pending is not None:
            return False
        self._pending = collectives.submit("the reduction of the head's gradients", reduce,
                                           reads, writes)
        return True

    def take(self) -> Optional[Gradients]:
        """For the gate, once: the reduction's sums (waited for), or None if none was
        issued (a head backward after this then reduces on the spot)."""
        self._open = False
        pending, self._pending = self._pending, None
        return None if pending is None else pending.wait()


class _AwaitHeadGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gradients: HeadGradients, source: Tensor, *params: Tensor) -> Tensor:
        ctx.set_materialize_grads(False)
        ctx.gradients = gradients
        return source.view_as(source)

    @staticmethod
    def backward(ctx, grad_source: Optional[Tensor]):
        gradients: HeadGradients = ctx.gradients
        sums = gradients.take() or []
        sums = list(sums) + [None] * (len(gradients.params) - len(sums))
        return (None, grad_source, *sums)
