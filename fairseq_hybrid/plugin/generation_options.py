"""More of fairseq-generate's and fairseq-interactive's options that fairseq accepts and then
fails on, deep inside the run (any model), checked once parsed by
``checks.check_generation_options``:

- batching: ``--max-tokens``/``--batch-size`` below 1 (fairseq reads them as "no limit"),
  ``--required-batch-size-multiple`` below 1 (a division by zero that kills the process with
  SIGFPE), ``--num-workers`` below 0 (a ``ValueError`` from torch's DataLoader);
- ``--max-len-a`` below 0 (every longer source ends in fairseq's ``AssertionError: min_len
  cannot be larger than max_len``); ``--diverse-beam-groups`` that does not divide ``--beam``
  (a ``ValueError``);
- ``--model-overrides`` that is not a Python dict literal (a ``SyntaxError`` once the run has
  started);
- ``--replace-unk``: fairseq reads the value it stores for a bare ``--replace-unk`` (``'@@ '``)
  as an alignment file name, and fairseq-generate needs a raw-text dataset for it;
- ``--results-path`` (fairseq-generate) naming a file, or a directory that cannot be made;
  ``--input`` (fairseq-interactive) missing, a directory, or not UTF-8 text (fairseq read it
  line by line and failed at the first bad byte, after translating the lines before it).

And fairseq-interactive reading standard input takes a byte that is not UTF-8 as an unknown
character (U+FFFD, translated as ``<unk>`` like any character the model does not know)
instead of ending the session with a ``UnicodeDecodeError`` (``tolerant_stdin``, installed by
``fairseq_patches.checked_generation_options``; Python reads standard input strictly in most
UTF-8 locales).
"""
from __future__ import annotations

import ast
import codecs
import os
import sys
from typing import Any

from ..errors import HybridConfigError, require

REPLACE_UNK_PLACEHOLDER = "@@ "  # fairseq's argparse_const for a bare --replace-unk


def check_batching(args: Any) -> None:
    for option, name in (("--max-tokens", "max_tokens"), ("--batch-size", "batch_size")):
        value = getattr(args, name, None)
        require(value is None or value >= 1, option, value,
                "an integer >= 1, or leave it out (fairseq reads values below 1 as no limit)")
    multiple = getattr(args, "required_batch_size_multiple", 1)
    require(multiple is None or multiple >= 1, "--required-batch-size-multiple", multiple,
            "an integer >= 1 (1: any batch size)")
    workers = getattr(args, "num_workers", 0)
    require(workers is None or workers >= 0, "--num-workers", workers,
            "an integer >= 0 (0: load the data in the main process)")


def check_search(args: Any) -> None:
    max_len_a = getattr(args, "max_len_a", 0)
    require(max_len_a is None or max_len_a >= 0, "--max-len-a", max_len_a,
            "a number >= 0 (outputs end after --max-len-a x source length + --max-len-b tokens)")
    groups, beam = getattr(args, "diverse_beam_groups", -1), args.beam
    if groups is not None and groups > 0 and beam % groups:
        raise HybridConfigError(f"--diverse-beam-groups {groups} is not allowed with --beam {beam}: "
                                f"--beam must be a multiple of it (e.g. --beam {groups * max(1, beam // groups)})")
    overrides = getattr(args, "model_overrides", "{}")
    try:
        parsed = ast.literal_eval(overrides) if isinstance(overrides, str) else overrides
    except (ValueError, SyntaxError):
        parsed = None
    if not isinstance(parsed, dict):
        raise HybridConfigError(f"--model-overrides {overrides!r} is not allowed: a Python dict "
                                "literal, e.g. \"{'hybrid_devices': 'cuda:0,cuda:1'}\"")


def check_replace_unk(args: Any, interactive: bool) -> None:
    given = getattr(args, "replace_unk", None)
    if given is None:
        return
    if given == REPLACE_UNK_PLACEHOLDER:
        raise HybridConfigError("--replace-unk needs an alignment dictionary file here (fairseq 0.12 "
                                "reads a bare --replace-unk as the file name '@@ '): --replace-unk FILE")
    if not os.path.isfile(given):
        raise HybridConfigError(f"--replace-unk {given!r} does not exist: give an alignment "
                                "dictionary file (source word, target word per line)")
    if not interactive and getattr(args, "dataset_impl", None) != "raw":
        raise HybridConfigError("--replace-unk is not allowed with binarized data: fairseq-generate "
                                "needs the source text (--dataset-impl raw)")


def check_results_path(args: Any) -> None:
    results = getattr(args, "results_path", None)
    if not results:
        return
    if os.path.exists(results) and not os.path.isdir(results):
        raise HybridConfigError(f"--results-path {results!r} is a file: give a directory "
                                "(fairseq-generate writes generate-<subset>.txt into it)")
    existing = os.path.abspath(results)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise HybridConfigError(f"--results-path {results!r} cannot be written: {existing!r} is "
                                "not a writable directory")


def check_input_file(args: Any) -> None:
    """fairseq-interactive's ``--input`` ('-': standard input, not checked)."""
    given = getattr(args, "input", "-")
    if given in (None, "-"):
        return
    if not os.path.exists(given):
        raise HybridConfigError(f"--input {given!r} does not exist: give a text file, or - (the "
                                "default) to read standard input")
    if os.path.isdir(given):
        raise HybridConfigError(f"--input {given!r} is a directory: give a text file, or -")
    decoder, line = codecs.getincrementaldecoder("utf-8")(), 1
    with open(given, "rb") as handle:
        for chunk in [*iter(lambda: handle.read(1 << 20), b""), b""]:  # b"": the end
            data = decoder.getstate()[0] + chunk  # what decode() reads: a split character, then chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                line += data[: error.start].count(b"\n")
                raise HybridConfigError(
                    f"--input {given!r} is not UTF-8 text: line {line} has the byte "
                    f"0x{data[error.start]:02x}; convert it (e.g. iconv -f latin1 -t utf-8)") from None
            line += chunk.count(b"\n")


def tolerant_stdin(args: Any) -> None:
    """fairseq-interactive (its parser has ``--buffer-size``) reading standard input."""
    if hasattr(args, "buffer_size") and getattr(args, "input", "-") == "-" and hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")


def check_generation_values(args: Any) -> None:
    """The checks above, for fairseq-generate (``--results-path``) or -interactive (its
    parser has ``--buffer-size``)."""
    interactive = hasattr(args, "buffer_size")
    check_batching(args)
    check_search(args)
    check_replace_unk(args, interactive)
    if interactive:
        check_input_file(args)
    else:
        check_results_path(args)
