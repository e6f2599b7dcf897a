"""One reusable logits buffer per thread, lent to one loss computation at a time.

The output layer's logits (tokens x vocabulary, ~100 MB at 3K tokens and an 8K vocabulary)
are the only tensor of a training step above glibc's largest mmap threshold (32 MB), so a
fresh one is mapped, page-faulted in and unmapped at every step: measured here, writing a
fresh 96 MB tensor took 45-65 ms against 4 ms for a kept one (a CUDA device's caching
allocator keeps its memory; a CPU's does not). ``ProjectedSmoothedCrossEntropy`` borrows
this buffer instead.

A buffer is lent to one computation until that computation's backward has run or its
graph is gone (``Lease``): a second computation while the first still needs its buffer
(two forward passes before one backward, a recomputed checkpoint chunk) gets a fresh
tensor, never the lent one. Each thread has its own buffer (the device workers run head
shards concurrently). Only float32/float64 logits outside autocast use it (``out=``
products are what fill it, and autocast does not cast those).
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor


class Lease:
    """Held by the computation that borrowed the buffer (its autograd context)."""

    def __init__(self) -> None:
        self.returned = False

    def give_back(self) -> None:
        self.returned = True


class _ThreadBuffer(threading.local):
    storage: Optional[Tensor] = None
    lease: Callable[[], Optional[Lease]] = staticmethod(lambda: None)


_BUFFERS = _ThreadBuffer()


def reusable(dtype: torch.dtype) -> bool:
    return dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled()


def borrow(rows: int, columns: int, like: Tensor) -> Tuple[Optional[Tensor], Optional[Lease]]:
    """A rows x columns tensor on ``like``'s device and dtype from this thread's buffer and
    the lease that keeps it, or (None, None) where the buffer is lent or cannot be used."""
    held = _BUFFERS.lease()
    if (held is not None and not held.returned) or not reusable(like.dtype):
        return None, None
    storage = _BUFFERS.storage
    size = rows * columns
    if storage is None or storage.device != like.device or storage.dtype != like.dtype or storage.numel() < size:
        storage = _BUFFERS.storage = None  # the old one freed before the new one is made
        storage = _BUFFERS.storage = torch.empty(size, dtype=like.dtype, device=like.device)
    lease = Lease()
    _BUFFERS.lease = weakref.ref(lease)
    return storage[:size].view(rows, columns), lease


def linear_into_buffer(features: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, Optional[Lease]]:
    """``F.linear(features, weight, bias)`` written into the borrowed buffer where it can
    be, with the lease to return after backward (None: a fresh tensor)."""
    out, lease = borrow(features.size(0), weight.size(0), features)
    if out is None or features.dtype != weight.dtype:
        return torch.nn.functional.linear(features, weight, bias), None
    if bias is None:
        torch.mm(features, weight.t(), out=out)
    else:
        torch.addmm(bias, features, weight.t(), out=out)
    return out, lease


def release() -> None:
    """Free this thread's buffer (a lent one stays alive with its borrower until then)."""
    _BUFFERS.storage = None
