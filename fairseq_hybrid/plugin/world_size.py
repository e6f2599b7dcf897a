"""fairseq-train's ``--distributed-world-size N`` on a machine with fewer than N GPUs, in
one line, and torchrun on a machine without GPUs (installed by ``fairseq_patches.apply``,
for every model).

Without a launcher (torchrun, Slurm) or ``--distributed-init-method``, fairseq starts one
process per GPU of this machine itself (``distributed_utils._infer_single_node_init``) and
asserts there are enough: ``AssertionError: world size is 2 but have 0 available devices``,
a traceback. The line says what to do instead: fewer processes, or starting each rank
yourself (how CPU training over several processes runs: docs/parallelism.md).
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch
from fairseq.distributed import utils as distributed_utils

from ..errors import HybridConfigError


def check_world_size(world_size: int, gpus: int) -> None:
    if world_size <= gpus:
        return
    fewer = f"use --distributed-world-size {gpus} or less, or " if gpus > 0 else ""
    raise HybridConfigError(
        f"--distributed-world-size {world_size} is not allowed here: fairseq starts one process "
        f"per GPU of this machine and it has {gpus}; {fewer}start each of the {world_size} "
        "processes yourself (torchrun, or --distributed-rank R --distributed-init-method "
        "tcp://HOST:PORT --distributed-no-spawn, with --distributed-backend gloo on CPUs)"
    )


def one_line_world_size() -> None:
    """Wrap (once) fairseq's single-machine start."""
    original = distributed_utils._infer_single_node_init
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def infer_single_node_init(cfg: Any) -> Any:
        check_world_size(cfg.distributed_world_size, torch.cuda.device_count())
        return original(cfg)

    infer_single_node_init._hybrid_checked = True
    distributed_utils._infer_single_node_init = infer_single_node_init


def torchrun_without_gpus() -> None:
    """Under torchrun (or torch.distributed.launch) fairseq picks each process's GPU as
    ``rank % torch.cuda.device_count()``, a ZeroDivisionError on a machine without GPUs;
    there the process's device is the CPU (``device_id`` 0, unused). Where GPUs exist,
    fairseq's own rule runs unchanged."""
    original = distributed_utils._infer_torch_distributed_launch_init
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def infer_torch_distributed_launch_init(cfg: Any) -> Any:
        if torch.cuda.device_count() > 0:
            return original(cfg)
        cfg.distributed_init_method = "env://"
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
        cfg.distributed_rank = int(os.environ["RANK"])
        cfg.device_id = 0
        cfg.distributed_no_spawn = True  # the launcher started the processes
        return None

    infer_torch_distributed_launch_init._hybrid_checked = True
    distributed_utils._infer_torch_distributed_launch_init = infer_torch_distributed_launch_init
