"""Checks of what a run is given — its data directory and checkpoint files — that turn
fairseq's tracebacks into one clear line naming the bad value, before any work starts.

``run_checks`` is the one list of parse-time checks: fairseq-train runs it from the
``--arch`` function (``hybrid_lstm.parse_time_checks``), fairseq-hydra-train from the Hydra
callback on the composed config (``hydra_callback.check_run_config``), so both refuse the
same input with the same line before anything is written.

- ``check_data_dir``: at parse time (fairseq-train): the directory exists and holds the
  language pair, the training split and (unless ``--disable-validation``) the validation
  splits asked for.
- ``check_training_sizes``: at parse time: the training split has sentences, and at least
  one pair fits in ``--max-tokens`` (fairseq would fail with ``cannot mmap an empty file`` or
  an ``IndexError`` in batch_by_size).
- ``check_precision``: ``--fp16`` without a CUDA device (fairseq fails deep inside
  torch.cuda); bfloat16 (``--bf16``) works on the CPU.
- ``check_generation_options``: fairseq-generate's options (any model) that fairseq's
  beam search cannot run, and a missing ``--path``; installed around fairseq's
  ``parse_args_and_arch`` (``fairseq_patches.checked_generation_options``).
- ``check_state_dict``: a checkpoint of another architecture or with another dictionary
  size is named as such, with the offending parameter and shapes.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl
from fairseq.file_io import PathManager
from torch import Tensor

from .checkpoints import check_restore_file
from .config import validate_model_config
from .criterion import validate_criterion_args
from .generation_data import check_generation_data
from .generation_options import check_generation_values
from ..errors import HybridConfigError
from .placement_options import check_plan_options


def run_checks(args: Any, argv: Optional[Sequence[str]] = None) -> Any:
    """Every parse-time check on ``args`` (fairseq-train's flat namespace, or the composed
    Hydra config's groups flattened into one); returns the placement plan.
    ``argv``: the command line ``check_plan_options`` reads (None: ``sys.argv``)."""

    validate_model_config(args)
    check_precision(args)
    check_data_dir(args)
    check_training_sizes(args)
    check_restore_file(args)
    plan = check_plan_options(args, argv=argv)
    validate_criterion_args(args)
    return plan


def check_data_dir(args: Any) -> None:
    data = getattr(args, "data", None)
    if not data:
        return
    first = data.split(os.pathsep)[0]
    if not os.path.isdir(first):
        raise HybridConfigError(
            f"data directory {first!r} does not exist: give the --destdir of fairseq-preprocess"
        )
    dictionaries = sorted(os.path.basename(p)[5:-4] for p in glob.glob(os.path.join(first, "dict.*.txt")))
    if not dictionaries:
        raise HybridConfigError(
            f"data directory {first!r} has no dict.*.txt: it is not fairseq-preprocess output"
        )
    for option, lang in (("--source-lang", getattr(args, "source_lang", None)),
                         ("--target-lang", getattr(args, "target_lang", None))):
        if lang and lang not in dictionaries:
            raise HybridConfigError(
                f"{option} {lang!r}: data directory {first!r} has no dict.{lang}.txt "
                f"(it holds: {', '.join(dictionaries)})"
            )
    subset = getattr(args, "train_subset", "train") or "train"
    if not glob.glob(os.path.join(first, f"{subset}.*")):
        raise HybridConfigError(
            f"data directory {first!r} has no '{subset}' split (no {subset}.* files)"
        )
    if getattr(args, "disable_validation", False):
        return
    valids = (getattr(args, "valid_subset", "valid") or "valid").split(",")
    for valid in ["valid"] if getattr(args, "combine_valid_subsets", False) else valids:
        if not glob.glob(os.path.join(first, f"{valid}.*")):  # fairseq: FileNotFoundError
            raise HybridConfigError(
                f"--valid-subset {valid!r}: data directory {first!r} has no '{valid}' split "
                f"(no {valid}.* files): binarize one (fairseq-preprocess --validpref), name "
                "another split, or train without validation (--disable-validation)"
            )


def _index_sizes(index_class: Any, path: str) -> np.ndarray:
    """A copy of an mmap index's sentence lengths, taken while the index (whose ``__del__``
    closes the mmap the lengths live in) is still alive."""
    index = index_class(path + ".idx")
    sizes = np.array(index.sizes, dtype=np.int64)
    del index
    return sizes


def _pair_sizes(first: str, subset: str, args: Any) -> Optional[Tuple[str, np.ndarray]]:
    """(prefix, longer side's length per pair incl. end-of-sentence) of the ``subset`` split
    in fairseq's mmap format, or None when it cannot be read that way (then fairseq decides)."""

    src, tgt = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    # DIR/train.en-de.en.idx -> prefix DIR/train.en-de, language en
    found = [path[: -len(".idx")].rsplit(".", 1)
             for path in glob.glob(os.path.join(first, f"{subset}.*-*.*.idx"))]
    for prefix in sorted({prefix for prefix, _ in found}):
        langs = sorted(lang for p, lang in found if p == prefix)
        if src and tgt:
            if sorted([src, tgt]) != langs:
                continue
        paths = [f"{prefix}.{lang}" for lang in langs]
        if langs and all(infer_dataset_impl(path) == "mmap" for path in paths):
            sizes = [_index_sizes(MMapIndexedDataset.Index, path) for path in paths]
            if len({len(s) for s in sizes}) == 1:
                return prefix, np.maximum.reduce(sizes)
    return None


def check_training_sizes(args: Any) -> None:
    data = getattr(args, "data", None)
    if not data or not os.path.isdir(data.split(os.pathsep)[0]):
        return
    first = data.split(os.pathsep)[0]
    subset = getattr(args, "train_subset", "train") or "train"
    found = _pair_sizes(first, subset, args)
    if found is None:
        return
    prefix, longer = found
    if len(longer) == 0:
        raise HybridConfigError(
            f"the '{subset}' split in {first!r} has no sentences ({os.path.basename(prefix)}.* "
            "are empty): check the --trainpref files given to fairseq-preprocess"
        )
    max_tokens = getattr(args, "max_tokens", None)
    if max_tokens and int(longer.min()) > max_tokens:
        raise HybridConfigError(
            f"--max-tokens {max_tokens} is smaller than every training sentence pair: the "
            f"shortest needs {int(longer.min())} (its longer side, with the end-of-sentence "
            f"token); use --max-tokens {int(longer.min())} or more (typically thousands)"
        )


def check_precision(args: Any) -> None:
    for option in ("fp16", "memory_efficient_fp16"):
        if getattr(args, option, False) and not torch.cuda.is_available():
            raise HybridConfigError(
                f"--{option.replace('_', '-')} needs a CUDA GPU and torch sees none: use --bf16 "
                "(bfloat16, works on the CPU) or drop it (float32)"
            )


def check_generation_options(args: Any) -> None:
    """fairseq-generate/-interactive/-validate, any model: once parsed, refuse what fairseq
    itself cannot run (its failures are a reshape error, an AssertionError, an OSError or an
    AttributeError, after ``--results-path`` was created): ``--beam`` < 1, a longest output
    (``--max-len-a`` x source length + ``--max-len-b``) that can never reach ``--min-len``,
    ``--temperature`` <= 0, ``--sampling`` with ``--nbest`` other than ``--beam``, ``--nbest``
    outside 1 .. ``--beam`` (fairseq prints fewer without a word), fairseq-interactive's
    ``--batch-size`` above its ``--buffer-size``, the values of
    ``generation_options.check_generation_values``, and a
    ``--path`` that is missing or a directory (looked up as fairseq will: ``--checkpoint-
    suffix``, shards); then the data directory (``generation_data.check_generation_data``).
    A negative ``--max-len-b`` with ``--max-len-a`` > 0 depends on the source lengths:
    fairseq's to decide."""
    if hasattr(args, "beam"):
        beam = args.beam
        if beam is not None and beam < 1:
            raise HybridConfigError(f"--beam {beam} is not allowed: an integer >= 1 (hypotheses "
                                    "kept per step; 1 = greedy search)")
        a, b = getattr(args, "max_len_a", 0) or 0, getattr(args, "max_len_b", 200)
        min_len = getattr(args, "min_len", 1)
        if not getattr(args, "match_source_len", False) and a <= 0 and b < min_len:
            raise HybridConfigError(
                f"--max-len-b {b} is not allowed with --max-len-a {a:g} and --min-len {min_len}: "
                "no output could be long enough (outputs end by --max-len-a x source length + "
                f"--max-len-b tokens); use --max-len-b >= {min_len} (the default is 200) or "
                "--max-len-a > 0"
            )
        temperature = getattr(args, "temperature", 1.0)
        if temperature is not None and not temperature > 0:
            raise HybridConfigError(f"--temperature {temperature:g} is not allowed: a number > 0")
        nbest = getattr(args, "nbest", 1)
        if getattr(args, "sampling", False) and nbest != beam:
            raise HybridConfigError(f"--nbest {nbest} is not allowed with --sampling and --beam "
                                    f"{beam}: --sampling needs --nbest equal to --beam")
        if nbest is not None and nbest < 1:
            raise HybridConfigError(f"--nbest {nbest} is not allowed: an integer >= 1 (hypotheses "
                                    "printed per sentence, at most --beam)")
        if nbest is not None and nbest > beam:  # fairseq would print --beam of them, silently
            raise HybridConfigError(
                f"--nbest {nbest} is not allowed with --beam {beam}: the search keeps only --beam "
                f"hypotheses per sentence; use --nbest {beam} or less, or --beam {nbest} or more")
        buffer, batch = getattr(args, "buffer_size", None), getattr(args, "batch_size", None)
        if buffer is not None and batch is not None and batch > max(buffer, 1):  # an AssertionError
            raise HybridConfigError(
                f"--batch-size {batch} is not allowed with --buffer-size {buffer}: fairseq-interactive "
                f"batches the lines of one buffer; use --buffer-size {batch} or more")
        check_generation_values(args)
        if not getattr(args, "path", None):
            raise HybridConfigError("--path is required: the checkpoint to translate with, e.g. "
                                    "--path checkpoints/checkpoint_best.pt")
    if getattr(args, "path", None):
        check_checkpoint_paths(args)
    if hasattr(args, "beam"):
        check_generation_data(args)


def check_checkpoint_paths(args: Any) -> None:

    suffix = getattr(args, "checkpoint_suffix", "") or ""
    shards = getattr(args, "checkpoint_shard_count", 1) or 1
    for given in utils.split_paths(args.path):
        for shard in range(shards):
            path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(given, suffix, shard, shards)
            named = f"--path {given!r}" + (f" ({path!r})" if path != given else "")
            if os.path.isdir(path):
                raise HybridConfigError(f"{named} is a directory, not a fairseq checkpoint file: "
                                        "give a file in it, e.g. checkpoint_best.pt")
            if not PathManager.exists(path):
                raise HybridConfigError(
                    f"{named} does not exist: give a checkpoint file fairseq-train wrote, e.g. "
                    "checkpoints/checkpoint_best.pt (relative to the current directory)"
                )


def check_state_dict(expected: Mapping[str, Tensor], given: Mapping[str, Tensor]) -> None:
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        raise HybridConfigError(
            "the checkpoint does not fit hybrid_lstm with these options (another --arch, or "
            f"other layer counts?): missing {missing[:3]}{' ...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{' ...' if len(unexpected) > 3 else ''}"
        )
    for name, tensor in expected.items():
        shape, given_shape = tuple(tensor.shape), tuple(given[name].shape)
        if shape != given_shape:
            hint = ""
            if "embed_tokens" in name or "output_proj" in name:
                hint = (
                    f" (a dictionary of {given_shape[0]} entries in the checkpoint, "
                    f"{shape[0]} in the data directory: was it binarized with another dictionary?)"
                )
            raise HybridConfigError(
                f"the checkpoint's {name} is {list(given_shape)}, this model's is "
                f"{list(shape)}{hint}"
            )
