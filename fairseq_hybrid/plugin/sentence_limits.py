"""Sentences longer than a run's limits, for every model and fairseq tool: one line naming
the limit and what to do, instead of fairseq's traceback or its bare warning.

fairseq limits a sentence two ways when it batches a split (``FairseqTask.
get_batch_iterator``): ``max_positions`` (the task's ``--max-source-positions`` /
``--max-target-positions``, and the model's own from its checkpoint) and ``--max-tokens`` (a
batch holds whole sentences). Over the first it raises ``Exception: Size of sample #16 is
invalid``, over the second ``AssertionError: Sentences lengths should not exceed
max_tokens``; with ``ignore_invalid_inputs`` (``--skip-invalid-size-inputs-valid-test``; the
training split always) it skips the first with ``N samples have invalid sizes`` but still
fails on the second (except on the training split, whose limit fairseq's Trainer already caps
at ``--max-tokens``).

- ``limited_batches`` (installed by ``fairseq_patches.apply``): either failure becomes one
  line (``SentencesTooLong``: which limit, how many sentences, the longest, what to do);
  where invalid inputs are ignored, sentences longer than ``--max-tokens`` are skipped like
  those over ``max_positions``, with one warning line naming the limit.
- ``skip_overlong_lines``: fairseq-interactive ignores invalid inputs, so one over-long line
  is skipped with that warning instead of ending the session (any model).
- ``TooLong``: the one line, shared with the parse-time check of fairseq-generate's
  split (``generation_data.check_generation_split``).
"""
from __future__ import annotations

import contextvars
import dataclasses
import logging
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from fairseq import utils
from fairseq.tasks import FairseqTask

from ..errors import HybridConfigError
from .batch_iterator import wrap_get_batch_iterator

logger = logging.getLogger(__name__)
SKIP = "--skip-invalid-size-inputs-valid-test"
SIDES = ("source", "target")
_max_tokens: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("max_tokens", default=None)


class SentencesTooLong(HybridConfigError):
    """Sentences no batch can hold (fairseq's ``Exception``/``AssertionError``), as one line."""


@dataclasses.dataclass
class TooLong:
    """Sentences over one limit: ``option`` (``--max-tokens``, ``--max-source-positions``, or
    words for a limit no option sets) at ``limit``; which they are (``noun``, e.g. "source
    sentence", ``where``, e.g. "of the 'test' split"), their ids and lengths (with the
    end-of-sentence token); ``example``: the first one's text (fairseq-interactive)."""

    option: str
    limit: int
    noun: str
    where: str
    ids: Sequence[int]
    lengths: Sequence[int]
    default: Optional[int] = None
    example: str = ""

    @property
    def longest(self) -> int:
        return int(max(self.lengths))

    def _which(self) -> str:
        count = len(self.ids)
        return f"{count} {self.noun}{'s' if count > 1 else ''} {self.where}"

    def error(self) -> str:
        if self.option.startswith("--"):
            advice = (f"use {self.option} {self.longest} or more"
                      + (f" (the default is {self.default})" if self.default is not None else "")
                      + f", or skip them with {SKIP}")
        else:
            advice = f"skip them with {SKIP}, or translate with a model trained for longer sentences"
        return (f"{self.option} {self.limit} is smaller than {self._which()} (the longest has "
                f"{self.longest} tokens with the end-of-sentence token; first: sentence "
                f"{int(self.ids[0])}): {advice}")

    def warning(self) -> str:
        shown = f" ({self.example!r})" if self.example else f" (first: sentence {int(self.ids[0])})"
        advice = (f"; raise {self.option} to {self.longest} to translate "
                  f"{'it' if len(self.ids) == 1 else 'them'}" if self.option.startswith("--") else "")
        return (f"skipped {self._which()}{shown}: longer than {self.option} {self.limit} allows "
                f"(the longest has {self.longest} tokens with the end-of-sentence token){advice}")


def _positions(value: Any, sides: int) -> Tuple[Optional[int], ...]:
    """A max_positions value (None, a number or a tuple) as one limit per side."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,) * sides


def _split_name(task: Any, dataset: Any) -> Optional[str]:
    """The name of the task's split ``dataset`` is, or None (fairseq-interactive's input)."""
    return next((name for name, known in getattr(task, "datasets", {}).items() if known is dataset), None)


def _where(task: Any, dataset: Any) -> str:
    name = _split_name(task, dataset)
    return "of the input" if name is None else f"of the {name!r} split"


def _whole_sentences(dataset: Any) -> str:
    """What ``--max-tokens`` counts: a pair's longer side, or a sentence without a target."""
    return "sentence pair" if getattr(dataset, "tgt", None) is not None else "sentence"


def _sizes(dataset: Any, index: int) -> Tuple[int, ...]:
    size = dataset.size(index)
    return tuple(int(s) for s in size) if isinstance(size, (tuple, list)) else (int(size),)


def broken_limit(task: Any, sizes: Tuple[int, ...], max_positions: Any,
                 max_tokens: Optional[int]) -> Tuple[str, int, int, str]:
    """(option, its value, the length over it, what the sentence is) for a sentence of ``sizes``
    (one per side) that ``max_positions`` (after any ``max_tokens`` cap) refused."""
    if max_tokens and max(sizes) > max_tokens:
        return "--max-tokens", int(max_tokens), max(sizes), ""  # the caller names them
    limits, task_limits = _positions(max_positions, len(sizes)), _positions(task.max_positions(), len(sizes))
    for side, (length, limit, task_limit) in enumerate(zip(sizes, limits, task_limits)):
        if limit is not None and length > limit:
            name = SIDES[side] if len(sizes) == 2 else "input"
            if task_limit is None or task_limit > limit:  # the model's, from its checkpoint
                return f"the checkpoint's limit of {name} tokens", int(limit), length, f"{name} sentence"
            option = f"--max-{name}-positions" if len(sizes) == 2 else "the task's limit of tokens"
            return option, int(limit), length, f"{name} sentence"
    return "max_positions", 0, max(sizes), "sentence"  # pragma: no cover - fairseq refused it


def too_long(task: Any, dataset: Any, ignored: Sequence[int], max_positions: Any,
             max_tokens: Optional[int]) -> TooLong:
    """The ``ignored`` sentences that broke the limit the first one broke."""
    broken = [(int(i), broken_limit(task, _sizes(dataset, i), max_positions, max_tokens)) for i in ignored]
    option, limit, _, what = broken[0][1]
    what = what or _whole_sentences(dataset)
    same = sorted((i, length) for i, (opt, _, length, _) in broken if opt == option)
    return TooLong(option, limit, what, _where(task, dataset), [i for i, _ in same],
                   [length for _, length in same], example=_example(task, dataset, same[0][0]))


def _example(task: Any, dataset: Any, index: int) -> str:
    """The text of sentence ``index`` of an inference dataset (fairseq-interactive's line)."""
    if _split_name(task, dataset) is not None:
        return ""
    try:
        text = task.source_dictionary.string(dataset.src[index])
    except (AttributeError, IndexError, TypeError, NotImplementedError):
        return ""
    return text if len(text) <= 60 else text[:57] + "..."


def filter_indices_by_size(self: Any, indices: np.ndarray, dataset: Any, max_positions: Any = None,
                           ignore_invalid_inputs: bool = False) -> np.ndarray:
    """``FairseqTask.filter_indices_by_size`` with a one-line error or warning."""
    indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
    if len(ignored) == 0:
        return indices
    found = too_long(self, dataset, ignored, max_positions, _max_tokens.get())
    if not ignore_invalid_inputs:
        raise SentencesTooLong(found.error())
    if len(indices) == 0 and _split_name(self, dataset):  # fairseq: a ZeroDivisionError later
        raise SentencesTooLong(
            f"every sentence {found.where} is skipped ({SKIP}): the first is longer than "
            f"{found.option} {found.limit} allows ({found.lengths[0]} tokens with the "
            "end-of-sentence token); raise the limit")
    logger.warning(found.warning())
    return indices


def tokens_error(task: Any, dataset: Any, max_tokens: int) -> str:
    """The one line for sentences longer than ``max_tokens`` (fairseq's AssertionError)."""
    everything = np.arange(len(dataset), dtype=np.int64)
    try:
        lengths = np.asarray(dataset.num_tokens_vec(everything))
    except NotImplementedError:
        lengths = np.array([dataset.num_tokens(i) for i in everything])
    ids = np.flatnonzero(lengths > max_tokens)
    return TooLong("--max-tokens", max_tokens, _whole_sentences(dataset), _where(task, dataset),
                   ids.tolist(), lengths[ids].tolist()).error()


def limited_batches() -> None:
    """Wrap (once) ``FairseqTask.get_batch_iterator`` and ``filter_indices_by_size``: see
    the module's docstring."""
    wrap_get_batch_iterator("_hybrid_limited", batches_within_limits)
    FairseqTask.filter_indices_by_size = filter_indices_by_size


def batches_within_limits(original: Callable[..., Any], task: Any, dataset: Any,
                          given: Dict[str, Any]) -> Any:
    max_tokens = given["max_tokens"]
    if given["ignore_invalid_inputs"] and max_tokens and given["max_positions"] is not None:
        given["max_positions"] = utils.resolve_max_positions(given["max_positions"], max_tokens)
    token = _max_tokens.set(max_tokens)
    try:
        return original(**given)
    except AssertionError as error:
        if not (max_tokens and "should not exceed max_tokens" in str(error)):
            raise
        raise SentencesTooLong(tokens_error(task, dataset, max_tokens)) from error
    finally:
        _max_tokens.reset(token)


def skip_overlong_lines(args: Any) -> None:
    """fairseq-interactive (its parser has ``--buffer-size``): skip over-long lines."""
    if hasattr(args, "buffer_size") and hasattr(args, "skip_invalid_size_inputs_valid_test"):
        args.skip_invalid_size_inputs_valid_test = True
