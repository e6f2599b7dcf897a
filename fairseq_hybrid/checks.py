"""Checks of what a run is given — its data directory and checkpoint files — that turn
fairseq's tracebacks into one clear line naming the bad value, before any work starts.

- ``check_data_dir``: at parse time (fairseq-train): the directory exists and holds the
  language pair and the training split asked for.
- ``readable_checkpoints``: wraps fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` so
  a truncated file or a file that is not a checkpoint (``--path``, ``--restore-file``)
  fails with one line instead of an unpickling traceback.
- ``check_state_dict``: a checkpoint of another architecture or with another dictionary
  size is named as such, with the offending parameter and shapes.
- ``skip_overlong_interactive_input``: fairseq-interactive skips (with fairseq's warning)
  a line longer than --max-source-positions instead of crashing on it.
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import sys
from typing import Any, Mapping

from torch import Tensor

from .errors import HybridConfigError

logger = logging.getLogger(__name__)


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


def readable_checkpoints() -> None:
    """Install the wrapper (once) around fairseq's checkpoint loading."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        if not os.path.isfile(path):
            return original(path, *args, **kwargs)  # fairseq's own "not found" handling
        try:
            state = original(path, *args, **kwargs)
        except HybridConfigError:
            raise
        except Exception as error:  # unpickling, zip, EOF, missing keys ...
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise HybridConfigError(
                f"{path!r} is not a readable fairseq checkpoint (truncated, or another kind "
                f"of file): {type(error).__name__}: {reason[:200]}"
            ) from None
        if not isinstance(state, dict) or "model" not in state:
            raise HybridConfigError(f"{path!r} is not a fairseq checkpoint: it holds no model weights")
        return state

    load_checkpoint_to_cpu._hybrid_checked = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


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


def skip_overlong_interactive_input(cfg: Any) -> None:
    """In fairseq-interactive one over-long input line would end the whole session with
    an exception; skip it instead (fairseq logs which). Batch tools keep failing loudly."""
    if "interactive" not in os.path.basename(sys.argv[0] if sys.argv else ""):
        return
    dataset = getattr(cfg, "dataset", None)
    if dataset is not None and not dataset.skip_invalid_size_inputs_valid_test:
        dataset.skip_invalid_size_inputs_valid_test = True
        logger.info("fairseq-interactive: lines longer than --max-source-positions are "
                    "skipped with a warning")
