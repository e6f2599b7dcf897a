"""The quality study's statistics: sacreBLEU/chrF of one output (whole test set and source
length buckets), mean and spread over seeds, the intervals of a difference between two
models, the wording that follows from them, and the unigram perplexity a model must beat.

Scores are sacreBLEU's (13a, mixed case; chrF2) on detokenized text. Two seed-level
intervals for each difference of seed means (system - baseline):

- ``hierarchical_bootstrap``: each resample draws the seeds of each model with
  replacement (independently: seed 1 of one model has nothing in common with seed 1 of
  another) *and* the test sentences with replacement (the same sentences for every seed of
  both models), scores every drawn seed's corpus on those sentences, and takes the
  difference of the means; 95% = the 2.5th and 97.5th percentiles (90%, for the
  equivalence test of ``quality_equivalence``: the 5th and 95th).
- ``welch_interval``: Welch's t interval over the per-seed corpus scores (the seed spread
  only, with the small-sample t quantile).

``verdict`` words a difference: better or worse *by* the difference only when both
intervals exclude 0 on the same side, else "no difference detected". ``paired_bootstrap``
(sentences only, as sacreBLEU's ``--paired-bs``) is kept as the within-seed reference.
"""
from __future__ import annotations

import logging
import math
import os
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import sacrebleu
from scipy import stats as scipy_stats
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
    """Mean and sample standard deviation (0 for one value; NaN for none)."""
    values = list(values)
    if not values:
        return {"mean": math.nan, "std": math.nan, "n": 0, "values": []}
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


def sentence_stats(metric_name: str, hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """sacreBLEU's sufficient statistics of each sentence (rows), summed over rows to score a corpus."""
    return _sentence_stats(metric_name, hypotheses, references)


def corpus_scorer(metric_name: str) -> Callable[[np.ndarray], float]:
    metric = new_metric(metric_name)
    return lambda totals: float(metric._compute_score_from_stats(totals).score)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> List[float]:
    """The central ``level`` interval's order statistics: cut ``floor(n (1 - level) / 2)`` from
    each end (at 95% sacreBLEU's ``estimate_ci`` cut, n // 40; at 90%, n // 20)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    cut = math.floor(len(ordered) * (1 - level) / 2 + 1e-9)
    return [float(ordered[cut]), float(ordered[len(ordered) - cut - 1])]


Draw = Tuple[np.ndarray, np.ndarray, np.ndarray]  # seeds of the system, of the baseline, sentences


def hierarchical_draws(n_system: int, n_baseline: int, n_sentences: int, samples: int,
                       seed: int = 12345) -> List[Draw]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(n_system, size=n_system), rng.integers(n_baseline, size=n_baseline),
             rng.integers(n_sentences, size=n_sentences)) for _ in range(samples)]


def hierarchical_bootstrap(system: Sequence[np.ndarray], baseline: Sequence[np.ndarray],
                           scorer: Callable[[np.ndarray], float], samples: int = BOOTSTRAP_SAMPLES,
                           draws: Optional[List[Draw]] = None) -> Dict[str, object]:
    """Difference of seed means with a 95% interval that resamples seeds and sentences.

    ``system``/``baseline``: one (sentences x statistics) array per seed; ``scorer`` turns
    summed statistics into a corpus score. ``draws`` (for tests) replaces the random draws.
    """
    n = len(system[0])
    if any(len(s) != n for s in [*system, *baseline]):
        raise ValueError("every seed must be scored on the same sentences")
    observed = (statistics.fmean(scorer(s.sum(0)) for s in system)
                - statistics.fmean(scorer(s.sum(0)) for s in baseline))
    draws = draws if draws is not None else hierarchical_draws(len(system), len(baseline), n, samples)
    diffs = []
    for sys_seeds, base_seeds, rows in draws:
        sys_scores = [scorer(s[rows].sum(0)) for s in system]
        base_scores = [scorer(s[rows].sum(0)) for s in baseline]
        diffs.append(float(np.mean([sys_scores[k] for k in sys_seeds]) - np.mean([base_scores[k] for k in base_seeds])))
    diffs_array = np.array(diffs)
    return {"difference": observed, "ci95": percentile_interval(diffs_array),
            "ci90": percentile_interval(diffs_array, 0.90),
            "p_not_better": float(np.mean(diffs_array <= 0)), "p_not_worse": float(np.mean(diffs_array >= 0)),
            "samples": len(draws), "seeds": [len(system), len(baseline)], "sentences": n}


def welch_interval(system: Sequence[float], baseline: Sequence[float], level: float = 0.95) -> Dict[str, object]:
    """Welch's t interval for mean(system) - mean(baseline) over per-seed scores (``ci95``,
    at ``level``; ``ci90`` at 90%, for the equivalence test), and the two-sided p-value;
    undefined (None) with fewer than 2 seeds a side or no spread."""
    a, b = np.asarray(system, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    difference = float(a.mean() - b.mean())
    out: Dict[str, object] = {"difference": difference, "ci95": None, "ci90": None, "p_value": None, "df": None,
                              "seeds": [len(a), len(b)]}
    if len(a) < 2 or len(b) < 2:
        return out
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return out
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = float(scipy_stats.t.ppf(0.5 + level / 2, df))
    t90 = float(scipy_stats.t.ppf(0.95, df))
    p = float(2 * scipy_stats.t.sf(abs(difference) / se, df))
    return out | {"ci95": [difference - t * se, difference + t * se], "p_value": p, "df": float(df),
                  "se": se, "t": t, "ci90": [difference - t90 * se, difference + t90 * se]}


def verdict(bootstrap_ci: Sequence[float], welch_ci: Optional[Sequence[float]], difference: float,
            unit: str, system: str = "hybrid") -> str:
    """The wording a difference allows: a direction only when both seed-level intervals
    exclude 0 on the same side (a missing Welch interval allows none)."""
    intervals = [bootstrap_ci, welch_ci]
    if all(ci is not None and ci[0] > 0 for ci in intervals):
        return f"{system} better by {difference:.2f} {unit}"
    if all(ci is not None and ci[1] < 0 for ci in intervals):
        return f"{system} worse by {-difference:.2f} {unit}"
    return "no difference detected"


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
