"""Every change the plugin makes to fairseq 0.12 when it is imported, in one place.

fairseq imports a ``--user-dir`` package before it loads a checkpoint or builds a batch,
in fairseq-train (also in each spawned worker), fairseq-generate and fairseq-interactive,
so these reach every run that loads the plugin. ``apply()`` installs each one once:

- ``allow_fairseq_checkpoints`` (compat.py): torch >= 2.6 loads weights only by default and
  fairseq 0.12 does not say otherwise; allow exactly the plain classes fairseq checkpoints
  hold, so resume/generate do not fail on ``argparse.Namespace``.
- ``readable_checkpoints`` (checks.py): a truncated file or one that is not a checkpoint
  fails with one line instead of an unpickling traceback.
- ``atomic_checkpoint_copies`` (atomic_copy.py): checkpoint_last/best copies are written to
  a temporary file and renamed, so a kill mid-copy leaves the old copy intact.
- ``keep_last_batch`` (here): fairseq's ``data_utils.batch_by_size`` silently drops the last
  batch when its size is not a multiple of ``--required-batch-size-multiple`` (default 8;
  fairseq issue #5036): fairseq-generate misses test sentences, validation skips some, and
  the longest training sentences (sorted last, often alone in their batch) are never
  trained on. The wrapper returns the dropped sentences as a last, smaller batch.
  ``FairseqDataset.batch_by_size`` (train, valid, generate, interactive) looks the function
  up on the module at each call, so replacing the module attribute reaches all of them.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

import numpy as np

from .atomic_copy import atomic_checkpoint_copies
from .checks import readable_checkpoints
from .compat import allow_fairseq_checkpoints


def keep_last_batch() -> None:
    """Wrap ``fairseq.data.data_utils.batch_by_size`` (once) so no index is dropped."""
    from fairseq.data import data_utils

    original = data_utils.batch_by_size
    if getattr(original, "_hybrid_keeps_last_batch", False):
        return

    @functools.wraps(original)
    def batch_by_size(indices: Any, num_tokens_fn: Callable, num_tokens_vec: Any = None,
                      max_tokens: Optional[int] = None, max_sentences: Optional[int] = None,
                      required_batch_size_multiple: int = 1, fixed_shapes: Any = None) -> List:
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if len(indices) == 0:  # fairseq would fail on b[-1] with an IndexError
            return []
        batches = original(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                           required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None:  # fairseq's fixed-shape batching drops nothing itself
            return batches
        batched = sum(len(batch) for batch in batches)
        if batched < len(indices):
            used = np.concatenate([np.asarray(batch, dtype=np.int64) for batch in batches]) \
                if batches else np.empty(0, dtype=np.int64)
            batches = list(batches) + [indices[~np.isin(indices, used)].astype(np.int64)]
        return batches

    batch_by_size._hybrid_keeps_last_batch = True
    data_utils.batch_by_size = batch_by_size


def apply() -> None:
    """Install every patch above (each is idempotent)."""
    allow_fairseq_checkpoints()
    readable_checkpoints()
    atomic_checkpoint_copies()
    keep_last_batch()
