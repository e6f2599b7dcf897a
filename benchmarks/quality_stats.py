"""The quality study's statistics: sacreBLEU/chrF of one output (whole test set and source
length buckets), mean and spread over seeds, the paired bootstrap of the seed-mean
difference between two models, and the unigram perplexity a model must beat.

Scores are sacreBLEU's (13a, mixed case; chrF2) on detokenized text. The bootstrap
resamples test sentences the way sacreBLEU's ``--paired-bs`` does (numpy
``default_rng(SACREBLEU_SEED=12345).choice``, 1,000 resamples, sufficient statistics per
sentence summed per resample), but over several seeds at once: each resample scores every
seed of both models on the same sentences, and the statistic is the difference of the
seed means. sacreBLEU's own ``PairedTest`` gives the p-value of each seed pair.
"""
from __future__ import annotations

import logging
import math
import os
import statistics
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import sacrebleu
from sacrebleu.significance import PairedTest

logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # PairedTest logs every step at INFO
BOOTSTRAP_SAMPLES = 1000
METRICS = ("bleu", "chrf")


def new_metric(name: str):
    """sacreBLEU's default BLEU (13a, mixed case, exp smoothing) or chrF2."""
    return sacrebleu.BLEU() if name == "bleu" else sacrebleu.CHRF()


def length_buckets(source_lengths: Sequence[int]) -> Dict[str, Dict[str, object]]:
    """Sentence indices by source length: thirds of the test set (shortest, middle,
    longest; ties broken by position) and the longest 10%."""
    n = len(source_lengths)
    if n < 3:
        raise ValueError(f"need at least 3 test sentences for length buckets, got {n}")
    order = sorted(range(n), key=lambda i: (source_lengths[i], i))
    thirds = np.array_split(np.array(order), 3)
    longest = order[n - max(1, math.ceil(n / 10)):]
    buckets = {"short third": thirds[0].tolist(), "middle third": thirds[1].tolist(),
               "long third": thirds[2].tolist(), "longest 10%": longest}
    return {name: {"indices": sorted(int(i) for i in idx),
                   "sentences": len(idx),
                   "source_words": [min(source_lengths[i] for i in idx), max(source_lengths[i] for i in idx)]}
            for name, idx in buckets.items()}


def score(hypotheses: Sequence[str], references: Sequence[str],
          buckets: Dict[str, Dict[str, object]]) -> Dict[str, object]:
    """BLEU and chrF (with signatures) on the whole set and BLEU/chrF per bucket."""
    out: Dict[str, object] = {}
    for name in METRICS:
        metric = new_metric(name)
        result = metric.corpus_score(list(hypotheses), [list(references)])
        out[name] = round(result.score, 2)
        out[f"{name}_signature"] = str(metric.get_signature())
        if name == "bleu":
            out["bleu_detail"] = str(result)
    out["buckets"] = {}
    for bucket, info in buckets.items():
        idx = info["indices"]
        hyp = [hypotheses[i] for i in idx]
        ref = [references[i] for i in idx]
        out["buckets"][bucket] = {name: round(new_metric(name).corpus_score(hyp, [ref]).score, 2)
                                  for name in METRICS}
    return out


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    """Mean and sample standard deviation (0 for one value)."""
    values = list(values)
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def _sentence_stats(metric_name: str, hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    metric = new_metric(metric_name)
    return np.array(metric._extract_corpus_statistics(list(hypotheses), [list(references)]), dtype=np.float64)


def resample_indices(n: int, samples: int = BOOTSTRAP_SAMPLES) -> np.ndarray:
    """sacreBLEU's resampling: ``default_rng(SACREBLEU_SEED or 12345).choice(n, (samples, n))``."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    return rng.choice(n, size=(samples, n), replace=True)


def paired_bootstrap(system: Sequence[Sequence[str]], baseline: Sequence[Sequence[str]],
                     references: Sequence[str], subset: Sequence[int] | None = None,
                     metric_name: str = "bleu", samples: int = BOOTSTRAP_SAMPLES) -> Dict[str, float]:
    """Difference of seed means, mean(system) - mean(baseline), of ``metric_name`` on the
    sentences ``subset`` (default all), with a 95% paired bootstrap interval.

    ``system`` and ``baseline`` hold one hypothesis list per seed (any number each). Every
    resample draws the same sentences for all of them. The interval is the 2.5th and
    97.5th percentile of the resampled differences (the order statistics sacreBLEU's
    ``estimate_ci`` uses); ``p_not_better`` is the share of resamples where the system is
    not better than the baseline.
    """
    subset = list(range(len(references))) if subset is None else list(subset)
    refs = [references[i] for i in subset]
    metric = new_metric(metric_name)

    def per_seed(outputs: Sequence[Sequence[str]]) -> List[np.ndarray]:
        return [_sentence_stats(metric_name, [hyps[i] for i in subset], refs) for hyps in outputs]

    sys_stats, base_stats = per_seed(system), per_seed(baseline)
    idx = resample_indices(len(subset), samples)

    def seed_mean(stats: List[np.ndarray], rows: np.ndarray | None) -> float:
        return statistics.fmean(
            metric._compute_score_from_stats((s if rows is None else s[rows]).sum(0)).score for s in stats)

    observed = seed_mean(sys_stats, None) - seed_mean(base_stats, None)
    diffs = np.sort([seed_mean(sys_stats, rows) - seed_mean(base_stats, rows) for rows in idx])
    cut = samples // 40
    return {"difference": observed, "ci95": [float(diffs[cut]), float(diffs[samples - cut - 1])],
            "bootstrap_mean": float(diffs.mean()), "p_not_better": float(np.mean(diffs <= 0)),
            "samples": samples, "sentences": len(subset)}


def sacrebleu_paired_bs(system: Sequence[str], baseline: Sequence[str],
                        references: Sequence[str]) -> Dict[str, object]:
    """sacreBLEU's own paired bootstrap test (``--paired-bs``) of one system against one
    baseline: each one's bootstrap mean with its 95% half-width, and the p-value."""
    metrics = {name.upper() if name == "bleu" else "chrF": new_metric(name) for name in METRICS}
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))], metrics,
                      [list(references)], test_type="bs", n_samples=BOOTSTRAP_SAMPLES)
    signatures, scores = test()
    out: Dict[str, object] = {}
    for key, results in scores.items():
        if key == "System":
            continue
        base, sys_result = results
        name = "bleu" if key.startswith("BLEU") else "chrf"
        out[name] = {"baseline": float(base.score), "baseline_mean": float(base.mean),
                     "baseline_ci": float(base.ci), "system": float(sys_result.score),
                     "system_mean": float(sys_result.mean), "system_ci": float(sys_result.ci),
                     "p_value": float(sys_result.p_value), "signature": str(signatures[key])}
    return out


def unigram_perplexity(data: Path, subset: str = "valid") -> Dict[str, float]:
    """Perplexity of the ``subset`` target tokens (EOS included) under the train target's
    add-one unigram distribution over the dictionary: the level a model that ignores the
    source and the history reaches. Bits per token match fairseq's ``nll_loss`` (base 2)."""
    from fairseq.data import Dictionary, data_utils

    pairs = sorted({p.name.split(".")[1] for p in data.glob(f"{subset}.*-*.*.idx")})
    if not pairs:
        raise ValueError(f"no binarized '{subset}' split in {data}")
    target_lang = pairs[0].split("-")[1]
    dictionary = Dictionary.load(str(data / f"dict.{target_lang}.txt"))

    def tokens(split: str) -> np.ndarray:
        dataset = data_utils.load_indexed_dataset(str(data / f"{split}.{pairs[0]}.{target_lang}"), None)
        return np.concatenate([dataset[i].numpy() for i in range(len(dataset))])

    counts = np.bincount(tokens("train"), minlength=len(dictionary)).astype(np.float64)
    probs = (counts + 1) / (counts.sum() + len(counts))
    bits = float(-np.log2(probs[tokens(subset)]).mean())
    return {"bits_per_token": bits, "perplexity": 2 ** bits, "subset": subset}
