"""Gradient clipping over parameters on several devices (installed by
``fairseq_patches.apply`` for every model loaded with the plugin).

fairseq's ``utils.clip_grad_norm_`` (``--clip-norm``, called by every fairseq optimizer
and by ``--amp``'s) sums the per-tensor norms on one device, then scales all gradients
with one ``torch._foreach_mul_(grads, clip_coef)`` whose coefficient is a 0-dim tensor
on that device. A 0-dim tensor may stand in for a scalar on another device only when it
is on the CPU, so for a model whose gradients live on several GPUs — or on a GPU and the
CPU — PyTorch refuses that product (its own ``clip_grad_norm_`` moves the coefficient to
each device for this reason, pytorch/pytorch#38605; not yet seen on a GPU here, where
``make gpu-check`` trains on ``cuda:0,cpu`` to show it). The hybrid model's layers are on
several devices.

``clip_grad_norm_`` here leaves every single-device model to fairseq's own function (the
same numbers, apex's fused norm included) and, when the gradients span devices, still lets
fairseq's function compute the norm (with ``max_norm`` 0 it only measures, gathering each
tensor's norm on one device) and scales each device's gradients with the coefficient sent
to that device.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from fairseq import utils
from torch import Tensor

NormFn = Optional[Callable[[Tensor], Tensor]]


def by_device(tensors: Iterable[Tensor]) -> Dict[torch.device, List[Tensor]]:
    """``tensors`` grouped by device, in order of first appearance."""
    groups: Dict[torch.device, List[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    return groups


def clip_across_devices(original: Callable[..., Tensor], params: List[Tensor], grads: List[Tensor],
                        max_norm: float, aggregate_norm_fn: NormFn = None) -> Tensor:
    """fairseq's clipping (``original``) of ``params``, whose ``grads`` are on several
    devices: fairseq's norm, then each device's gradients (experts' too, as fairseq scales
    them) times the coefficient on that device."""
    total_norm = original(params, 0.0, aggregate_norm_fn)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
        for device, group in by_device(grads).items():
            torch._foreach_mul_(group, clip_coef.to(device))
    return total_norm


def clipping_across_devices() -> None:
    """Wrap (once) ``fairseq.utils.clip_grad_norm_`` (fairseq's optimizers look it up on the
    module at each call)."""
    original = utils.clip_grad_norm_
    if getattr(original, "_hybrid_devices", False):
        return

    @functools.wraps(original)
    def clip_grad_norm_(params: Any, max_norm: float, aggregate_norm_fn: NormFn = None) -> Tensor:
        params = [params] if isinstance(params, Tensor) else list(params)
        grads = [p.grad.detach() for p in params if p is not None and getattr(p, "grad", None) is not None]
        if len(by_device(grads)) <= 1:
            return original(params, max_norm, aggregate_norm_fn)
        return clip_across_devices(original, params, grads, max_norm, aggregate_norm_fn)

    clip_grad_norm_._hybrid_devices = True
    utils.clip_grad_norm_ = clip_grad_norm_
