"""Time to quality, read from the stored learning curves of the quality study's runs, each as
the uninterrupted run would have ended (``quality_runs.as_uninterrupted``).

For every run: the training target tokens, updates and one-thread seconds to reach
(a) its own best validation loss and (b) the *common loss*, the highest of all runs' best
losses (every run of every model reaches it). The rules, stated in advance in
docs/quality.md:

- a run reaches a loss at the **first validation whose loss is at or below it**, credited
  with the tokens trained up to that validation (no interpolation between validations);
- **one-thread seconds = target tokens / the run's undisturbed speed**
  (``quality_runs.undisturbed_speed``, one torch thread): the runs trained niced beside
  other work, so their wall seconds are disturbed; the raw tokens are given too;
- per model, the mean and 95% t interval over seeds; between models, the ratio of the means
  (system / baseline) with a 95% seed bootstrap interval (each model's seeds drawn with
  replacement, independently; the 2.5th-97.5th percentile of the resampled ratios).
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats as scipy_stats

from .fairseq_runs import BenchmarkError
from .quality_runs import undisturbed_speed
from .quality_stats import BOOTSTRAP_SAMPLES, percentile_interval

TARGETS = ("own_best", "common")
QUANTITIES = ("updates", "train_tokens", "one_thread_seconds")


def check_continuous(record: Dict[str, object]) -> None:
    """A curve the reading can trust: validations at increasing updates with increasing
    training tokens and seconds (what ``learning_curve`` makes of a resumed run's log)."""
    curve = record["curve"]
    for before, after in zip(curve, curve[1:]):
        if not (after["updates"] > before["updates"] and after["train_tokens"] > before["train_tokens"]
                and after["train_seconds"] >= before["train_seconds"]):
            raise BenchmarkError(f"{record['model']} seed {record['seed']}: its curve goes back at update "
                                 f"{after['updates']} (after {before['updates']}): not one continuous run")


def first_at_or_below(curve: Sequence[Dict[str, float]], loss: float) -> Optional[Dict[str, float]]:
    """The first validation whose loss is at or below ``loss`` (None: never)."""
    return next((point for point in curve if point["loss"] <= loss), None)


def reach(record: Dict[str, object], loss: float) -> Dict[str, float]:
    """Updates, target tokens and one-thread seconds of one run to a validation loss."""
    point = first_at_or_below(record["curve"], loss)
    if point is None:
        raise BenchmarkError(f"{record['model']} seed {record['seed']} never reaches validation loss {loss}")
    speed = undisturbed_speed(record["curve"])
    return {"target_loss": loss, "validation_loss": point["loss"], "updates": point["updates"],
            "train_tokens": point["train_tokens"],
            "one_thread_seconds": point["train_tokens"] / speed if speed else None}


def common_loss(records: Sequence[Dict[str, object]]) -> float:
    """The highest of the runs' best validation losses: every run reaches it."""
    return max(min(point["loss"] for point in r["curve"]) for r in records)


def seed_interval(values: Sequence[float]) -> Dict[str, object]:
    """Mean and 95% t interval of the mean over seeds (None with one seed)."""
    values = [float(v) for v in values]
    mean = statistics.fmean(values)
    ci = None
    if len(values) > 1:
        sem = statistics.stdev(values) / len(values) ** 0.5
        half = float(scipy_stats.t.ppf(0.975, len(values) - 1)) * sem
        ci = [mean - half, mean + half]
    return {"mean": mean, "ci95": ci, "n": len(values), "values": values}


def ratio_interval(system: Sequence[float], baseline: Sequence[float], samples: int = BOOTSTRAP_SAMPLES,
                   draws: Optional[List[Tuple[np.ndarray, np.ndarray]]] = None) -> Dict[str, object]:
    """mean(system) / mean(baseline) with a 95% seed bootstrap interval. ``draws`` (for tests)
    replaces the random (system seeds, baseline seeds) draws."""
    a, b = np.asarray(system, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if draws is None:
        rng = np.random.default_rng(12345)
        draws = [(rng.integers(len(a), size=len(a)), rng.integers(len(b), size=len(b))) for _ in range(samples)]
    ratios = np.array([a[s].mean() / b[t].mean() for s, t in draws])
    return {"ratio": float(a.mean() / b.mean()), "ci95": percentile_interval(ratios), "samples": len(draws)}


def analyse(records: Sequence[Dict[str, object]], comparisons: Sequence[Tuple[str, str]],
            samples: int = BOOTSTRAP_SAMPLES) -> Dict[str, object]:
    """Each run's time to its own best and to the common loss; per model the seed intervals;
    per comparison the ratios of the means."""
    for record in records:
        check_continuous(record)
    common = common_loss(records)
    runs = [{"model": r["model"], "seed": r["seed"], "undisturbed_tokens_per_second": undisturbed_speed(r["curve"]),
             "own_best": reach(r, min(p["loss"] for p in r["curve"])), "common": reach(r, common)} for r in records]
    models: Dict[str, Dict[str, object]] = {}
    for key in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == key]
        models[key] = {target: {q: seed_interval([r[target][q] for r in mine]) for q in QUANTITIES
                                if all(r[target][q] is not None for r in mine)} for target in TARGETS}
    ratios = {}
    for system, baseline in comparisons:
        if system in models and baseline in models:
            ratios[f"{system} / {baseline}"] = {
                q: ratio_interval(models[system]["common"][q]["values"], models[baseline]["common"][q]["values"],
                                  samples)
                for q in ("one_thread_seconds", "train_tokens") if q in models[system]["common"]
                and q in models[baseline]["common"]}
    return {"common_loss": common, "rule": "first validation at or below the loss, no interpolation; "
            "one-thread seconds = target tokens / the run's undisturbed tokens/s",
            "runs": runs, "models": models, "ratios_to_common": ratios}
