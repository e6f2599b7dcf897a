"""An epoch resumed with other batches goes on with the sentences it has not trained on
(installed by ``fairseq_patches.apply`` around fairseq's ``EpochBatchIterator``, for every
model).

fairseq keeps a training's place in its epoch as a count of batches
(``iterations_in_epoch``) and a resumed run skips that many of the batches it builds then.
Built with another ``--max-tokens``, ``--batch-size``, ``--required-batch-size-multiple``,
``--max-source-positions``, ``--seed`` or number of processes, those batches hold other
sentences: the rest of the epoch silently left some out and repeated others (stopped at
batch 8 of 18 and resumed with twice the ``--max-tokens``: one batch was left, some 260 of
400 sentences never trained on in that epoch), or fairseq stopped with "Cannot resume
training due to dataloader mismatch".

Here a checkpoint written in the middle of an epoch also records which sentences of the
training split the epoch has trained on (``SEEN``: one bit per sentence, packed; 4.5M
sentence pairs take 560 KB). On resume, when the batches built now would skip exactly those
sentences, fairseq's own resume runs, unchanged (so an unchanged command resumes bit for
bit). Otherwise the rest of the epoch is this run's batches of the epoch, in their shuffled
order, without the sentences already trained on (a batch left empty is dropped), a warning
says how many were trained on and how many are left, and later epochs are this run's own.
``--update-freq`` changes no batch (the position counts batches, not updates): such a
resume is fairseq's own. Why go on rather than refuse: the usual reason to change the batch
size of a training is memory (out of memory, or a new machine), where the old batches may
not fit, and fairseq's ``--reset-dataloader`` starts over at epoch 1. A checkpoint
written without the plugin has no record: fairseq's resume, as before; so do iterators that
build their epochs otherwise (subclasses with their own ``_get_iterator_for_epoch``).
"""
from __future__ import annotations

import copy
import functools
import logging
from types import SimpleNamespace
from typing import Any, Callable, List, Optional

import numpy as np
import torch
from fairseq.data.iterators import EpochBatchIterator, ShardedIterator

from ..errors import HybridConfigError

logger = logging.getLogger(__name__)
SEEN = "hybrid_seen_sentences"  # in the iterator's state: {"sentences": n, "bits": uint8 tensor}
REST = "_hybrid_rest_of_epoch"  # on a resumed iterator: the RestOfEpoch it runs


class RestOfEpoch:
    """Stands for ``EpochBatchIterator.ordered_batches`` on one iterator: the batches left
    of a resumed epoch (all processes' batches, in order: process ``s`` takes every N-th
    from the ``s``-th, as fairseq shards them), fairseq's own for every other epoch."""

    def __init__(self, iterator: Any, epoch: int, batches: List[np.ndarray], seen: np.ndarray) -> None:
        self.iterator, self.epoch, self.batches, self.seen = iterator, epoch, batches, seen

    def __call__(self, epoch: int, fix_batches_to_gpus: bool, shuffle: bool) -> List:
        if epoch != self.epoch:
            return type(self.iterator).ordered_batches(self.iterator, epoch, fix_batches_to_gpus, shuffle)
        return list(ShardedIterator(self.batches, self.iterator.num_shards,
                                    self.iterator.shard_id, fill_value=[]))


def all_batches(iterator: Any, epoch: int, shuffle: bool, fix_batches_to_gpus: bool) -> List[np.ndarray]:
    """Every process's batches of ``epoch`` in the order fairseq hands them out (position
    ``j * N + s`` is process ``s``'s ``j``-th batch), from fairseq's ``ordered_batches``
    on a copy per process (which prefetches nothing)."""
    rest: Optional[RestOfEpoch] = getattr(iterator, REST, None)
    if rest is not None and rest.epoch == epoch:
        return rest.batches
    iterator.frozen_batches  # noqa: B018 - computed once, on the iterator itself (shared by the copies)
    shards = []
    for shard in range(iterator.num_shards):
        other = copy.copy(iterator)
        other.shard_id, other.dataset = shard, SimpleNamespace(prefetch=lambda indices: None)
        shards.append(type(iterator).ordered_batches(other, epoch, fix_batches_to_gpus, shuffle))
    return [np.asarray(shards[s][j], dtype=np.int64)
            for j in range(len(shards[0])) for s in range(iterator.num_shards)]


def standard(iterator: Any) -> bool:
    """An iterator that hands out ``ordered_batches`` as fairseq's own does (subclasses
    that build their epochs otherwise keep fairseq's resume)."""
    return type(iterator)._get_iterator_for_epoch is EpochBatchIterator._get_iterator_for_epoch \
        and type(iterator).ordered_batches is EpochBatchIterator.ordered_batches


def mask_of(batches: List[np.ndarray], size: int) -> np.ndarray:
    seen = np.zeros(size, dtype=bool)
    for batch in batches:
        seen[np.asarray(batch, dtype=np.int64)] = True
    return seen


def trained_on(iterator: Any) -> np.ndarray:
    """The sentences of the current epoch the iterator has handed out (all processes)."""
    sampler = getattr(iterator, "epoch_batch_sampler", None)
    fix = getattr(sampler, "fix_batches_to_gpus", False)
    batches = all_batches(iterator, iterator.epoch, iterator.shuffle, fix)
    seen = mask_of(batches[: iterator.iterations_in_epoch * iterator.num_shards], len(iterator.dataset))
    rest: Optional[RestOfEpoch] = getattr(iterator, REST, None)
    if rest is not None and rest.epoch == iterator.epoch:
        seen |= rest.seen
    return seen


def seen_state(seen: np.ndarray) -> dict:
    return {"sentences": len(seen), "bits": torch.from_numpy(np.packbits(seen))}


def seen_from(state: dict, size: int) -> np.ndarray:
    if state["sentences"] != size:
        raise HybridConfigError(
            f"the checkpoint stopped in the middle of an epoch of a training split of "
            f"{state['sentences']} sentences, this one has {size}: resume with the data it was "
            "trained on, or start from its weights at epoch 1 with --reset-dataloader"
        )
    bits = state["bits"].numpy() if torch.is_tensor(state["bits"]) else np.asarray(state["bits"])
    return np.unpackbits(bits.astype(np.uint8), count=size).astype(bool)


def resume_rest(iterator: Any, state: dict, seen: np.ndarray) -> None:
    """Make the iterator's next epoch iterator the rest of ``state``'s epoch."""
    epoch, shuffle = state["epoch"], state.get("shuffle", True)
    batches = all_batches(iterator, epoch, shuffle, False)  # fairseq resumes unfixed too
    left = [kept for batch in batches if len(kept := batch[~seen[batch]])]
    iterator.epoch = epoch
    rest = RestOfEpoch(iterator, epoch, left, seen)
    setattr(iterator, REST, rest)
    iterator.ordered_batches = rest
    iterator._next_epoch_itr = iterator._get_iterator_for_epoch(epoch, shuffle, offset=0)
    logger.warning(
        f"epoch {epoch} is resumed with other batches than the checkpoint's (another "
        "--max-tokens, --batch-size, --required-batch-size-multiple, number of processes ...): "
        f"it had trained on {int(seen.sum())} sentences; the {sum(len(b) for b in left)} left "
        f"are trained on in {len(left)} batches of this run, then the epochs go on as usual")


def epochs_resumed_by_sentences() -> None:
    """Wrap (once) ``EpochBatchIterator.state_dict`` and ``load_state_dict``."""

    state_dict: Callable = EpochBatchIterator.state_dict
    if getattr(state_dict, "_hybrid_seen", False):
        return
    load_state_dict: Callable = EpochBatchIterator.load_state_dict

    @functools.wraps(state_dict)
    def state_with_seen(self: Any) -> dict:
        state = state_dict(self)
        in_epoch = state["iterations_in_epoch"] > 0 or getattr(self, REST, None) is not None
        if in_epoch and state["epoch"] == self.epoch and self._cur_epoch_itr is not None \
                and standard(self):
            state[SEEN] = seen_state(trained_on(self))
        return state

    @functools.wraps(load_state_dict)
    def load_by_sentences(self: Any, state: dict) -> None:
        if SEEN not in state or not standard(self):
            return load_state_dict(self, state)
        seen = seen_from(state[SEEN], len(self.dataset))
        position = state.get("iterations_in_epoch", 0)
        batches = all_batches(self, state["epoch"], state.get("shuffle", True), False)
        skipped = batches[: position * self.num_shards]
        if position > 0 and len(skipped) == position * self.num_shards and \
                np.array_equal(mask_of(skipped, len(seen)), seen):
            return load_state_dict(self, state)  # fairseq skips exactly what was trained on
        return resume_rest(self, state, seen)

    state_with_seen._hybrid_seen = True
    EpochBatchIterator.state_dict = state_with_seen
    EpochBatchIterator.load_state_dict = load_by_sentences
