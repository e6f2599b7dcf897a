"""Dropout masks, drawn on the calling thread in one fixed order.

Worker threads apply dropout to their chunks and shards, but every random draw happens
here, on the thread that runs the model, in the order the plain single-device model makes
them (``HybridLSTMModel.draw_step``), over whole tensors (a chunk or shard uses its slice).
So a run's numbers depend on the seed only — not on the number of time chunks or on which
worker thread happened to run first. CPU devices share one random generator, so there the
numbers also equal the single-device run's; each GPU has its own generator and a layer's
masks are drawn on its device, so on several GPUs a run is reproducible per placement.

A step's masks may be queued instead of drawn (``MaskQueue``): each is then drawn when
first needed (``LazyMask.get``) or earlier, while the calling thread would otherwise wait
for the workers (``MaskQueue.draw_next``, the pipeline's clock cycles) — always in the
order they were queued, whoever asks first, so the numbers are the eager draws' numbers.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Optional, Sequence, Union

import torch
from fairseq.modules import FairseqDropout
from torch import Tensor


def dropout_mask(
    dropout: FairseqDropout, shape: Sequence[int], like: Tensor,
    device: Optional[torch.device] = None,
) -> Optional[Tensor]:
    """A scaled Bernoulli keep-mask for ``dropout`` (None when it is off: eval mode and
    no ``--retain-dropout``, or p == 0): 1 / (1 - p) where a float32 uniform draw is
    below the keep probability, else 0, in ``like``'s dtype.

    Drawn as uniforms and compared, not with ``Tensor.bernoulli_``: on the CPU that is
    three times slower for the same mask distribution (6.4 ms against 2.0 ms for a
    25 x 160 x 256 mask here), and every mask of a step is drawn on the calling thread
    while the workers wait. Float32 uniforms keep the keep probability exact to 2^-24
    under fp16/bf16 too."""
    p = dropout.p
    if p <= 0 or not (dropout.training or dropout.apply_during_inference):
        return None
    keep = 1.0 - p
    mask = torch.rand(tuple(shape), device=device or like.device).lt_(keep)
    if mask.dtype != like.dtype:
        mask = mask.to(like.dtype)
    return mask.div_(keep)


class LazyMask:
    """A mask queued in a ``MaskQueue``: ``get`` draws it (and every mask queued before
    it) if it has not been drawn yet. Only the thread that queued it may call ``get``."""

    __slots__ = ("_queue", "_drawn", "_value")

    def __init__(self, queue: "MaskQueue") -> None:
        self._queue = queue
        self._drawn = False
        self._value: Optional[Tensor] = None

    def get(self) -> Optional[Tensor]:
        while not self._drawn:
            if not self._queue.draw_next():  # its draw failed earlier and was reported then
                raise RuntimeError("a queued dropout mask was never drawn (its draw failed)")
        return self._value


class MaskQueue:
    """A step's masks, drawn one at a time in the order they were added."""

    def __init__(self) -> None:
        self._pending: Deque = deque()

    def add(self, draw: Callable[[], Optional[Tensor]]) -> LazyMask:
        mask = LazyMask(self)
        self._pending.append((mask, draw))
        return mask

    def draw_next(self) -> bool:
        """Draw the oldest pending mask; False if none was pending."""
        if not self._pending:
            return False
        mask, draw = self._pending.popleft()
        mask._value, mask._drawn = draw(), True
        return True

    def draw_all(self) -> None:
        while self.draw_next():
            pass


Mask = Union[Tensor, LazyMask, None]


def queued_or_drawn(queue: Optional[MaskQueue], draw: Callable[[], Optional[Tensor]]) -> Mask:
    """``draw`` queued in ``queue``, or drawn now without one."""
    return draw() if queue is None else queue.add(draw)


def resolve(mask: Mask) -> Optional[Tensor]:
    """The mask's tensor (drawing a queued mask, and those before it, if needed)."""
    return mask.get() if isinstance(mask, LazyMask) else mask


def dropped_out(dropout: FairseqDropout, x: Tensor) -> Tensor:
    """``x`` through ``dropout`` with a ``dropout_mask`` (the embeddings' dropout: the
    same draw as every other mask of the model)."""
    return apply_mask(x, dropout_mask(dropout, x.shape, x))


def apply_mask(x: Tensor, mask: Mask) -> Tensor:
    """``x`` dropped out by ``mask`` (moved to x's device and dtype: under ``--amp`` a mask
    drawn like the float32 embeddings applies to float16 LSTM outputs)."""
    mask = resolve(mask)
    return x if mask is None else x * mask.to(device=x.device, dtype=x.dtype)
