"""The quality study's equivalence reading and interval width, both stated before the runs
they read (docs/quality.md, "The statistics").

- **Equivalence** (two one-sided tests, TOST): a difference of seed means is "equivalent
  within ``MARGIN`` BLEU" when *both* seed-level 90% intervals (``quality_stats``: the
  hierarchical bootstrap's 5th-95th percentile and Welch's t) lie inside (-MARGIN, +MARGIN):
  each one-sided test rejects at 5%. A direction ("worse by" / "better by") is read as
  ``quality_stats.verdict`` reads it, when both 95% intervals exclude 0 on the same side.
  Neither interval alone decides: anything else is "not decided".
- **Width**: the 95% seed-level interval's half-width against ``TARGET_HALF_WIDTH`` (both
  intervals must be narrower), and the seeds per model that the observed seed spread needs
  for Welch's interval to get there (``seeds_needed``).
- **Growth** (``grown_seed_count``): when the planned seeds are in and the target is not
  met, the study grows to the seeds the spread needs, at most ``--grow-to``; it follows the
  spread only, never the difference.
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, Optional, Sequence, Tuple

from scipy import stats as scipy_stats

MARGIN = 0.5  # BLEU: differences inside it are too small to matter for this study
TARGET_HALF_WIDTH = 0.35  # BLEU: the 95% seed-level interval of hybrid_lstm - lstm must be narrower
MOST_SEEDS = 1000  # seeds_needed gives up beyond this


def _inside(ci: Optional[Sequence[float]], margin: float) -> bool:
    return ci is not None and -margin < ci[0] and ci[1] < margin


def _excludes_zero(ci: Optional[Sequence[float]], side: int) -> bool:
    return ci is not None and (ci[0] > 0 if side > 0 else ci[1] < 0)


def decision(ci90: Sequence[Optional[Sequence[float]]], ci95: Sequence[Optional[Sequence[float]]],
             margin: float = MARGIN) -> Tuple[bool, int]:
    """(equivalent within ``margin``, direction: +1 better, -1 worse, 0 none) of one difference
    from its seed-level intervals (each list: the bootstrap's and Welch's; a missing one, None,
    allows no reading)."""
    equivalent = all(_inside(ci, margin) for ci in ci90)
    for side in (1, -1):
        if all(_excludes_zero(ci, side) for ci in ci95):
            return equivalent, side
    return equivalent, 0


def reading(ci90: Sequence[Optional[Sequence[float]]], ci95: Sequence[Optional[Sequence[float]]],
            difference: float, margin: float = MARGIN, unit: str = "BLEU", system: str = "hybrid") -> str:
    """The reading of one difference in words (``decision``)."""
    return in_words(*decision(ci90, ci95, margin), difference, margin, unit, system)


def in_words(equivalent: bool, side: int, difference: float, margin: float = MARGIN, unit: str = "BLEU",
             system: str = "hybrid") -> str:
    """A ``decision`` in the report's words."""
    if side:
        also = f", yet equivalent within {margin:g} {unit}" if equivalent else ""
        return f"{system} {'better' if side > 0 else 'worse'} by {abs(difference):.2f} {unit}{also}"
    return f"equivalent within {margin:g} {unit}" if equivalent else "not decided"


def tost_p(welch: Dict[str, object], margin: float = MARGIN) -> Optional[float]:
    """Welch's TOST p-value: the larger of the two one-sided p-values (H0: difference <= -margin,
    H0: difference >= +margin); below 0.05 exactly when Welch's 90% interval is inside the margin."""
    if welch.get("se") is None:
        return None
    difference, se, df = welch["difference"], welch["se"], welch["df"]
    lower = scipy_stats.t.sf((difference + margin) / se, df)
    upper = scipy_stats.t.cdf((difference - margin) / se, df)
    return float(max(lower, upper))


def welch_half_width(std_system: float, std_baseline: float, seeds: int, level: float = 0.95) -> float:
    """Half-width of Welch's interval with ``seeds`` seeds per model at these seed spreads."""
    va, vb = std_system ** 2 / seeds, std_baseline ** 2 / seeds
    if va + vb == 0:
        return 0.0
    df = (va + vb) ** 2 / (va ** 2 / (seeds - 1) + vb ** 2 / (seeds - 1))
    return float(scipy_stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(va + vb)


def seeds_needed(std_system: float, std_baseline: float, target: float = TARGET_HALF_WIDTH) -> Optional[int]:
    """The fewest seeds per model (the same for both) whose Welch 95% interval is narrower than
    ±``target`` if the seed standard deviations stay as observed; None beyond ``MOST_SEEDS``."""
    for seeds in range(2, MOST_SEEDS + 1):
        if welch_half_width(std_system, std_baseline, seeds) < target:
            return seeds
    return None


def _half(ci: Optional[Sequence[float]]) -> Optional[float]:
    return None if ci is None else (ci[1] - ci[0]) / 2


def width(bootstrap: Dict[str, object], welch: Dict[str, object], system_scores: Sequence[float],
          baseline_scores: Sequence[float], target: float = TARGET_HALF_WIDTH) -> Dict[str, object]:
    """The 95% intervals' half-widths against ``target`` and the seeds the spread needs."""
    halves = {"bootstrap_half_width": _half(bootstrap["ci95"]), "welch_half_width": _half(welch["ci95"])}
    spread = None
    if min(len(system_scores), len(baseline_scores)) >= 2:
        spread = seeds_needed(statistics.stdev(system_scores), statistics.stdev(baseline_scores), target)
    return {"target": target, **halves,
            "met": all(h is not None and h < target for h in halves.values()),
            "seeds_needed": spread}


def equivalence(bootstrap: Dict[str, object], welch: Dict[str, object], system_scores: Sequence[float],
                baseline_scores: Sequence[float], system: str, margin: float = MARGIN) -> Dict[str, object]:
    """Everything the report prints about one BLEU difference: the reading, its 90% intervals,
    Welch's TOST p-value and the width against the target."""
    ci90, ci95 = [bootstrap["ci90"], welch["ci90"]], [bootstrap["ci95"], welch["ci95"]]
    equivalent, direction = decision(ci90, ci95, margin)
    words = in_words(equivalent, direction, bootstrap["difference"], margin, "BLEU", system)
    return {"margin": margin, "reading": words, "equivalent": equivalent, "direction": direction,
            "bootstrap_ci90": bootstrap["ci90"], "welch_ci90": welch["ci90"], "welch_tost_p": tost_p(welch, margin),
            "width": width(bootstrap, welch, system_scores, baseline_scores)}


def grown_seed_count(width: Dict[str, object], seeds: int, most: int) -> Optional[int]:
    """The seeds per model the study grows to from ``seeds`` when ``width`` (of the headline
    difference) misses its target: the spread's ``seeds_needed``, at least one more, at most
    ``most``; None when the target is met or ``most`` is reached."""
    if width["met"] or seeds >= most:
        return None
    return min(most, max(seeds + 1, width["seeds_needed"] or most))
