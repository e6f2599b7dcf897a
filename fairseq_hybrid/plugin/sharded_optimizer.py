"""fairseq's ``--zero-sharding os`` (each data-parallel process keeps the optimizer state of
its share of the parameters) on torch's ``ZeroRedundancyOptimizer``, for every model.

fairseq 0.12 builds the option on fairscale's ``OSS`` (``fairseq/optim/shard.py``); without
fairscale, which this project does not install (an archived project whose source package
builds against the installed torch), ``--zero-sharding os`` stops at the first update with a
multi-line ``ImportError: Please install the fairscale package``. torch's
``ZeroRedundancyOptimizer`` is the same scheme (parameters dealt out whole to the processes,
largest first, to the least loaded; each process steps the optimizer on its share, then each
share's new values are broadcast from its owner), so the plugin hands fairseq's ``shard_``
that one instead, whether fairscale is installed or not (one tested path). What fairseq's
Trainer asks of its sharded optimizer is kept: ``consolidate_state_dict`` on every process
before a checkpoint is saved (process 0 writes the whole state, in the ordinary optimizer
format: the entries an unsharded run writes),
``broadcast_global_state_dict`` when one is loaded (process 0 reads the file, each process
keeps its share), ``disable_mem_eff_fp16_loading_hack`` and the wrapped optimizer's
``supports_*`` flags.

fairseq's own rules stay: with ``--fp16`` it needs ``--fp16-no-flatten-grads`` (one flat fp32
buffer cannot be dealt out by parameter). With one data-parallel process there is nothing to
share: the optimizer is left whole, with one log line. The optimizer class lives in
``zero_redundancy.py``, imported only when a run shards: ``torch.distributed.optim`` takes
~1 s to import, which every fairseq command given ``--user-dir`` would otherwise pay.
"""
from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist
from fairseq import optim as fairseq_optim

logger = logging.getLogger(__name__)


def shard_with_torch(optimizer: Any, group: Any) -> None:
    """fairseq's ``optim.shard_``: ``optimizer`` (a FairseqOptimizer, or fairseq's fp16
    wrapper around one) keeps only this process's share of its state."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        logger.info("--zero-sharding os: one data-parallel process, nothing to share; the "
                    "optimizer keeps its whole state")
        return
    from .zero_redundancy import FairseqZeroRedundancyOptimizer  # deferred: ~1 s import

    wrapped = optimizer.optimizer
    if isinstance(wrapped, FairseqZeroRedundancyOptimizer):
        return
    sharded = FairseqZeroRedundancyOptimizer(
        wrapped.param_groups, optimizer_class=type(wrapped), process_group=group,
        **optimizer.optimizer_config)
    optimizer.optimizer = sharded
    logger.info("--zero-sharding os (torch ZeroRedundancyOptimizer): %s", sharded.held_share())


def zero_sharding_with_torch() -> None:
    """fairseq's Trainer looks ``shard_`` up on ``fairseq.optim`` when it builds the optimizer."""
    fairseq_optim.shard_ = shard_with_torch

