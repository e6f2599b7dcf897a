"""Adapts fairseq's command-line defaults to a model that drives several devices from one
process. Runs while fairseq-train parses the command line (from the ``--arch`` function;
``adapt_fairseq_defaults``) and, under fairseq-hydra-train, on the composed config before
fairseq starts (from ``hydra_callback``; ``adapt_fairseq_config``):

- one process per machine (or per GPU group), not fairseq's one process per visible GPU:
  with ``--hybrid-devices`` naming several GPUs and no explicit
  ``--distributed-world-size``, the world size becomes 1 (across machines the launcher's
  environment sets it: torchrun, Slurm);
- across processes, fairseq's default ``--ddp-backend pytorch_ddp`` (torch DDP) where each
  process drives one device, ``legacy_ddp`` where it drives several (``data_parallel_backend``);
- ``--bf16`` without CUDA trains in bfloat16 on the CPU instead of demanding a TPU;
- ``--fp16`` over several GPUs keeps one fp32 master copy per parameter
  (``--fp16-no-flatten-grads``): fairseq's flat fp32 buffer lives on one GPU and only
  syncs the gradients of parameters on that GPU (``FP16Optimizer._sync_fp16_grads_to_fp32``
  groups them by ``p.device.index``), so the others would silently never train.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import torch

from ..errors import HybridConfigError


def explicit_option(name: str, argv: Optional[Sequence[str]] = None) -> Optional[str]:
    """The value the user gave ``name`` on the command line, if any (fairseq's parsed
    namespace cannot tell a default from an explicit value)."""
    argv = sys.argv[1:] if argv is None else argv
    for index, arg in enumerate(argv):
        if arg == name:
            return argv[index + 1] if index + 1 < len(argv) else ""
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def allow_cpu_bf16(args: Any) -> None:
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not torch.cuda.is_available():
        try:
            import torch_xla  # noqa: F401  (optional: only TPU installs have it)
        except ImportError:
            args.tpu = False
            args.cpu = True


def one_process_per_gpu_group(args: Any, cuda_devices: int, argv: Optional[Sequence[str]] = None) -> None:
    if cuda_devices > 1 and explicit_option("--distributed-world-size", argv) is None:
        args.distributed_world_size = 1


def per_parameter_fp32_copies(args: Any, cuda_devices: int) -> None:
    if cuda_devices > 1 and getattr(args, "fp16", False):
        args.fp16_no_flatten_grads = True


def data_parallel_backend(args: Any, devices: int, argv: Optional[Sequence[str]] = None) -> None:
    """fairseq's own default (torch DDP, gradients all-reduced in buckets while backward
    runs) for a model on one device per process; ``legacy_ddp`` for one that drives
    several: the engine's workers run each pipeline cell's backward as a call of its own, so
    a layer's parameters receive their gradient once per time chunk, which torch DDP's
    hooks refuse ("Expected to mark a variable ready only once", tried on cpu,cpu)."""
    if devices <= 1:
        return
    given = explicit_option("--ddp-backend", argv)
    if given is None:
        args.ddp_backend = "legacy_ddp"
    elif given in ("pytorch_ddp", "c10d"):
        raise HybridConfigError(
            f"--ddp-backend {given} is not allowed with {devices} --hybrid-devices in one "
            "process: the pipeline gives each layer its gradient once per time chunk, which "
            "torch DDP's hooks refuse; use legacy_ddp (the default there) or one device per "
            "process"
        )


def adapt_fairseq_defaults(args: Any, cuda_devices: int, devices: int,
                           argv: Optional[Sequence[str]] = None) -> None:
    """``devices``: the model's devices in one process (``--hybrid-devices``), of which
    ``cuda_devices`` distinct GPUs."""
    allow_cpu_bf16(args)
    one_process_per_gpu_group(args, cuda_devices, argv)
    per_parameter_fp32_copies(args, cuda_devices)
    if hasattr(args, "ddp_backend"):
        data_parallel_backend(args, devices, argv)


def adapt_fairseq_config(cfg: Any, cuda_devices: int, devices: int, argv: Sequence[str]) -> None:
    """``adapt_fairseq_defaults`` for a composed fairseq config (``fairseq-hydra-train``),
    whose options live in groups. ``argv``: the options the user set, as
    ``--ddp-backend=VALUE`` (what ``explicit_option`` reads)."""
    allow_cpu_bf16(cfg.common)
    one_process_per_gpu_group(cfg.distributed_training, cuda_devices, argv)
    per_parameter_fp32_copies(cfg.common, cuda_devices)
    data_parallel_backend(cfg.distributed_training, devices, argv)

