"""Dropout masks drawn up front, on the calling thread.

Worker threads apply dropout to their chunks and shards, but every random draw happens
here, on the thread that runs the model, in the order the plain single-device model makes
them (``HybridLSTMModel.draw_step``), over whole tensors (a chunk or shard uses its slice).
So a run's numbers depend on the seed only — not on the number of time chunks or on which
worker thread happened to run first. CPU devices share one random generator, so there the
numbers also equal the single-device run's; each GPU has its own generator and a layer's
masks are drawn on its device, so on several GPUs a run is reproducible per placement.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from fairseq.modules import FairseqDropout
from torch import Tensor


def dropout_mask(
    dropout: FairseqDropout, shape: Sequence[int], like: Tensor,
    device: Optional[torch.device] = None,
) -> Optional[Tensor]:
    """A scaled Bernoulli keep-mask for ``dropout`` (None when it is off: eval mode and
    no ``--retain-dropout``, or p == 0)."""
    p = dropout.p
    if p <= 0 or not (dropout.training or dropout.apply_during_inference):
        return None
    mask = torch.empty(tuple(shape), dtype=like.dtype, device=device or like.device)
    return mask.bernoulli_(1 - p).div_(1 - p)


def apply_mask(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``x`` dropped out by ``mask`` (moved to x's device and dtype: under ``--amp`` a mask
    drawn like the float32 embeddings applies to float16 LSTM outputs)."""
    return x if mask is None else x * mask.to(device=x.device, dtype=x.dtype)
