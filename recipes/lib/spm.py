"""Train a joint sentencepiece model and encode files with it (recipe helper).

    python recipes/lib/spm.py train --vocab 3000 --model-prefix DIR/spm FILE...
    python recipes/lib/spm.py encode --model DIR/spm.model IN OUT

Writes go to a temporary file renamed into place, so an interrupted run leaves nothing
half-written. Encoding reads lines ending at ``\n`` only and writes one line per input
line (a ``\r`` inside a line is a space).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

import sentencepiece as spm


def train(files: list[str], vocab: int, model_prefix: str, sample_size: int, threads: int) -> None:
    if vocab < 100:
        sys.exit(f"spm.py: error: --vocab {vocab} is too small: use 100 or more")
    for path in files:
        if not os.path.isfile(path):
            sys.exit(f"spm.py: error: training file {path!r} does not exist")
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(files), model_prefix=model_prefix, vocab_size=vocab,
            character_coverage=1.0, model_type="unigram", input_sentence_size=sample_size,
            shuffle_input_sentence=True, num_threads=threads, bos_id=-1, eos_id=-1,
            unk_id=0, pad_id=-1, minloglevel=2,
        )
    except (RuntimeError, ValueError) as error:  # how sentencepiece reports bad values
        # (a vocabulary larger than the corpus allows is only known once it has read it)
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        limit = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", reason)
        if limit:
            sys.exit(f"spm.py: error: --vocab {vocab} is too large for these training files: "
                     f"sentencepiece can make at most {limit.group(2)} pieces of them "
                     f"(use {limit.group(2)} or less; SPM_VOCAB in the recipes)")
        reason = re.sub(r"^.*?\] ", "", reason)  # without "INTERNAL: src/....cc(744) [...]"
        sys.exit(f"spm.py: error: sentencepiece failed: {reason}")


def encode(model: str, source: str, dest: str) -> None:
    processor = spm.SentencePieceProcessor(model_file=model)
    directory = os.path.dirname(os.path.abspath(dest))
    lines = 0
    # lines end at \n only; a \r inside a line is a space (universal newlines would split it)
    with open(source, encoding="utf-8", newline="\n") as inp, tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=directory, delete=False, newline="\n"
    ) as out:
        for line in inp:
            out.write(" ".join(processor.encode(line.rstrip("\n").replace("\r", " "),
                                                out_type=str)) + "\n")
            lines += 1
    with open(source, "rb") as handle:
        expected = sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
    if lines not in (expected, expected + 1):  # + 1: a last line without \n
        os.unlink(out.name)
        sys.exit(f"spm.py: error: encoded {lines} lines of {source}, which has {expected}")
    os.replace(out.name, dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--model-prefix", required=True)
    t.add_argument("--sample-size", type=int, default=2_000_000)
    t.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    t.add_argument("files", nargs="+")
    e = sub.add_parser("encode")
    e.add_argument("--model", required=True)
    e.add_argument("source")
    e.add_argument("dest")
    args = parser.parse_args()
    if args.command == "train":
        train(args.files, args.vocab, args.model_prefix, args.sample_size, args.threads)
    else:
        encode(args.model, args.source, args.dest)


if __name__ == "__main__":
    main()
