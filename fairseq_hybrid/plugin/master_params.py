"""fairseq's flat fp32 master copy of ``--fp16`` training (one fp32 buffer for every
parameter, fairseq's default) where it is right, and its per-parameter copies elsewhere.

fairseq's ``FP16Optimizer`` builds the flat buffer for ``torch.cuda.current_device()`` from
every parameter, but copies gradients into it (and the updated values back) only for the
parameters whose ``p.device.index`` is that GPU, at offsets counted over those alone: a
parameter on the CPU or on another GPU is never trained, and one that comes before a
parameter on the GPU shifts that one's offset — silently, for any model (fairseq's own
``--arch lstm --cpu --fp16`` on a CUDA machine too). So the flat buffer is kept where every
parameter sits on this process's GPU — one GPU per process, as fairseq's data parallelism
(torch DDP) runs — and elsewhere fairseq's own per-parameter copies are built, as
``--fp16-no-flatten-grads`` asks, with one log line (``plugin/integration.py`` already sets that
option at parse time for a model over several GPUs). fairseq's ``--pipeline-model-parallel``
(a flat buffer per pipeline GPU) and ``--bf16`` (never flat in fairseq) are left as they are.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
from fairseq.optim.fp16_optimizer import FP16Optimizer

logger = logging.getLogger(__name__)


def flat_master_fits(params: Iterable[torch.Tensor]) -> bool:
    """Every parameter on this process's current GPU."""
    if not torch.cuda.is_available():
        return False
    current = torch.cuda.current_device()
    return all(p.device.type == "cuda" and p.device.index == current for p in params)


def flat_master_only_where_it_fits() -> None:
    original = FP16Optimizer.build_optimizer.__func__
    if getattr(original, "flat_master_checked", False):
        return

    def build_optimizer(cls: Any, cfg: Any, params: Any, **kwargs: Any) -> Any:
        params = list(params)
        common = cfg.common
        flat = not getattr(common, "fp16_no_flatten_grads", False) and not getattr(common, "bf16", False)
        pipeline = getattr(cfg.distributed_training, "pipeline_model_parallel", False)
        if flat and not pipeline and not flat_master_fits(params):
            devices = sorted({str(p.device) for p in params})
            logger.info("--fp16: parameters on %s, not all on this process's GPU: one fp32 master "
                        "copy per parameter (--fp16-no-flatten-grads)", ", ".join(devices))
            common.fp16_no_flatten_grads = True
        return original(cls, cfg, params, **kwargs)

    build_optimizer.flat_master_checked = True
    FP16Optimizer.build_optimizer = classmethod(build_optimizer)
