"""torch's DistributedDataParallel (fairseq's ``--ddp-backend pytorch_ddp``/``c10d``, its
default) for every model fairseq wraps, CPU modules included.

fairseq's ``DistributedFairseqModel`` passes ``device_ids=[args.device_id]`` and
``output_device`` to torch's ``DistributedDataParallel`` whatever the module is; torch
accepts those only for a module on one GPU and refuses a CPU module ("device_ids can only
be None or contain a single element" / "... only work with ... GPU modules or CPU
modules"), so fairseq's default backend could not train any model on CPUs (its own
``--arch lstm --cpu`` with gloo included). torch's rule for the other modules — CPU
modules and modules spread over several devices — is ``device_ids=None``: the wrapper
here passes that for them and fairseq's arguments for a one-GPU module, unchanged.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel


def single_gpu_module(module: torch.nn.Module) -> bool:
    devices = {p.device for p in module.parameters()}
    return len(devices) == 1 and next(iter(devices)).type == "cuda"


class DeviceAwareDistributedDataParallel(DistributedDataParallel):
    """``DistributedDataParallel`` given ``device_ids`` only where torch takes them."""

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Optional[Any] = None, **kwargs: Any) -> None:
        if not single_gpu_module(module):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


def torch_ddp_for_every_module() -> None:
    """fairseq looks ``DistributedDataParallel`` up in its module at each wrap."""
    distributed_fairseq_model.DistributedDataParallel = DeviceAwareDistributedDataParallel
