"""Score fairseq-generate output with sacreBLEU (BLEU and chrF, with signatures).

    python recipes/lib/score.py --generate-output gen.out --reference test.de \
        --json results/x/bleu.json [--source test.en --show 5]

Hypotheses are the ``D-`` lines (detokenized by ``--remove-bpe sentencepiece``) put back
in corpus order; every reference line must have one. The JSON is written atomically.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import sacrebleu


def read_hypotheses(path: str, expected: int) -> list[str]:
    """The ``D-`` lines of fairseq-generate output ``path`` in id order; exits with one line
    unless they are exactly ids 0 .. expected-1, each once (``expected``: the reference's
    line count): a surplus hypothesis means a reference of another test set, a duplicate
    id output of two runs."""
    hypotheses: dict[int, str] = {}
    duplicates: list[int] = []
    with open(path, encoding="utf-8", newline="\n") as handle:
        for line in handle:
            if line.startswith("D-"):
                ident, _score, text = (line.rstrip("\n").split("\t") + ["", ""])[:3]
                index = int(ident[2:])
                if index in hypotheses:
                    duplicates.append(index)
                hypotheses[index] = text.replace("\r", " ")
    if duplicates:
        sys.exit(
            f"score.py: error: {path} has {len(duplicates)} duplicated hypothesis id(s) (first: "
            f"{sorted(set(duplicates))[:5]}): the output of more than one fairseq-generate run?"
        )
    surplus = sorted(i for i in hypotheses if not 0 <= i < expected)
    if surplus:
        sys.exit(
            f"score.py: error: {path} has {len(hypotheses)} hypotheses but the reference has "
            f"{expected} lines (ids beyond it: {surplus[:5]}): is the reference of another "
            "test set?"
        )
    missing = [i for i in range(expected) if i not in hypotheses]
    if missing:
        sys.exit(
            f"score.py: error: {len(missing)} of {expected} sentences have no hypothesis in "
            f"{path} ({len(hypotheses)} hypotheses for a {expected}-line reference; first "
            f"missing: {missing[:5]}); did fairseq-generate run without --user-dir "
            "fairseq_hybrid and without --required-batch-size-multiple 1 (fairseq #5036)?"
        )
    return [hypotheses[i] for i in range(expected)]


def read_lines(path: str) -> list[str]:
    """One entry per ``\n``-terminated line; a ``\r`` is a space (universal newlines would
    split a line at it and shift every later reference)."""
    with open(path, encoding="utf-8", newline="\n") as handle:
        return [line.rstrip("\n").replace("\r", " ").rstrip(" ") for line in handle]


def detokenized_scores(hypotheses: list[str], references: list[str],
                       bleu_key: str = "bleu") -> tuple[dict, list[str]]:
    """sacreBLEU (13a, mixed case) and chrF: their result fields (score, signature, and
    BLEU's detail, BLEU under ``bleu_key``) and the lines to print."""
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    fields = {
        bleu_key: round(bleu.score, 2),
        f"{bleu_key}_signature": str(bleu_metric.get_signature()),
        f"{bleu_key}_detail": str(bleu),
        "chrf": round(chrf.score, 2),
        "chrf_signature": str(chrf_metric.get_signature()),
    }
    return fields, [f"{bleu}  ({bleu_metric.get_signature()})", f"{chrf}  ({chrf_metric.get_signature()})"]


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(path)),
                                     delete=False, encoding="utf-8") as out:
        json.dump(payload, out, indent=2, ensure_ascii=False)
        out.write("\n")
    os.replace(out.name, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate-output", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--source")
    parser.add_argument("--json", required=True)
    parser.add_argument("--show", type=int, default=0, help="print N example translations")
    parser.add_argument("--extra", default="{}", help="JSON object merged into the output")
    args = parser.parse_args()

    references = read_lines(args.reference)
    hypotheses = read_hypotheses(args.generate_output, len(references))
    scores, printed = detokenized_scores(hypotheses, references)
    payload = {
        **scores,
        "sentences": len(references),
        **json.loads(args.extra),
    }
    write_json(args.json, payload)
    if args.show and args.source:
        sources = read_lines(args.source)
        for i in range(min(args.show, len(references))):
            print(f"  SRC: {sources[i]}\n  REF: {references[i]}\n  HYP: {hypotheses[i]}\n")
    print("\n".join(printed))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
