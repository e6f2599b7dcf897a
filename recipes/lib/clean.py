"""Cleaning parallel text for the WMT recipes.

    python recipes/lib/clean.py text --src IN.en --tgt IN.de --out-prefix OUT \
        [--filter --max-words 80 --max-ratio 1.5 --stats stats.json]
    python recipes/lib/clean.py subwords --src IN.en --tgt IN.de --out-prefix OUT \
        [--max-subwords 250 --stats stats.json]

``text`` normalises punctuation with sacremoses (Moses' normalize-punctuation.perl), turns
every non-printing character (Unicode category C: ``\r``, tabs, zero-width spaces, ...) into
a space as Moses' remove-non-printing-char.perl does (fairseq's WMT recipes run both) and,
with ``--filter`` (training data only; dev and test keep every line), drops empty pairs,
pairs with a side longer than ``--max-words`` words, pairs whose word-length ratio is above
``--max-ratio``, and repeated pairs. ``subwords`` drops sentencepiece-encoded pairs with a
side longer than ``--max-subwords`` pieces. Both print how many pairs were kept and why the
others were dropped (and write it to ``--stats``); outputs are renamed into place at the end.

Lines end at ``\n`` only (files are opened with ``newline="\n"``): with Python's universal
newlines a ``\r`` inside a line would split it and pair every later line with the wrong one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections import Counter
from typing import Callable, Dict, Optional, Tuple

import regex
from tqdm import tqdm

NON_PRINTING = regex.compile(r"\p{C}")  # remove-non-printing-char.perl: s/\p{C}/ /g
SPACES = regex.compile(r" {2,}")


def count_lines(path: str) -> int:
    """Lines as ``open(path, newline="\n")`` yields them (a last line without ``\n`` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def printable(text: str) -> str:
    """Every non-printing character (``\r`` included) as a space, runs of spaces as one."""
    return SPACES.sub(" ", NON_PRINTING.sub(" ", text)).strip()


Rule = Callable[[str, str], Tuple[Optional[str], str, str]]


def run(src: str, tgt: str, out_prefix: str, rule: Rule, stats_path: Optional[str],
        what: str) -> Dict[str, int]:
    """Apply ``rule`` (-> (drop reason or None, new src, new tgt)) to every pair."""
    total = count_lines(src)
    if count_lines(tgt) != total:
        sys.exit(f"clean.py: error: {src} and {tgt} differ in length")
    counts: Counter = Counter()
    directory = os.path.dirname(os.path.abspath(out_prefix))
    os.makedirs(directory, exist_ok=True)
    src_lang, tgt_lang = src.rsplit(".", 1)[1], tgt.rsplit(".", 1)[1]
    with open(src, encoding="utf-8", errors="replace", newline="\n") as fs, \
            open(tgt, encoding="utf-8", errors="replace", newline="\n") as ft, \
            tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, delete=False,
                                        newline="\n") as os_, \
            tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, delete=False,
                                        newline="\n") as ot, \
            tqdm(total=total, unit=" pairs", desc=what, file=sys.stderr, mininterval=10,
                 disable=total < 100_000) as bar:
        for s, t in zip(fs, ft):
            reason, s, t = rule(s.rstrip("\n"), t.rstrip("\n"))
            counts[reason or "kept"] += 1
            if reason is None:
                os_.write(s + "\n")
                ot.write(t + "\n")
            bar.update(1)
    if sum(counts.values()) != total:  # the line counts and the pairs read must agree
        os.unlink(os_.name)
        os.unlink(ot.name)
        sys.exit(f"clean.py: error: read {sum(counts.values()):,} pairs from {src} and {tgt}, "
                 f"which have {total:,} lines each")
    os.replace(os_.name, f"{out_prefix}.{src_lang}")
    os.replace(ot.name, f"{out_prefix}.{tgt_lang}")
    stats = {"input": total, "kept": counts.pop("kept", 0), "dropped": dict(counts)}
    dropped = ", ".join(f"{n} {why}" for why, n in sorted(counts.items())) or "none"
    print(f"{what}: kept {stats['kept']:,} of {total:,} pairs (dropped: {dropped})", file=sys.stderr)
    if stats_path:
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False) as out:
            json.dump(stats, out, indent=2)
        os.replace(out.name, stats_path)
    return stats


def text_rule(src_lang: str, tgt_lang: str, filter_: bool, max_words: int,
              max_ratio: float) -> Rule:
    from sacremoses import MosesPunctNormalizer  # deferred: 0.4 s to import; subwords never needs it

    norm_src, norm_tgt = MosesPunctNormalizer(lang=src_lang), MosesPunctNormalizer(lang=tgt_lang)
    seen: set = set()

    def rule(s: str, t: str) -> Tuple[Optional[str], str, str]:
        # \r becomes a space before sacremoses (which would delete it and join two words)
        s = printable(norm_src.normalize(s.replace("\r", " ")))
        t = printable(norm_tgt.normalize(t.replace("\r", " ")))
        if not filter_:
            return None, s, t
        ns, nt = len(s.split()), len(t.split())
        if ns == 0 or nt == 0:
            return "empty", s, t
        if ns > max_words or nt > max_words:
            return f"longer than {max_words} words", s, t
        if max(ns, nt) / min(ns, nt) > max_ratio:
            return f"length ratio above {max_ratio}", s, t
        key = hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=16).digest()
        if key in seen:
            return "duplicate", s, t
        seen.add(key)
        return None, s, t

    return rule


def subword_rule(max_subwords: int) -> Rule:
    def rule(s: str, t: str) -> Tuple[Optional[str], str, str]:
        if len(s.split()) > max_subwords or len(t.split()) > max_subwords:
            return f"longer than {max_subwords} subwords", s, t
        return None, s, t

    return rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("text", "subwords"):
        p = sub.add_parser(name)
        p.add_argument("--src", required=True)
        p.add_argument("--tgt", required=True)
        p.add_argument("--out-prefix", required=True)
        p.add_argument("--stats")
        p.add_argument("--what", default="clean")
        if name == "text":
            p.add_argument("--filter", action="store_true")
            p.add_argument("--max-words", type=int, default=80)
            p.add_argument("--max-ratio", type=float, default=1.5)
        else:
            p.add_argument("--max-subwords", type=int, default=250)
    args = parser.parse_args()
    if args.command == "text":
        if args.max_words < 1 or args.max_ratio < 1:
            sys.exit(f"clean.py: error: --max-words {args.max_words} must be >= 1 and "
                     f"--max-ratio {args.max_ratio} >= 1")
        rule = text_rule(args.src.rsplit(".", 1)[1], args.tgt.rsplit(".", 1)[1], args.filter,
                         args.max_words, args.max_ratio)
    else:
        if args.max_subwords < 1:
            sys.exit(f"clean.py: error: --max-subwords {args.max_subwords} must be >= 1")
        rule = subword_rule(args.max_subwords)
    run(args.src, args.tgt, args.out_prefix, rule, args.stats, args.what)


if __name__ == "__main__":
    main()
