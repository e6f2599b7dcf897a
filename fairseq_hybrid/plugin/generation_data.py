"""The data directory of fairseq-generate and fairseq-interactive (``--task translation``, any
model), checked once the options are parsed: before fairseq-generate creates
``--results-path``, loads a model or reads a sentence (fairseq: a ``FileNotFoundError``, an
``AssertionError`` or a bare ``Exception`` later, an empty ``generate-<subset>.txt`` left).

- the directory exists and holds the dictionaries of the language pair (given, or inferred
  from the file names as fairseq does);
- fairseq-generate: the ``--gen-subset`` split exists for that pair and has sentences, and
  (fairseq's mmap format) its sentences fit ``--max-source-positions``,
  ``--max-target-positions`` and ``--max-tokens`` — or, with
  ``--skip-invalid-size-inputs-valid-test``, at least one does (fairseq would end with a
  ``ZeroDivisionError`` after translating nothing). The same one line as at run time
  (``sentence_limits.TooLong``); a model whose own limit is smaller (from its checkpoint) is
  caught there.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Optional, Tuple

import numpy as np
from fairseq.data import data_utils
from fairseq.data.indexed_dataset import MMapIndexedDataset, dataset_exists, infer_dataset_impl

from ..errors import HybridConfigError
from .sentence_limits import SKIP, TooLong

GENERATE_MAX_TOKENS = 12000  # fairseq-generate's when neither --max-tokens nor --batch-size is given


def language_pair(args: Any, folder: str) -> Tuple[str, str]:
    src, tgt = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    if src is None or tgt is None:
        src, tgt = data_utils.infer_language_pair(folder)
    if src is None or tgt is None:
        raise HybridConfigError(f"data directory {folder!r} names no language pair (no "
                                "<split>.<src>-<tgt>.* files): give --source-lang and --target-lang")
    return src, tgt


def split_prefix(folder: str, split: str, src: str, tgt: str, impl: Optional[str]) -> Optional[str]:
    """``DIR/split.src-tgt.`` (or ``.tgt-src.``) as fairseq's translation task looks it up."""
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = os.path.join(folder, f"{split}.{pair}.")
        if dataset_exists(prefix + src, impl=impl):
            return prefix
    return None


def index_sizes(path: str) -> Optional[np.ndarray]:
    """Sentence lengths (with end-of-sentence) of a binarized file in fairseq's mmap format,
    or None for another format (then fairseq checks at run time)."""
    if infer_dataset_impl(path) != "mmap":
        return None
    index = MMapIndexedDataset.Index(path + ".idx")
    sizes = np.array(index.sizes, dtype=np.int64)
    del index  # its __del__ closes the mmap the sizes live in
    return sizes


def check_generation_data(args: Any) -> None:
    """fairseq-generate / -interactive, once parsed: see the module's docstring."""
    data = getattr(args, "data", None)
    if getattr(args, "task", None) != "translation" or not data:
        return
    folder = data.split(os.pathsep)[0]
    if not os.path.isdir(folder):
        raise HybridConfigError(f"data directory {folder!r} does not exist: give the --destdir of "
                                "fairseq-preprocess (it holds the dictionaries and binarized splits)")
    src, tgt = language_pair(args, folder)
    for lang in (src, tgt):
        if not os.path.isfile(os.path.join(folder, f"dict.{lang}.txt")):
            raise HybridConfigError(f"data directory {folder!r} has no dict.{lang}.txt: give the "
                                    f"--destdir of fairseq-preprocess for {src}-{tgt}")
    if hasattr(args, "buffer_size"):  # fairseq-interactive reads its sentences from the input
        return
    split = getattr(args, "gen_subset", "test")
    prefix = split_prefix(folder, split, src, tgt, getattr(args, "dataset_impl", None))
    if prefix is None:
        found = sorted({os.path.basename(p).split(".")[0]
                        for p in glob.glob(os.path.join(folder, f"*.{src}-{tgt}.{src}.*"))
                        + glob.glob(os.path.join(folder, f"*.{tgt}-{src}.{src}.*"))})
        raise HybridConfigError(f"--gen-subset {split!r}: data directory {folder!r} has no {split!r} "
                                f"split for {src}-{tgt} (it has: {', '.join(found) or 'none'})")
    check_split_sizes(args, split, prefix, src, tgt)


def check_split_sizes(args: Any, split: str, prefix: str, src: str, tgt: str) -> None:
    src_sizes = index_sizes(prefix + src)
    if src_sizes is None:
        return
    if len(src_sizes) == 0:
        raise HybridConfigError(f"--gen-subset {split!r}: the split has no sentences ({prefix}{src} "
                                "is empty): nothing to translate")
    tgt_sizes = index_sizes(prefix + tgt) if dataset_exists(prefix + tgt, impl="mmap") else None
    max_source = getattr(args, "max_source_positions", None)
    if getattr(args, "truncate_source", False) and max_source:  # fairseq cuts them to the limit
        src_sizes = np.minimum(src_sizes, max_source)
    sides = [("source", "--max-source-positions", src_sizes, max_source)]
    if tgt_sizes is not None:
        sides.append(("target", "--max-target-positions", tgt_sizes,
                      getattr(args, "max_target_positions", None)))
    where, skip = f"of the {split!r} split", getattr(args, "skip_invalid_size_inputs_valid_test", False)
    fits = np.ones(len(src_sizes), dtype=bool)
    for side, option, sizes, limit in sides:
        over = np.flatnonzero(sizes > limit) if limit else np.empty(0, dtype=np.int64)
        if len(over) and not skip:
            raise HybridConfigError(TooLong(option, limit, f"{side} sentence", where, over.tolist(),
                                            sizes[over].tolist()).error())
        fits[over] = False
    tokens = src_sizes if tgt_sizes is None else np.maximum(src_sizes, tgt_sizes)
    max_tokens = getattr(args, "max_tokens", None)
    if max_tokens is None and getattr(args, "batch_size", None) is None:
        max_tokens = GENERATE_MAX_TOKENS
    over = np.flatnonzero(fits & (tokens > max_tokens)) if max_tokens else np.empty(0, dtype=np.int64)
    if len(over) and not skip:
        noun = "sentence pair" if tgt_sizes is not None else "sentence"
        raise HybridConfigError(TooLong("--max-tokens", max_tokens, noun, where, over.tolist(),
                                        tokens[over].tolist()).error())
    fits[over] = False
    if not fits.any():
        raise HybridConfigError(
            f"every sentence {where} is longer than --max-tokens, --max-source-positions or "
            f"--max-target-positions allow ({SKIP} would skip all {len(fits)}): nothing to "
            f"translate; raise them (the longest pair has {int(tokens.max())} tokens)")
