"""The published cuDNN LSTM timings and the saturating curve fitted to them
(fairseq_hybrid/planning/lstm_published.py): the transcription against the spreadsheet's
own totals and TFLOP/s, the fit against known parameters and against the points, the
carry-over rule, and the refusals."""
import math
from dataclasses import replace

import pytest

from fairseq_hybrid.planning.analytic import lstm_flops_per_token
from fairseq_hybrid.planning.lstm_published import (
    DATASHEETS, DEEPBENCH_COMMIT, FP16_TENSOR_OP, FP32, V100_TIMINGS, PublishedLstmTiming,
    SaturatingCurve, carry_over, comparison_table, fit_saturating, lstm_curves, select)

# The spreadsheet's "Total Time" column (M, ms), rows 292-303, fp16 sheet then fp32 sheet:
# a second reading of the file, against which the three transcribed times must add up.
TOTAL_MS = {
    FP16_TENSOR_OP: [1.411, 1.828, 1.956, 2.198, 2.815, 2.99, 3.299, 3.843,
                     4.775, 5.077, 5.639, 6.9],
    FP32: [2.197, 2.429, 3.034, 3.856, 4.025, 4.422, 5.407, 8.373,
           8.0, 9.163, 14.541, 25.591],
}
# The spreadsheet's "TERAFLOPS FWD" column (J) for a few rows: DeepBench's own FLOP count.
DEEPBENCH_FWD_TFLOPS = {
    (FP16_TENSOR_OP, 512, 16): 1.9021786848072564,
    (FP16_TENSOR_OP, 1024, 128): 16.498798770743701,
    (FP16_TENSOR_OP, 2048, 64): 23.321933622936573,
    (FP32, 1024, 64): 6.0869717913832195,
    (FP32, 2048, 128): 11.553064600817732,
}
V100_FP32_DATASHEET_FLOPS = 15.7e12


def synthetic(peak: float, b_half: float, batches, hidden: int = 1024, steps: int = 25):
    """Timings whose training times follow the curve exactly."""
    out = []
    for b in batches:
        flops = 3 * 2 * 4 * hidden * hidden * steps * b
        total = flops / (peak * b / (b + b_half))
        out.append(PublishedLstmTiming("GPU", "p", hidden, 0, steps, b, total / 3, total / 3,
                                       total / 3, "synthetic"))
    return out


def test_every_measurement_names_its_source_file_sheet_and_row():
    assert len(V100_TIMINGS) == 24
    for t in V100_TIMINGS:
        assert DEEPBENCH_COMMIT[:12] in t.source and "DeepBench_NV_V100.xlsx" in t.source
        assert "sheet '" in t.source and ", row " in t.source
    rows = [(t.precision, t.source.rsplit("row ", 1)[1]) for t in V100_TIMINGS]
    assert len(set(rows)) == len(rows)


@pytest.mark.parametrize("precision", [FP16_TENSOR_OP, FP32])
def test_transcribed_times_add_up_to_the_spreadsheets_totals(precision):
    timings = [t for t in V100_TIMINGS if t.precision == precision]
    assert [round(t.training_s * 1e3, 3) for t in timings] == TOTAL_MS[precision]


def test_flops_are_the_projects_count_and_match_deepbenchs_tflops_column():
    for (precision, hidden, batch), tflops in DEEPBENCH_FWD_TFLOPS.items():
        t = next(t for t in V100_TIMINGS
                 if (t.precision, t.hidden, t.batch) == (precision, hidden, batch))
        assert t.flops("forward") == lstm_flops_per_token(0, hidden) * t.steps * batch
        assert t.flops("training") == 3 * t.flops("forward")
        assert t.rate("forward") / 1e12 == pytest.approx(tflops, rel=1e-9)


def test_fit_recovers_known_parameters_from_exact_points():
    fit = fit_saturating(synthetic(70e12, 300.0, [16, 32, 64, 128]))
    assert fit.curve.peak_flops == pytest.approx(70e12, rel=1e-9)
    assert fit.curve.b_half == pytest.approx(300.0, rel=1e-9)
    assert fit.max_relative_error < 1e-9


def test_fit_of_noisy_points_stays_near_the_truth_and_reports_the_noise():
    points = synthetic(50e12, 100.0, [8, 16, 32, 64, 128, 256])
    noisy = [replace(t, forward_s=t.forward_s * (1 + 0.03 * (-1) ** i))
             for i, t in enumerate(points)]
    fit = fit_saturating(noisy)
    assert fit.curve.peak_flops == pytest.approx(50e12, rel=0.1)
    assert fit.curve.b_half == pytest.approx(100.0, rel=0.15)
    assert 0.005 < fit.max_relative_error < 0.03


@pytest.mark.parametrize("precision, hidden, phase, tolerance", [
    (FP16_TENSOR_OP, 1024, "training", 0.01),
    (FP16_TENSOR_OP, 2048, "training", 0.01),
    (FP16_TENSOR_OP, 1024, "forward", 0.01),
    (FP16_TENSOR_OP, 2048, "forward", 0.03),
    (FP32, 512, "training", 0.04),
    (FP32, 1024, "training", 0.06),
    (FP32, 2048, "training", 0.09),
    (FP16_TENSOR_OP, 512, "training", 0.12),  # its N=16 forward beats N=32
])
def test_fitted_curve_passes_near_each_published_point(precision, hidden, phase, tolerance):
    timings = select(V100_TIMINGS, precision, hidden)
    fit = fit_saturating(timings, phase)
    assert [b for b, _, _ in fit.residuals] == [16, 32, 64, 128]
    for batch, measured, fitted in fit.residuals:
        assert abs(fitted / measured - 1) <= tolerance, (batch, measured, fitted)


def test_v100_fp16_curve_is_far_from_saturated_at_64_sentences():
    """What the fit says of the profile's old assumption (full rate from 64 sentences)."""
    curve = lstm_curves(1024)["v100"]
    assert 250 < curve.b_half < 350
    assert curve.rate(64) < 0.25 * curve.peak_flops
    assert curve.peak_flops < DATASHEETS["v100"].dense_16bit_flops


def test_carry_over_scales_peak_with_compute_and_small_batch_rate_with_bandwidth():
    v100 = DATASHEETS["v100"]
    curves = lstm_curves(1024)
    for name in ("a100-sxm", "h100-sxm"):
        target = DATASHEETS[name]
        curve = curves[name]
        assert "no published points" in curve.basis
        assert curve.peak_flops / curves["v100"].peak_flops == pytest.approx(
            target.dense_16bit_flops / v100.dense_16bit_flops)
        small_batch_slope = curve.peak_flops / curve.b_half
        assert small_batch_slope / (curves["v100"].peak_flops / curves["v100"].b_half) == \
            pytest.approx(target.memory_bytes_per_s / v100.memory_bytes_per_s)


def test_the_carry_over_rule_against_the_one_in_data_check_fp32_to_fp16():
    """Same GPU, 8x the peak, half the weight bytes: the rule's b_half ratio (4.0) against
    the fits' (3.3 training): within the factor 1.3 the module docstring states."""
    fp32 = fit_saturating(select(V100_TIMINGS, FP32, 1024)).curve
    fp16 = fit_saturating(select(V100_TIMINGS, FP16_TENSOR_OP, 1024)).curve
    source = DATASHEETS["v100"]
    as_if_fp32 = replace(source, dense_16bit_flops=V100_FP32_DATASHEET_FLOPS,
                         memory_bytes_per_s=source.memory_bytes_per_s / 2)
    predicted = carry_over(fp32, as_if_fp32, source).b_half
    assert 1.0 < predicted / fp16.b_half < 1.3


def test_comparison_table_shows_points_beside_the_curve():
    table = comparison_table(1024).splitlines()
    assert table[0] == "| GPU | curve | B=16 | B=32 | B=64 | B=128 | B=256 |"
    v100 = next(line for line in table if line.startswith("| v100")).split(" | ")[2:]
    curve = lstm_curves(1024)["v100"]
    for t, cell in zip(select(V100_TIMINGS, FP16_TENSOR_OP, 1024), v100):
        assert cell == f"{t.rate('training') / 1e12:.1f} / {curve.rate(t.batch) / 1e12:.1f}"
    assert v100[4].startswith("- / ")  # nothing published at 256 sentences
    h100 = next(line for line in table if line.startswith("| h100-sxm"))
    assert h100.count("- / ") == 5


@pytest.mark.parametrize("call, message", [
    (lambda: fit_saturating(V100_TIMINGS), "several GPUs or layer shapes"),
    (lambda: fit_saturating(select(V100_TIMINGS, FP32, 1024)[:1]), "at least two"),
    (lambda: fit_saturating([]), "no timings"),
    (lambda: fit_saturating(select(V100_TIMINGS, FP32, 1024), "backward"), "'backward' is not one of"),
    (lambda: select(V100_TIMINGS, FP32, 1000), "hidden 1000"),
    (lambda: SaturatingCurve(1e12, 10, "x").rate(0), "sentences 0"),
    (lambda: fit_saturating([replace(t, batch=b) for t, b in
                             zip(select(V100_TIMINGS, FP32, 1024), (128, 64, 32, 16))]),
     "do not grow with the batch"),
])
def test_bad_input_is_refused_in_one_line(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_rates_are_finite_and_rise_with_the_batch():
    for curve in lstm_curves(2048).values():
        rates = [curve.rate(b) for b in (1, 16, 64, 256, 4096)]
        assert all(math.isfinite(r) for r in rates) and rates == sorted(rates)
