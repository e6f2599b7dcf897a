"""Sentence pairs that do not fit the batch limits (``--max-tokens``,
``--max-source-positions``, ``--max-target-positions``), named in one line.

fairseq skips the training pairs longer than a limit (with a warning), but every pair of a
validation (or test) split must fit: it stopped with ``AssertionError: Sentences lengths
should not exceed max_tokens``, ``Exception: Size of sample #16 is invalid`` (unless
``--skip-invalid-size-inputs-valid-test``, which skips pairs longer than the positions, not
than ``--max-tokens``), and a training split of which no pair fits with ``Exception: The
dataset is empty``.

- ``unfit_pairs_line``: the check itself, from the sizes of a split's sentences to the line
  (None when they fit), shared by every place that knows the sizes: the parse-time checks of
  hybrid_lstm (``checks.check_split_sizes``, read from the binarized index before any work:
  fairseq-train, fairseq-hydra-train, the advisor) and, for every model,
- ``one_line_size_errors``: fairseq's ``Trainer.get_train_iterator`` and
  ``get_valid_iterator``; when fairseq fails there and the sizes show why, its exception
  becomes the line. fairseq-generate's test split can use ``unfit_pairs_line`` the same way.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Tuple

import numpy as np
from fairseq import utils
from fairseq.trainer import Trainer

from ..errors import HybridConfigError

POSITIONS = ("--max-source-positions", "--max-target-positions")
SKIP = "--skip-invalid-size-inputs-valid-test"


def unfit_pairs_line(split: str, src_sizes: Sequence[int], tgt_sizes: Optional[Sequence[int]],
                     max_positions: Tuple[Optional[int], Optional[int]], max_tokens: Optional[int],
                     tokens_option: str = "--max-tokens", every_pair: bool = True,
                     skip_long: bool = False, tokens_hint: str = "") -> Optional[str]:
    """Why the pairs of ``split`` (e.g. "the 'valid' split in 'bin'") do not fit, or None.
    Sizes count tokens with the end-of-sentence token; ``max_positions``: (source,
    target), None for no limit. ``every_pair``: each pair must be used (validation, test;
    pairs longer than the positions may be skipped with ``skip_long``); else (training)
    pairs over any limit are skipped and only none fitting is an error."""
    src = np.asarray(src_sizes, dtype=np.int64)
    tgt = np.asarray(tgt_sizes, dtype=np.int64) if tgt_sizes is not None else np.zeros_like(src)
    if len(src) == 0:
        return None
    fits = np.ones(len(src), dtype=bool)
    for option, sizes, limit, side in zip(POSITIONS, (src, tgt), max_positions, ("source", "target")):
        if limit is None or tgt_sizes is None and side == "target":
            continue
        over = sizes > limit
        if over.all() and not every_pair:
            return (f"{option} {limit} is shorter than every {side} sentence of {split}: the "
                    f"shortest has {sizes.min()} tokens (with the end-of-sentence token); use "
                    f"{option} {sizes.min()} or more (training skips longer pairs)")
        if over.any() and every_pair and not skip_long:
            return (f"{option} {limit} is shorter than {over.sum()} of the {len(src)} {side} "
                    f"sentences of {split} (the longest has {sizes.max()} tokens, with the "
                    f"end-of-sentence token): use {option} {sizes.max()} or more, or leave such "
                    f"pairs out with {SKIP}")
        fits &= ~over
    tokens = np.maximum(src, tgt)  # fairseq's num_tokens of a pair
    if max_tokens is not None:
        over = tokens > max_tokens
        if every_pair and (over & fits).any():
            longest = int(tokens[fits].max())
            return (f"{tokens_option} {max_tokens} is smaller than {(over & fits).sum()} of the "
                    f"{len(src)} sentence pairs of {split}: the longest needs {longest} tokens (its "
                    f"longer side, with the end-of-sentence token); use {tokens_option} {longest} "
                    f"or more{tokens_hint.format(longest=longest)}")
        if not every_pair and over.all():
            return (f"{tokens_option} {max_tokens} is smaller than every sentence pair of {split}: "
                    f"the shortest needs {tokens.min()} (its longer side, with the end-of-sentence "
                    f"token); use {tokens_option} {tokens.min()} or more (typically thousands)")
        if not every_pair:
            fits &= ~over
    if not every_pair and not fits.any():
        limits = ", ".join(f"{option} {limit}" for option, limit in zip(POSITIONS, max_positions)
                           if limit is not None)
        return (f"no sentence pair of {split} fits {limits} and {tokens_option} {max_tokens} "
                "together: raise them (training skips the pairs longer than these limits)")
    return None


def pair_sizes(dataset: Any) -> Optional[Tuple[np.ndarray, Optional[np.ndarray]]]:
    """(source sizes, target sizes or None) of a sentence-pair dataset, else None."""
    src = getattr(dataset, "src_sizes", None)
    if src is None:
        return None
    return np.asarray(src), (None if getattr(dataset, "tgt_sizes", None) is None
                             else np.asarray(dataset.tgt_sizes))


def positions_pair(max_positions: Any) -> Optional[Tuple[Optional[int], Optional[int]]]:
    if isinstance(max_positions, (tuple, list)) and len(max_positions) == 2 and \
            all(p is None or isinstance(p, (int, np.integer)) for p in max_positions):
        return tuple(None if p is None else int(p) for p in max_positions)
    return None


def tokens_option_for_validation(cfg: Any) -> Tuple[str, str]:
    """The option that set the validation batches' token limit, and a hint for the other."""
    dataset = cfg.dataset
    if dataset.max_tokens_valid is not None and dataset.max_tokens_valid != dataset.max_tokens:
        return "--max-tokens-valid", ""
    return "--max-tokens", " (or --max-tokens-valid {longest} for the validation alone)"


def size_error(trainer: Any, subset: str, training: bool) -> Optional[str]:
    """The line for the split fairseq just failed to batch, when its sizes show why."""
    cfg = trainer.cfg
    try:
        sizes = pair_sizes(trainer.task.dataset(subset))
        positions = positions_pair(utils.resolve_max_positions(trainer.task.max_positions(),
                                                               trainer.model.max_positions()))
    except Exception:  # noqa: BLE001 - not a split of sentence pairs: fairseq's error stands
        return None
    if sizes is None or positions is None:
        return None
    if training:
        max_tokens, option, hint = cfg.dataset.max_tokens, "--max-tokens", ""
    else:
        max_tokens = cfg.dataset.max_tokens_valid
        option, hint = tokens_option_for_validation(cfg)
    split = f"the '{subset}' split in {str(cfg.task.data).split(':')[0]!r}"
    return unfit_pairs_line(split, sizes[0], sizes[1], positions, max_tokens, option,
                            every_pair=not training,
                            skip_long=cfg.dataset.skip_invalid_size_inputs_valid_test,
                            tokens_hint=hint)


def one_line_size_errors() -> None:
    """Wrap (once) the Trainer's train and validation iterators: see the module."""
    get_train_iterator, get_valid_iterator = Trainer.get_train_iterator, Trainer.get_valid_iterator
    if getattr(get_valid_iterator, "_hybrid_sizes", False):
        return

    @functools.wraps(get_train_iterator)
    def train_iterator(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return get_train_iterator(self, *args, **kwargs)
        except Exception as error:
            line = size_error(self, self.cfg.dataset.train_subset, training=True)
            if line is None:
                raise
            raise HybridConfigError(line) from error

    @functools.wraps(get_valid_iterator)
    def valid_iterator(self: Any, subset: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return get_valid_iterator(self, subset, *args, **kwargs)
        except Exception as error:
            line = size_error(self, subset, training=False)
            if line is None:
                raise
            raise HybridConfigError(line) from error

    valid_iterator._hybrid_sizes = True
    Trainer.get_train_iterator = train_iterator
    Trainer.get_valid_iterator = valid_iterator
