"""Every copy the engine makes between its devices goes through ``Transfers``, which
records it in a ``TransferLedger``: bytes and copies per (source device index,
destination device index, phase). Devices are told apart by their index in the plan, so
the ledger counts the same traffic on CPU devices (where the copy itself is free) as on
GPUs. The performance model charges the bytes of the same plan (``perfmodel/traffic.py``,
tested equal to this ledger) instead of a guess.

Phases, in the order today's step runs them:
- ``pipeline_forward``: a layer's output to the next layer's device; the encoder's final
  state to device 0 for the bridge and the bridged state to the decoder layer's device.
- ``head_forward``: H and S gathered on device 0, each shard's slices (and target,
  padding mask, combine mask) to the shard's device, the shard losses back.
- ``head_params``: the head's parameters to each replica.
- ``head_backward``: the loss gradient to each shard, the slices' and the replicas'
  gradients back to device 0, dH and dS back to the top layers' devices.
- ``pipeline_backward``: output and state gradients, the reverse of the forward's.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

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
