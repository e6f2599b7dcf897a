"""Every copy the engine makes between its devices goes through ``Transfers``, which
records it in a ``TransferLedger``: bytes and copies per (source device index,
destination device index, phase). Devices are told apart by their index in the plan, so
the ledger counts the same traffic on CPU devices (where the copy itself is free) as on
GPUs. The performance model charges the bytes of the same plan (``planning/traffic.py``,
tested equal to this ledger) instead of a guess.

Phases, in the order today's step runs them:
- ``pipeline_forward``: a layer's output to the next layer's device; the encoder's final
  state to device 0 for the bridge and the bridged state to the decoder layer's device.
- ``head_forward``: each shard's slices of H and S from the top layers' device (with
  a plan without ``split_head``: H and S where the head is), its target, padding mask and
  combine mask from device 0, the shard losses back to device 0.
- ``head_params``: the head's parameters from the master head's device to each replica, at
  the start of the step (one broadcast).
- ``head_backward``: the loss gradient to each shard, dH and dS back to the top layers'
  devices, the replicas' gradients summed onto the master head's device (one reduction).

The two collectives (``broadcast``, ``reduce_add``) are recorded as the transfers they
stand for (the source to each destination, each source to the destination); on distinct
GPUs each is one coalesced NCCL call (``torch.nn.parallel.comm``), which moves the same bytes
along a ring instead of one copy after another from device 0. The engine records each when
it issues it (``record_broadcast``, ``record_reduce``) and runs its copies on the collective
worker (``*_unrecorded``, ``collective_worker.py``), so the ledger is complete as soon as a
collective is issued, whichever thread runs it.
- ``pipeline_backward``: output and state gradients, the reverse of the forward's.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.parallel import comm

PHASES = ("pipeline_forward", "head_forward", "head_params", "head_backward",
          "pipeline_backward")
Route = Tuple[int, int, str]  # (source index, destination index, phase)


class TransferLedger:
    """Bytes per route, safe to record from the device workers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes: Dict[Route, int] = defaultdict(int)

    def record(self, source: int, destination: int, phase: str, nbytes: int) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}: one of {PHASES}")
        with self._lock:
            self.bytes[(source, destination, phase)] += nbytes

    def clear(self) -> None:
        with self._lock:
            self.bytes.clear()

    def snapshot(self) -> Dict[Route, int]:
        """Bytes per route so far (routes with bytes only)."""
        with self._lock:
            return {route: n for route, n in self.bytes.items() if n}


def nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Transfers:
    """Copies between the plan's devices (by index), each recorded in ``ledger``."""

    def __init__(self, devices: Sequence[torch.device], ledger: Optional[TransferLedger] = None) -> None:
        self.devices = list(devices)
        self.ledger = ledger if ledger is not None else TransferLedger()

    def to(self, tensor: Tensor, source: int, destination: int, phase: str) -> Tensor:
        """``tensor`` (on device ``source``) on device ``destination``; recorded when the
        two indices differ (a copy on GPUs; on CPU devices the same memory)."""
        if source != destination:
            self.ledger.record(source, destination, phase, nbytes(tensor))
        return tensor.to(self.devices[destination])

    def broadcast(self, tensors: Sequence[Tensor], source: int, destinations: Sequence[int],
                  phase: str) -> Dict[int, List[Tensor]]:
        """``tensors`` (on device ``source``) on each of ``destinations``: the same tensors
        where a destination is the source's device, else copies — one coalesced collective
        when they are all distinct GPUs."""
        self.record_broadcast(tensors, source, destinations, phase)
        return self.broadcast_unrecorded(tensors, source, destinations)

    def record_broadcast(self, tensors: Sequence[Tensor], source: int,
                         destinations: Sequence[int], phase: str) -> None:
        """The ledger's part of ``broadcast`` alone (recorded when the broadcast is issued,
        whichever thread then runs it)."""
        for index in destinations:
            if index != source:
                for tensor in tensors:
                    self.ledger.record(source, index, phase, nbytes(tensor))

    def broadcast_unrecorded(self, tensors: Sequence[Tensor], source: int,
                             destinations: Sequence[int]) -> Dict[int, List[Tensor]]:
        """The copies of ``broadcast`` without recording them."""
        out: Dict[int, List[Tensor]] = {}
        copies = []
        for index in destinations:
            if self.devices[index] == self.devices[source]:
                out[index] = list(tensors)
            else:
                copies.append(index)
        if copies and _distinct_gpus([self.devices[source], *(self.devices[i] for i in copies)]):
            results = comm.broadcast_coalesced(
                list(tensors), [self.devices[source], *(self.devices[i] for i in copies)])
            out.update({index: list(result) for index, result in zip(copies, results[1:])})
        else:
            out.update({index: [t.to(self.devices[index]) for t in tensors] for index in copies})
        return out

    def reduce_add(self, tensors: Dict[int, List[Optional[Tensor]]], destination: int,
                   phase: str) -> List[Optional[Tensor]]:
        """Elementwise sums onto device ``destination`` of each position of the lists in
        ``tensors`` (device index -> tensors on that device; None: no contribution), in
        the order of the indices — one coalesced collective when every list is complete
        and on its own GPU, the destination's among them."""
        self.record_reduce(tensors, destination, phase)
        return self.reduce_add_unrecorded(tensors, destination)

    def record_reduce(self, tensors: Dict[int, List[Optional[Tensor]]], destination: int,
                      phase: str) -> None:
        """The ledger's part of ``reduce_add`` alone (recorded when it is issued)."""
        for index in sorted(tensors):
            if index != destination:
                for tensor in tensors[index]:
                    if tensor is not None:
                        self.ledger.record(index, destination, phase, nbytes(tensor))

    def reduce_add_unrecorded(self, tensors: Dict[int, List[Optional[Tensor]]],
                              destination: int) -> List[Optional[Tensor]]:
        """The sums of ``reduce_add`` without recording them."""
        indices = sorted(tensors)
        devices = [self.devices[i] for i in indices]
        complete = all(t is not None for i in indices for t in tensors[i])
        if (complete and len(indices) > 1 and destination in indices
                and _distinct_gpus(devices)):
            return list(comm.reduce_add_coalesced(
                [tensors[i] for i in indices], self.devices[destination]))
        width = max(len(tensors[i]) for i in indices) if indices else 0
        sums: List[Optional[Tensor]] = [None] * width
        for index in indices:
            for position, tensor in enumerate(tensors[index]):
                if tensor is None:
                    continue
                moved = tensor.to(self.devices[destination])
                sums[position] = moved if sums[position] is None else sums[position] + moved
        return sums

    def leaf(self, tensor: Tensor, source: int, destination: int, phase: str) -> Tensor:
        """A detached copy on ``destination`` that records its own gradient (a cell's or a
        shard's input: its graph starts here)."""
        return self.to(tensor.detach(), source, destination, phase).requires_grad_(tensor.requires_grad)

    def differentiable(self, tensor: Tensor, source: int, destination: int,
                       forward_phase: str, backward_phase: str) -> Tensor:
        """``to`` inside autograd: the gradient's copy back is recorded too."""
        if source == destination:
            return tensor
        return _Move.apply(tensor, self, source, destination, forward_phase, backward_phase)


def _distinct_gpus(devices: Sequence[torch.device]) -> bool:
    """Every device a CUDA device, none twice (what ``torch.cuda.comm``'s collectives take)."""
    return all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)


class _Move(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: Tensor, transfers: Transfers, source: int, destination: int,
                forward_phase: str, backward_phase: str) -> Tensor:
        ctx.route = (transfers, source, destination, backward_phase)
        return transfers.to(tensor, source, destination, forward_phase)

    @staticmethod
    def backward(ctx, grad: Tensor):
        transfers, source, destination, phase = ctx.route
        return transfers.to(grad, destination, source, phase), None, None, None, None, None
