"""Time to quality (benchmarks/quality_time.py) on synthetic run records: which validation a
run is credited with (the first at or below the loss, no interpolation), the common loss, the
one-thread seconds from the undisturbed speed, the seed intervals and ratios against
independent computations, a curve that is not one run refused, and runs judged as if
uninterrupted."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks import quality_time as qt
from benchmarks.quality_runs import BenchmarkError, Schedule, as_uninterrupted

TOKENS_PER_UPDATE = 1600.0


def record(model: str, seed: int, losses, seconds_per_interval, interval: int = 250):
    """A stored run: one validation every ``interval`` updates with these losses, each interval
    taking these training seconds (a slow one = a disturbed interval)."""
    curve, seconds = [], 0.0
    for k, (loss, dt) in enumerate(zip(losses, seconds_per_interval), 1):
        seconds += dt
        curve.append({"updates": k * interval, "loss": loss, "nll_loss": loss - 1, "ppl": 2 ** (loss - 1),
                      "train_seconds": seconds, "train_tokens": k * interval * TOKENS_PER_UPDATE})
    return {"model": model, "seed": seed, "curve": curve}


def nearest_rank_90th(values):
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def test_a_run_reaches_a_loss_at_the_first_validation_at_or_below_it_without_interpolation():
    run = record("lstm", 1, [7.0, 6.3, 6.01, 5.95, 5.90, 5.90, 5.93], [100, 100, 100, 100, 100, 100, 100])
    at = qt.reach(run, 6.0)
    # 6.01 is above the target: the run is credited with the validation at 1,000 updates (5.95),
    # not with an interpolated point between 750 and 1,000
    assert at["updates"] == 1000 and at["validation_loss"] == 5.95
    assert at["train_tokens"] == 1000 * TOKENS_PER_UPDATE
    assert qt.reach(run, 6.3)["updates"] == 500  # at the target counts
    own = qt.reach(run, min(p["loss"] for p in run["curve"]))
    assert own["updates"] == 1250  # the first of two equal best losses: the best checkpoint's
    with pytest.raises(BenchmarkError, match="lstm seed 1 never reaches validation loss 5.8"):
        qt.reach(run, 5.8)


def test_one_thread_seconds_are_tokens_over_the_undisturbed_speed():
    # intervals of 400,000 tokens; the 3rd and 5th were slowed by other work
    dts = [120, 100, 400, 98, 1000, 102, 100, 99, 101, 100, 100]
    run = record("hybrid", 2, [7.0 - 0.1 * k for k in range(len(dts))], dts)
    speeds = [250 * TOKENS_PER_UPDATE / dt for dt in dts[1:]]  # the first interval (warm-up) left out
    speed = nearest_rank_90th(speeds)
    assert speed == pytest.approx(400000 / 99)
    at = qt.reach(run, 6.5)
    assert at["updates"] == 6 * 250
    assert at["one_thread_seconds"] == pytest.approx(6 * 250 * TOKENS_PER_UPDATE / speed)
    # the wall time would say 1820 s; the undisturbed reading 594 s
    assert at["one_thread_seconds"] == pytest.approx(594.0)


def test_seed_interval_is_the_t_interval_of_the_mean():
    values = [1500.0, 2250.0, 2000.0, 3500.0, 2750.0]
    got = qt.seed_interval(values)
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))
    assert got["mean"] == pytest.approx(2400.0) and got["ci95"] == pytest.approx([low, high])
    assert qt.seed_interval([7.0]) == {"mean": 7.0, "ci95": None, "n": 1, "values": [7.0]}


def test_ratio_interval_by_hand():
    draws = [(np.array([0, 0]), np.array([1, 1])),  # 1 / 4
             (np.array([1, 1]), np.array([0, 0])),  # 3 / 2
             (np.array([0, 1]), np.array([0, 1]))]  # 2 / 3
    got = qt.ratio_interval([1.0, 3.0], [2.0, 4.0], draws=draws)
    assert got["ratio"] == pytest.approx(2 / 3) and got["ci95"] == pytest.approx([0.25, 1.5])
    random = qt.ratio_interval([1.0, 3.0, 2.0], [2.0, 4.0, 3.0], samples=200)
    assert random["samples"] == 200 and random["ci95"][0] <= 2 / 3 <= random["ci95"][1]


def test_a_curve_that_goes_back_is_not_one_run():
    run = record("hybrid_if", 3, [7.0, 6.5, 6.2], [100, 100, 100])
    run["curve"][2]["train_tokens"] = run["curve"][0]["train_tokens"]
    with pytest.raises(BenchmarkError, match="hybrid_if seed 3: its curve goes back at update 750"):
        qt.analyse([run], [])


def test_analyse_uses_the_common_loss_every_run_reaches_and_the_runs_as_uninterrupted():
    schedule = Schedule(max_update=16000, interval=250, patience=2)
    flat = [100.0] * 5
    stored = [
        # lstm seed 1 trained past its patience stop (update 1250) after a resume, faster: those
        # intervals are not the uninterrupted run's and must not raise its undisturbed speed
        record("lstm", 1, [7.0, 6.4, 6.0, 6.1, 6.05, 6.2, 6.3, 6.0, 6.02], flat + [50.0] * 4),
        record("lstm", 2, [7.0, 6.2, 5.9, 6.0, 6.0], flat),
        record("hybrid", 1, [6.8, 6.1, 5.95, 6.0, 6.0], [50.0] * 5),
        record("hybrid", 2, [6.9, 6.0, 6.3, 6.3], [50.0] * 4),
    ]
    runs = [as_uninterrupted(r, schedule) for r in stored]
    assert runs[0]["curve"][-1]["updates"] == 1250 and len(stored[0]["curve"]) == 9
    result = qt.analyse(runs, [("hybrid", "lstm")], samples=50)
    assert result["common_loss"] == 6.0  # bests: lstm 6.0, 5.9; hybrid 5.95, 6.0
    own = {(r["model"], r["seed"]): r["own_best"]["updates"] for r in result["runs"]}
    common = {(r["model"], r["seed"]): r["common"]["updates"] for r in result["runs"]}
    assert own == {("lstm", 1): 750, ("lstm", 2): 750, ("hybrid", 1): 750, ("hybrid", 2): 500}
    assert common == {("lstm", 1): 750, ("lstm", 2): 750, ("hybrid", 1): 750, ("hybrid", 2): 500}
    # one-thread seconds: 400,000 tokens per interval in 100 s (lstm) or 50 s (hybrid)
    lstm_seconds = [750 * TOKENS_PER_UPDATE / 4000] * 2
    hybrid_seconds = [750 * TOKENS_PER_UPDATE / 8000, 500 * TOKENS_PER_UPDATE / 8000]
    models = result["models"]
    assert models["lstm"]["common"]["one_thread_seconds"]["values"] == pytest.approx(lstm_seconds)
    assert models["hybrid"]["common"]["one_thread_seconds"]["mean"] == pytest.approx(np.mean(hybrid_seconds))
    assert models["hybrid"]["own_best"]["train_tokens"]["mean"] == pytest.approx(625 * TOKENS_PER_UPDATE)
    ratio = result["ratios_to_common"]["hybrid / lstm"]
    assert ratio["one_thread_seconds"]["ratio"] == pytest.approx(np.mean(hybrid_seconds) / np.mean(lstm_seconds))
    assert ratio["train_tokens"]["ratio"] == pytest.approx(625 / 750)


def test_the_report_prints_time_to_quality_beside_bleu():
    from benchmarks import quality_report

    runs = [record("lstm", s, [7.0, 6.2, 6.0 - 0.1 * s], [100.0] * 3) for s in (1, 2)]
    runs += [record("hybrid", s, [6.8, 6.0 - 0.1 * s, 6.1], [50.0] * 3) for s in (1, 2)]
    time = qt.analyse(runs, [("hybrid", "lstm")], samples=50)
    time["models"]["lstm"]["bleu"] = qt.seed_interval([4.8, 4.9])
    time["models"]["hybrid"]["bleu"] = qt.seed_interval([4.4, 4.5])
    report = {"models": {"lstm": {"name": "fairseq lstm"}, "hybrid": {"name": "hybrid_lstm"}},
              "time_to_quality": time}
    lines = quality_report.time_section(report)
    assert any("common loss 5.900" in line for line in lines)
    row = next(line for line in lines if line.startswith("| hybrid_lstm |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    bleu = qt.seed_interval([4.4, 4.5])
    assert cells[1] == f"4.45 [{bleu['ci95'][0]:.2f}, {bleu['ci95'][1]:.2f}]"
    # own best at 500 updates for both seeds (no spread: the interval is the mean); common loss 5.9 likewise
    minutes = 500 * TOKENS_PER_UPDATE / 8000 / 60
    assert cells[2] == "500 [500, 500]" and cells[4] == f"{minutes:.1f} [{minutes:.1f}, {minutes:.1f}]"
    assert cells[5] == "500 [500, 500]"
    ratio = next(line for line in lines if line.startswith("- hybrid_lstm / fairseq lstm"))
    # lstm reaches 5.9 at 750 updates at 4,000 tokens/s; hybrid at 500 updates at 8,000 tokens/s
    assert f"one-thread time {(500 / 8000) / (750 / 4000):.2f}" in ratio and f"target tokens {500 / 750:.2f}" in ratio
