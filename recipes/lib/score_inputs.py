"""What score.py and wmt_score.py are given, read and checked before any work: the
fairseq-generate output, the reference (and source) text, ``--show``, ``--extra`` and the
``--json`` to write. A bad one ends the script with one line naming it and what is allowed
(exit status 1) before anything is written.

Text files are read as UTF-8 (a leading byte-order mark dropped), one entry per
``\\n``-terminated line; a ``\\r`` inside a line is a space (universal newlines would split a
line at it and shift every later reference).
Hypotheses are the ``D-`` lines (detokenized by ``--remove-bpe``) put back in corpus order;
every reference line must have exactly one.
"""
from __future__ import annotations

import argparse
import codecs
import collections
import json
import os
import sys
from typing import NoReturn, Optional, Sequence


def fail(message: str) -> NoReturn:
    """Exit with status 1 and ``<script>: error: message`` as the only line."""
    sys.exit(f"{os.path.basename(sys.argv[0]) or 'score.py'}: error: {message}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (a missing or malformed option) are one line too."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")


def read_text(path: str, option: str) -> str:
    """The whole of ``path`` as UTF-8 text; one line naming ``option`` when it is missing,
    a directory, unreadable, or not UTF-8 (with the line the first bad byte is on)."""
    if not os.path.exists(path):
        fail(f"{option} {path!r} does not exist")
    if os.path.isdir(path):
        fail(f"{option} {path!r} is a directory: give a text file")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        fail(f"{option} {path!r} cannot be read: {error.strerror}")
    if data.startswith(codecs.BOM_UTF8):  # an editor's byte-order mark is not part of line 1
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        fail(f"{option} {path!r} is not UTF-8 text: line {line} has the byte "
             f"0x{data[error.start]:02x}; convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def split_lines(text: str) -> list[str]:
    """One entry per ``\\n``-terminated line (a last line without ``\\n`` counts too)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.replace("\r", " ").rstrip(" ") for line in lines]


def read_lines(path: str, option: str = "--reference") -> list[str]:
    return split_lines(read_text(path, option))


def read_reference(path: str) -> list[str]:
    references = read_lines(path, "--reference")
    if not references:
        fail(f"--reference {path!r} is empty: give the test set's target side, one sentence a line")
    return references


def read_source(path: Optional[str], show: int, references: int) -> list[str]:
    """``--source``'s lines (only read when ``--show`` asks for examples): as many as the
    reference has."""
    if show < 0:
        fail(f"--show {show} is not allowed: the number of example translations to print, >= 0")
    if not show:
        return []
    if path is None:
        fail(f"--show {show} needs --source (the test set's source side) to print examples")
    sources = read_lines(path, "--source")
    if len(sources) != references:
        fail(f"--source {path!r} has {len(sources)} line(s) but the reference has {references}: "
             "give the source side of the same test set")
    return sources


def parse_hypothesis(line: str, number: int, path: str) -> tuple[int, str]:
    """(sentence id, text) of a ``D-<id>\\t<score>\\t<text>`` line."""
    fields = line.split("\t", 2)
    ident = fields[0][2:]
    if len(fields) < 3 or not ident.isdigit():
        fail(f"--generate-output {path!r} line {number} is not a fairseq-generate hypothesis "
             f"(D-<id>, score, text separated by tabs): {line[:60]!r}")
    return int(ident), fields[2].replace("\r", " ")


def read_hypotheses(path: str, expected: int) -> list[str]:
    """The ``D-`` lines of fairseq-generate output ``path`` in id order; exits with one line
    unless they are exactly ids 0 .. expected-1, each once (``expected``: the reference's
    line count): several consecutive ones per id are --nbest output, an id repeated later
    the output of two runs, a surplus hypothesis a reference of another test set."""
    hypotheses: dict[int, str] = {}
    ids: list[int] = []  # the id of each D- line, in file order
    for number, line in enumerate(read_text(path, "--generate-output").split("\n"), start=1):
        if line.startswith("D-"):
            index, text = parse_hypothesis(line, number, path)
            ids.append(index)
            hypotheses.setdefault(index, text)  # the first of an id's lines is its best
    if not hypotheses:
        fail(f"--generate-output {path!r} has no D- lines: give fairseq-generate's output (its "
             "stdout, or generate-<subset>.txt of --results-path)")
    runs = [index for k, index in enumerate(ids) if k == 0 or ids[k - 1] != index]
    repeated = sorted({i for i, n in collections.Counter(runs).items() if n > 1})
    if repeated:
        fail(f"--generate-output {path!r} has {len(repeated)} duplicated hypothesis id(s) (first: "
             f"{repeated[:5]}): the output of more than one fairseq-generate run?")
    if len(ids) > len(runs):
        most = max(collections.Counter(ids).values())
        fail(f"--generate-output {path!r} has up to {most} hypotheses per sentence (fairseq-generate "
             f"--nbest {most}): score the output of a run with --nbest 1 (the default), whose one "
             "hypothesis per sentence is the best")
    surplus = sorted(i for i in hypotheses if not 0 <= i < expected)
    if surplus:
        fail(f"--generate-output {path!r} has {len(hypotheses)} hypotheses but the reference has "
             f"{expected} lines (ids beyond it: {surplus[:5]}): is the reference of another test set?")
    missing = [i for i in range(expected) if i not in hypotheses]
    if missing:
        fail(f"{len(missing)} of {expected} sentences have no hypothesis in {path!r} "
             f"({len(hypotheses)} hypotheses for a {expected}-line reference; first missing: "
             f"{missing[:5]}): fairseq-generate was interrupted, skipped them (its warnings about "
             "--skip-invalid-size-inputs-valid-test), or ran without --user-dir fairseq_hybrid "
             "and without --required-batch-size-multiple 1 (fairseq #5036)")
    return [hypotheses[i] for i in range(expected)]


def extra_fields(text: str, reserved: Sequence[str]) -> dict:
    """``--extra``: a JSON object whose keys are not ones the script writes itself."""
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"--extra {text[:80]!r} is not JSON ({error.msg} at character {error.pos}): give a "
             "JSON object, e.g. '{\"model\": \"hybrid_lstm\"}'")
    if not isinstance(extra, dict):
        fail(f"--extra {text[:80]!r} is a JSON {type(extra).__name__}, not an object: give e.g. "
             "'{\"model\": \"hybrid_lstm\"}'")
    clash = sorted(set(extra) & set(reserved))
    if clash:
        fail(f"--extra sets {clash[0]!r}, which the script writes itself (its keys: "
             f"{', '.join(reserved)}): use another name")
    return extra


def check_json_path(path: str, inputs: Sequence[Optional[str]]) -> None:
    """``--json`` can be written: not a directory, not one of the inputs, and its directory
    is (or can be made) a writable directory."""
    if path.endswith(os.sep) or os.path.isdir(path):
        fail(f"--json {path!r} is a directory: give the file to write, e.g. {os.path.join(path, 'bleu.json')!r}")
    for given in inputs:
        if given and os.path.exists(path) and os.path.exists(given) and os.path.samefile(path, given):
            fail(f"--json {path!r} is also an input ({given!r}): give another file to write")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        fail(f"--json {path!r} cannot be written: {existing!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"--json {path!r} cannot be written: no write permission in {existing!r}")
