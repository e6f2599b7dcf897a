"""Score a WMT test set: sacreBLEU on detokenized output and tokenized BLEU with compound
splitting (the number Luong et al. 2015 and the hybrid paper report).

    python recipes/lib/wmt_score.py --generate-output gen.out --reference test.ref.de \
        --json results/wmt14_en_de/x.json [--lang de --extra '{...}']

- sacreBLEU (13a, mixed case) and chrF of the ``D-`` lines against the raw references,
  with their signatures.
- Tokenized BLEU: hypotheses and references are tokenized with sacremoses' Moses
  tokenizer (``tokenizer.perl -l de``), hyphenated compounds are split the way tensor2tensor's
  ``get_ende_bleu.sh`` does (``a-b`` -> ``a ##AT##-##AT## b``), and BLEU is computed on
  those tokens like ``multi-bleu.perl`` (no further tokenization, no smoothing).

Reading and checking the inputs (one line for a bad one, nothing written) come from
score_inputs.py, the atomic JSON from score.py.
"""
from __future__ import annotations

import re
from typing import List

import sacrebleu
from sacremoses import MosesTokenizer

from score import detokenized_scores, write_json
from score_inputs import ArgumentParser, check_json_path, extra_fields, read_hypotheses, read_reference

COMPOUND = re.compile(r"(\S)-(\S)")
SCORE_KEYS = ("sacrebleu", "sacrebleu_signature", "sacrebleu_detail", "chrf", "chrf_signature",
              "tokenized_bleu", "tokenized_bleu_detail", "tokenized_bleu_method", "sentences")


def compound_split(text: str) -> str:
    r"""``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`` (tensor2tensor's get_ende_bleu.sh,
    fairseq's compound_split_bleu.sh), applied once: matches do not overlap, left to right,
    so ``E-Mail-Adresse`` splits at both hyphens but ``1-2-3`` only at the first. A second
    pass would split the hyphen inside the ``##AT##-##AT##`` just inserted and inflate BLEU."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def tokenize_for_bleu(lines: List[str], lang: str) -> List[str]:
    tokenizer = MosesTokenizer(lang=lang)
    return [compound_split(tokenizer.tokenize(line, return_str=True, escape=True)) for line in lines]


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate-output", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--lang", default="de")
    parser.add_argument("--extra", default="{}", help="JSON object merged into the output")
    args = parser.parse_args()

    extra = extra_fields(args.extra, SCORE_KEYS)
    check_json_path(args.json, [args.generate_output, args.reference])
    references = read_reference(args.reference)
    hypotheses = read_hypotheses(args.generate_output, len(references))
    scores, printed = detokenized_scores(hypotheses, references, bleu_key="sacrebleu")
    tok_metric = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True)
    tok_bleu = tok_metric.corpus_score(tokenize_for_bleu(hypotheses, args.lang),
                                       [tokenize_for_bleu(references, args.lang)])
    payload = {
        **scores,
        "tokenized_bleu": round(tok_bleu.score, 2),
        "tokenized_bleu_detail": str(tok_bleu),
        "tokenized_bleu_method": f"sacremoses tokenizer -l {args.lang}, compound splitting "
                                 "(##AT##-##AT##), multi-bleu style (tokenize none, no smoothing)",
        "sentences": len(references),
        **extra,
    }
    write_json(args.json, payload)
    print("sacreBLEU " + printed[0])
    print("chrF " + printed[1])
    print(f"tokenized BLEU (compound split) = {tok_bleu.score:.2f}  {tok_bleu}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
