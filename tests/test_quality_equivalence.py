"""The quality study's equivalence reading (benchmarks/quality_equivalence.py) and the 90%
intervals it reads (benchmarks/quality_stats.py): the three outcomes at known intervals, the
margin's edge, Welch's TOST p-value and 90% interval against scipy's one-sided Welch tests,
the bootstrap's 90% percentiles by hand, and the seeds a spread needs against Welch's interval
of data with exactly that spread."""
import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks import quality_equivalence as qe, quality_stats as qs


@pytest.mark.parametrize("ci90, ci95, difference, expected", [
    # both 90% intervals inside (-0.5, +0.5), both 95% intervals include 0
    ([[-0.3, 0.2], [-0.4, 0.3]], [[-0.4, 0.3], [-0.45, 0.35]], -0.05, "equivalent within 0.5 BLEU"),
    # both 95% intervals below 0: a direction, whatever the margin says
    ([[-1.1, -0.3], [-1.0, -0.4]], [[-1.2, -0.2], [-1.1, -0.3]], -0.67, "hybrid worse by 0.67 BLEU"),
    ([[0.3, 1.1], [0.4, 1.0]], [[0.2, 1.2], [0.3, 1.1]], 0.71, "hybrid better by 0.71 BLEU"),
    # a small difference that is detected and inside the margin: both readings
    ([[-0.45, -0.15], [-0.4, -0.2]], [[-0.48, -0.1], [-0.45, -0.12]], -0.3,
     "hybrid worse by 0.30 BLEU, yet equivalent within 0.5 BLEU"),
    # one 90% interval reaches past the margin: the two must agree
    ([[-0.84, 0.05], [-0.4, 0.3]], [[-0.92, 0.13], [-0.45, 0.35]], -0.41, "not decided"),
    # touching the margin is not inside it (TOST rejects strictly)
    ([[-0.5, 0.2], [-0.4, 0.3]], [[-0.6, 0.3], [-0.45, 0.35]], -0.1, "not decided"),
    # only one 95% interval excludes 0: no direction; wide: no equivalence
    ([[-0.9, -0.1], [-1.0, 0.1]], [[-1.0, -0.05], [-1.1, 0.2]], -0.5, "not decided"),
    # no Welch interval (one seed): nothing is decided
    ([[-0.1, 0.1], None], [[-0.2, 0.2], None], 0.0, "not decided"),
])
def test_reading_has_three_outcomes_at_known_intervals(ci90, ci95, difference, expected):
    assert qe.reading(ci90, ci95, difference) == expected


def test_the_reading_names_the_system_and_the_margin():
    assert qe.reading([[0.1, 0.5]], [[0.05, 0.6]], 0.3, margin=1.0, unit="chrF", system="hybrid_if") == \
        "hybrid_if better by 0.30 chrF, yet equivalent within 1 chrF"


SYSTEM = [4.40, 4.95, 3.91, 4.60, 4.34]
BASELINE = [4.85, 5.10, 4.55, 4.80, 4.95]


def test_welch_90_interval_and_tost_p_agree_with_scipys_welch_tests():
    welch = qs.welch_interval(SYSTEM, BASELINE)
    reference = scipy_stats.ttest_ind(SYSTEM, BASELINE, equal_var=False)
    assert welch["ci90"] == pytest.approx(list(reference.confidence_interval(0.90)), abs=1e-9)
    assert welch["ci95"] == pytest.approx(list(reference.confidence_interval(0.95)), abs=1e-9)
    # TOST = two one-sided Welch tests of the shifted samples: H0 d <= -m and H0 d >= +m
    for margin in (0.3, 0.5, 1.0):
        lower = scipy_stats.ttest_ind(np.add(SYSTEM, margin), BASELINE, equal_var=False, alternative="greater")
        upper = scipy_stats.ttest_ind(np.subtract(SYSTEM, margin), BASELINE, equal_var=False, alternative="less")
        p = qe.tost_p(welch, margin)
        assert p == pytest.approx(max(lower.pvalue, upper.pvalue), abs=1e-12)
        # TOST at 5% rejects exactly when the 90% interval lies inside the margin
        assert (p < 0.05) == (-margin < welch["ci90"][0] and welch["ci90"][1] < margin)
    assert qe.tost_p(qs.welch_interval([1.0], [2.0, 3.0])) is None


def test_percentile_interval_cuts_five_percent_each_side_at_90():
    values = np.arange(1000.0)[::-1]
    assert qs.percentile_interval(values) == [25.0, 974.0]  # sacreBLEU's n // 40
    assert qs.percentile_interval(values, 0.90) == [50.0, 949.0]  # n // 20
    assert qs.percentile_interval(np.arange(4.0), 0.90) == [0.0, 3.0]


def test_hierarchical_bootstrap_reports_its_90_percent_interval_by_hand():
    # one sentence, one statistic: each resample's difference is system seed - baseline seed
    system = [np.array([[float(v)]]) for v in range(20)]
    baseline = [np.array([[0.0]])]
    draws = [(np.array([k]), np.array([0]), np.array([0])) for k in range(20)]  # differences 0..19
    result = qs.hierarchical_bootstrap(system, baseline, lambda totals: float(totals[0]), draws=draws)
    assert result["ci90"] == [1.0, 18.0]  # 20 x 5% = 1 cut from each end
    assert result["ci95"] == [0.0, 19.0]  # 20 // 40 = 0


def with_spread(std: float, n: int, mean: float = 0.0) -> list:
    """n values with exactly this mean and sample standard deviation."""
    z = np.linspace(-1.0, 1.0, n)
    return list(mean + (z - z.mean()) / np.std(z, ddof=1) * std)


def test_seeds_needed_is_the_first_count_whose_welch_interval_is_narrow_enough():
    for std_a, std_b in ((0.43, 0.22), (0.48, 0.23), (0.2, 0.0)):
        n = qe.seeds_needed(std_a, std_b, 0.35)
        half = [(lambda ci: (ci[1] - ci[0]) / 2)(qs.welch_interval(with_spread(std_a, k, 1.0),
                                                                   with_spread(std_b, k))["ci95"])
                for k in (n - 1, n)]
        assert half[1] < 0.35 and (n == 2 or half[0] >= 0.35)
        assert half[1] == pytest.approx(qe.welch_half_width(std_a, std_b, n))
    # by hand: se = sqrt((0.43^2 + 0.22^2) / n); n 9: df 11.9, t 2.180, half 0.351; n 10: df 13.4, t 2.153, 0.329
    assert qe.seeds_needed(0.43, 0.22, 0.35) == 10
    assert qe.seeds_needed(50.0, 50.0, 0.35) is None  # beyond MOST_SEEDS


def test_width_and_equivalence_of_one_difference():
    welch = qs.welch_interval(SYSTEM, BASELINE)
    boot = {"difference": welch["difference"], "ci95": [-0.9, 0.1], "ci90": [-0.8, 0.0]}
    entry = qe.equivalence(boot, welch, SYSTEM, BASELINE, "hybrid")
    assert entry["reading"] == "not decided" and entry["margin"] == 0.5
    width = entry["width"]
    assert width["bootstrap_half_width"] == pytest.approx(0.5)
    assert width["welch_half_width"] == pytest.approx((welch["ci95"][1] - welch["ci95"][0]) / 2)
    assert width["met"] is False
    assert width["seeds_needed"] == qe.seeds_needed(statistics.stdev(SYSTEM), statistics.stdev(BASELINE))
    narrow = qe.width({"ci95": [-0.3, 0.3]}, {"ci95": [-0.34, 0.34]}, SYSTEM, BASELINE)
    assert narrow["met"] is True
    assert qe.width({"ci95": [-0.3, 0.3]}, {"ci95": None}, [1.0], BASELINE)["met"] is False


def test_the_report_prints_the_reading_its_intervals_and_the_width():
    from benchmarks import quality_report

    welch = qs.welch_interval(SYSTEM, BASELINE)
    boot = {"difference": welch["difference"], "ci95": [-0.9, 0.1], "ci90": [-0.8, 0.0]}
    measure = {"difference": welch["difference"], "equivalence": qe.equivalence(boot, welch, SYSTEM, BASELINE,
                                                                                 "hybrid")}
    report = {"models": {"hybrid": {"name": "hybrid_lstm"}, "lstm": {"name": "fairseq lstm"}},
              "comparisons": {"hybrid - lstm": {"system": "hybrid", "baseline": "lstm", "measures": {
                  "BLEU": measure, "BLEU, best lenpen": measure}}}}
    lines = quality_report.equivalence_section(report)
    rows = [line for line in lines if line.startswith("| hybrid_lstm − fairseq lstm | BLEU")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    half = (welch["ci95"][1] - welch["ci95"][0]) / 2
    assert cells[3] == "[-0.80, +0.00]" and cells[5] == "**not decided**"
    assert cells[6] == f"±0.50 / ±{half:.2f}" and cells[7] == "no"
    assert cells[8] == str(qe.seeds_needed(statistics.stdev(SYSTEM), statistics.stdev(BASELINE)))


@pytest.mark.parametrize("width, seeds, most, expected", [
    ({"met": True, "seeds_needed": 8}, 10, 20, None),  # the target is met: no more seeds
    ({"met": False, "seeds_needed": 12}, 10, 20, 12),  # to what the spread needs
    ({"met": False, "seeds_needed": 12}, 10, 11, 11),  # ... at most --grow-to
    ({"met": False, "seeds_needed": 8}, 10, 20, 11),  # Welch needs fewer, the bootstrap is wider: one more
    ({"met": False, "seeds_needed": None}, 10, 20, 20),  # beyond MOST_SEEDS: as many as allowed
    ({"met": False, "seeds_needed": 12}, 20, 20, None),  # the cap reached: the study ends unmet
])
def test_the_study_grows_by_the_spread_up_to_its_cap(width, seeds, most, expected):
    assert qe.grown_seed_count(width, seeds, most) == expected
