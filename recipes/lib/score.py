"""Score fairseq-generate output with sacreBLEU (BLEU and chrF, with signatures).

    python recipes/lib/score.py --generate-output gen.out --reference test.de \
        --json results/x/bleu.json [--source test.en --show 5]

Every input is read and checked first (score_inputs.py: one line for a bad one, nothing
written); the JSON is written atomically.
"""
from __future__ import annotations

import json
import os
import tempfile

import sacrebleu

from score_inputs import (
    ArgumentParser,
    check_json_path,
    extra_fields,
    fail,
    read_hypotheses,
    read_lines,
    read_reference,
    read_source,
)

__all__ = ["detokenized_scores", "read_hypotheses", "read_lines", "write_json", "main"]


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
    """``payload`` as ``path``, atomically: a temporary file beside it, renamed when whole
    (removed if anything fails)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    except OSError as error:
        fail(f"--json {path!r} could not be written: {error.strerror}")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(payload, out, indent=2, ensure_ascii=False)
            out.write("\n")
        os.replace(temporary, path)
    except OSError as error:
        os.unlink(temporary)
        fail(f"--json {path!r} could not be written: {error.strerror}")


SCORE_KEYS = ("bleu", "bleu_signature", "bleu_detail", "chrf", "chrf_signature", "sentences")


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate-output", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--source")
    parser.add_argument("--json", required=True)
    parser.add_argument("--show", type=int, default=0, help="print N example translations")
    parser.add_argument("--extra", default="{}", help="JSON object merged into the output")
    args = parser.parse_args()

    extra = extra_fields(args.extra, SCORE_KEYS)
    check_json_path(args.json, [args.generate_output, args.reference, args.source])
    references = read_reference(args.reference)
    sources = read_source(args.source, args.show, len(references))
    hypotheses = read_hypotheses(args.generate_output, len(references))
    scores, printed = detokenized_scores(hypotheses, references)
    write_json(args.json, {**scores, "sentences": len(references), **extra})
    for i in range(min(args.show, len(references))):
        print(f"  SRC: {sources[i]}\n  REF: {references[i]}\n  HYP: {hypotheses[i]}\n")
    print("\n".join(printed))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
