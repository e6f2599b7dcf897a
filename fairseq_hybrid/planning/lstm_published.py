"""Published cuDNN LSTM timings over sentences per call, and the saturating curve fitted to
them: the evidence behind a profile's LSTM rate at a batch size.

What this module owns: the transcribed measurements (``V100_TIMINGS``), the fit of
``rate(B) = peak * B / (B + b_half)`` to one GPU's points (``fit_saturating``), and the
rule that carries the V100 curve's shape to GPUs without published points
(``carry_over``, ``lstm_curves``). ``profiles.py`` builds every GPU profile's LSTM rate
from these curves (``analytic.recurrent_seconds`` charges them).

Source (the only published cuDNN LSTM batch-size sweep found for a profile's GPU):
  Baidu DeepBench, https://github.com/baidu-research/DeepBench, commit
  da81ba7820739e2e506dc27f382d15be5479f98f (file last changed in 30c51150869e, 2019-10-07,
  "update NVIDIA results"), ``results/train/DeepBench_NV_V100.xlsx``, section "Recurrent
  Layers - LSTM", rows 292-303 ("Machine Translation": hidden 512, 1024, 2048 x batch
  N = 16, 32, 64, 128, 25 time steps) of the sheets "Results - FP16 ip, Mixed math" and
  "Results FP32"; columns "Time Forward (msec)", "Time Backward wrt Inputs (msec)",
  "Time Backward wrt Weights (msec)". Its "Specs" sheet: NVIDIA V100 in an NVIDIA DGX-1
  (SXM2), CUDA 10.1.243, cuDNN 7.6.2.24, driver 418.67.
  How it was measured (``code/nvidia/rnn_bench.cu``, ``cudnn_helper.h`` at that commit):
  one layer, unidirectional, ``CUDNN_SKIP_INPUT`` (no input projection: the README's
  "the time for the calculation of Wx_t for all t should not be included"),
  ``CUDNN_RNN_ALGO_STANDARD`` (not the persistent kernels), fp16 sheet with
  ``CUDNN_TENSOR_OP_MATH``; each time the mean of 100 calls after one warm-up, truncated
  to whole microseconds.

FLOPs: the project's count (``analytic.lstm_flops_per_token``), 2 * 4 * hidden *
(inputs + hidden) forward per token with inputs = 0 here (no input projection), backward
twice forward; so "training" is 3x the forward FLOPs over forward + both backward times.
This is DeepBench's own count: its "TERAFLOPS FWD" column is 8 * hidden^2 * N * T / time.

The curve: time per call linear in the batch, t(B) = t0 + B * t1 (a per-step floor: the
recurrent weights read and the kernels launched every step, whatever the batch; plus work
per sentence), gives rate = peak * B / (B + b_half) with peak = FLOPs per sentence / t1
and b_half = t0 / t1. Fitted by least squares on the relative time error (a closed-form
weighted linear fit; to first order the least squares of log rate). It reproduces the V100
fp16 hidden 1024 and 2048 training points within 1%; a power law rate = a * B^p, the other
2-parameter form tried, misses the same points by 2.6-4.4% and never saturates. Poor fits:
fp16 hidden 512 (its N=16 forward, 0.441 ms, is faster than N=32, 0.804 ms) and fp32 at
hidden 1024/2048, which saturate (the fp32 units) faster than the form bends.

Published points run from 16 to 128 sentences only: b_half (V100, fp16, hidden 1024,
training: ~290 sentences) lies beyond them, so ``peak`` is an extrapolation, not a
measured rate (at 128 sentences the V100 reaches 21 TFLOP/s, ~30% of it). At hidden 2048
the fitted peak, 133 TFLOP/s, even exceeds the V100's 125 TFLOP/s data sheet: read the
curve within 16-128 sentences, and beyond it as an upper estimate.

Not found: any published cuDNN LSTM batch-size sweep on an A100 or H100 with times (the
FlashRNN paper, arXiv 2412.07752, plots H100 nn.LSTM runtimes over batch size at hidden
768, but its repository, NX-AI/flashrnn, holds neither the CSVs its notebooks read nor
their outputs; PyTorch's persistent-RNN heuristics for sm80, pytorch/pytorch#43165, cite
an attached spreadsheet of speed-ups, not times). DeepBench's T4 sheets leave the LSTM
rows empty; its P100 rows are not monotonic in the batch (hidden 1024: backward wrt
inputs 13.785 ms at N=32, 4.645 ms at N=64) and come from cuDNN 6.

ASSUMPTION for A100 and H100 (``carry_over``): the V100 curve's shape with b_half scaled
by (dense 16-bit peak ratio) / (memory bandwidth ratio) and peak by the peak ratio. Reason:
t1 (per-sentence work) shrinks with the compute rate, t0 (the per-step floor) with the
bandwidth that reads the weights every step, so b_half = t0 / t1 scales as peak /
bandwidth, and the small-batch rate (peak / b_half per sentence) with the bandwidth. The
same rule taken from V100 fp32 to V100 fp16 (8x the peak, half the weight bytes) predicts
b_half 4.0x; the fits give 3.3x for training (2.3x forward): the rule overstates the
small-batch slowdown somewhat. The V100's small-batch floor is not bandwidth alone (47 us
a step forward at hidden 1024 against 9 us to read 8 MiB of fp16 weights at 0.9 TB/s):
launches and a partly filled GPU count too, and they need not scale as assumed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

PHASES = ("forward", "training")
PUBLISHED_HIDDEN = (512, 1024, 2048)  # the hidden sizes of the published rows

DEEPBENCH_COMMIT = "da81ba7820739e2e506dc27f382d15be5479f98f"
DEEPBENCH_V100 = "results/train/DeepBench_NV_V100.xlsx"
FP16_SHEET = "Results - FP16 ip, Mixed math"
FP32_SHEET = "Results FP32"
FP16_TENSOR_OP = "fp16 data, tensor-op math"
FP32 = "fp32"


@dataclass(frozen=True)
class PublishedLstmTiming:
    """One published call of one LSTM layer: ``steps`` time steps over ``batch``
    sentences, its forward and backward times in seconds."""
    gpu: str
    precision: str
    hidden: int
    inputs: int  # 0: the input projection is not in the timed call
    steps: int
    batch: int
    forward_s: float
    backward_data_s: float
    backward_weights_s: float
    source: str

    @property
    def training_s(self) -> float:
        return self.forward_s + self.backward_data_s + self.backward_weights_s

    def flops(self, phase: str) -> float:
        forward = 2 * 4 * self.hidden * (self.inputs + self.hidden) * self.steps * self.batch
        return forward * (3 if check_phase(phase) == "training" else 1)

    def seconds(self, phase: str) -> float:
        return self.training_s if check_phase(phase) == "training" else self.forward_s

    def rate(self, phase: str) -> float:
        """Achieved FLOP/s."""
        return self.flops(phase) / self.seconds(phase)


def check_phase(phase: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
    return phase


# (spreadsheet row, hidden, batch N, time steps, forward ms, backward wrt inputs ms,
#  backward wrt weights ms), as the cells read
_V100_FP16_ROWS = (
    (292, 512, 16, 25, 0.441, 0.891, 0.079),
    (293, 512, 32, 25, 0.804, 0.954, 0.070),
    (294, 512, 64, 25, 0.790, 1.051, 0.115),
    (295, 512, 128, 25, 0.858, 1.119, 0.221),
    (296, 1024, 16, 25, 1.235, 1.429, 0.151),
    (297, 1024, 32, 25, 1.279, 1.484, 0.227),
    (298, 1024, 64, 25, 1.391, 1.567, 0.341),
    (299, 1024, 128, 25, 1.627, 1.700, 0.516),
    (300, 2048, 16, 25, 2.209, 2.151, 0.415),
    (301, 2048, 32, 25, 2.198, 2.317, 0.562),
    (302, 2048, 64, 25, 2.302, 2.475, 0.862),
    (303, 2048, 128, 25, 2.644, 2.847, 1.409),
)
_V100_FP32_ROWS = (
    (292, 512, 16, 25, 1.095, 0.937, 0.165),
    (293, 512, 32, 25, 1.144, 1.014, 0.271),
    (294, 512, 64, 25, 1.341, 1.257, 0.436),
    (295, 512, 128, 25, 1.559, 1.594, 0.703),
    (296, 1024, 16, 25, 1.923, 1.657, 0.445),
    (297, 1024, 32, 25, 1.978, 1.746, 0.698),
    (298, 1024, 64, 25, 2.205, 2.044, 1.158),
    (299, 1024, 128, 25, 3.249, 3.017, 2.107),
    (300, 2048, 16, 25, 3.609, 3.137, 1.254),
    (301, 2048, 32, 25, 3.684, 3.312, 2.167),
    (302, 2048, 64, 25, 5.570, 4.871, 4.100),
    (303, 2048, 128, 25, 9.294, 8.450, 7.847),
)


def _deepbench_v100(precision: str, sheet: str, rows) -> Tuple[PublishedLstmTiming, ...]:
    return tuple(
        PublishedLstmTiming(
            gpu="V100", precision=precision, hidden=hidden, inputs=0, steps=steps,
            batch=batch, forward_s=fwd * 1e-3, backward_data_s=bwd_data * 1e-3,
            backward_weights_s=bwd_weights * 1e-3,
            source=(f"DeepBench {DEEPBENCH_COMMIT[:12]} {DEEPBENCH_V100}, sheet '{sheet}', "
                    f"row {row}"))
        for row, hidden, batch, steps, fwd, bwd_data, bwd_weights in rows)


V100_TIMINGS: Tuple[PublishedLstmTiming, ...] = (
    _deepbench_v100(FP16_TENSOR_OP, FP16_SHEET, _V100_FP16_ROWS)
    + _deepbench_v100(FP32, FP32_SHEET, _V100_FP32_ROWS))


def select(timings: Sequence[PublishedLstmTiming], precision: str,
           hidden: int) -> Tuple[PublishedLstmTiming, ...]:
    """The timings of one precision and hidden size, by batch."""
    chosen = tuple(sorted((t for t in timings if t.precision == precision and t.hidden == hidden),
                          key=lambda t: t.batch))
    if not chosen:
        raise ValueError(f"no published timing at precision {precision!r} and hidden {hidden}; "
                         f"published: {sorted({(t.precision, t.hidden) for t in timings})}")
    return chosen


@dataclass(frozen=True)
class SaturatingCurve:
    """rate(B) = peak_flops * B / (B + b_half): half the peak at b_half sentences."""
    peak_flops: float
    b_half: float
    basis: str

    def rate(self, sentences: float) -> float:
        if sentences <= 0:
            raise ValueError(f"sentences {sentences} must be positive")
        return self.peak_flops * sentences / (sentences + self.b_half)


@dataclass(frozen=True)
class CurveFit:
    curve: SaturatingCurve
    residuals: Tuple[Tuple[int, float, float], ...]  # (batch, measured FLOP/s, fitted FLOP/s)

    @property
    def max_relative_error(self) -> float:
        return max(abs(fitted / measured - 1) for _, measured, fitted in self.residuals)


def fit_saturating(timings: Sequence[PublishedLstmTiming], phase: str = "training") -> CurveFit:
    """The curve through one GPU's timings of one layer shape over batch sizes: t(B) = t0 +
    B * t1 fitted to minimise the squared relative time errors, then peak = FLOPs per
    sentence / t1, b_half = t0 / t1."""
    check_phase(phase)
    if not timings:
        raise ValueError("no timings to fit")
    shapes = {(t.gpu, t.precision, t.hidden, t.inputs, t.steps) for t in timings}
    if len(shapes) > 1:
        raise ValueError(f"timings of several GPUs or layer shapes {sorted(shapes)}: fit one at a time")
    if len({t.batch for t in timings}) < 2:
        raise ValueError(f"batch sizes {sorted({t.batch for t in timings})}: a fit needs at least two")
    weights = [1 / t.seconds(phase) ** 2 for t in timings]
    s = sum(weights)
    sx = sum(w * t.batch for w, t in zip(weights, timings))
    sxx = sum(w * t.batch ** 2 for w, t in zip(weights, timings))
    sy = sum(w * t.seconds(phase) for w, t in zip(weights, timings))
    sxy = sum(w * t.batch * t.seconds(phase) for w, t in zip(weights, timings))
    per_sentence = (s * sxy - sx * sy) / (s * sxx - sx * sx)
    floor = (sy - per_sentence * sx) / s
    if per_sentence <= 0 or floor < 0:
        raise ValueError(f"times {[t.seconds(phase) for t in timings]} do not grow with the batch "
                         f"from a non-negative floor: no saturating curve fits them")
    first = timings[0]
    flops_per_sentence = first.flops(phase) / first.batch
    curve = SaturatingCurve(
        flops_per_sentence / per_sentence, floor / per_sentence,
        f"fitted to {len(timings)} {first.gpu} {first.precision} hidden {first.hidden} {phase} "
        f"timings ({first.source.split(', row')[0]})")
    residuals = tuple((t.batch, t.rate(phase), curve.rate(t.batch))
                      for t in sorted(timings, key=lambda t: t.batch))
    return CurveFit(curve, residuals)


@dataclass(frozen=True)
class DataSheet:
    """A GPU's data-sheet rates (as in ``profiles.py``'s notes)."""
    name: str
    dense_16bit_flops: float  # tensor cores, dense
    memory_bytes_per_s: float


DATASHEETS: Dict[str, DataSheet] = {
    "v100": DataSheet("V100 SXM2", 125e12, 0.9e12),
    "a100-sxm": DataSheet("A100 SXM 80GB", 312e12, 2.0e12),
    "h100-sxm": DataSheet("H100 SXM 80GB", 989e12, 3.35e12),
}


def carry_over(curve: SaturatingCurve, source: DataSheet, target: DataSheet) -> SaturatingCurve:
    """The ASSUMPTION of the module docstring: peak scaled by the dense 16-bit peak ratio,
    b_half by that ratio over the memory-bandwidth ratio (the small-batch rate, peak /
    b_half per sentence, scales with the bandwidth)."""
    compute = target.dense_16bit_flops / source.dense_16bit_flops
    bandwidth = target.memory_bytes_per_s / source.memory_bytes_per_s
    return SaturatingCurve(
        curve.peak_flops * compute, curve.b_half * compute / bandwidth,
        f"no published points: the {source.name} curve carried over (peak x {compute:.2f}, "
        f"b_half x {compute:.2f} / {bandwidth:.2f})")


def lstm_curves(hidden: int = 1024, phase: str = "training") -> Dict[str, SaturatingCurve]:
    """Per profile name: the V100 curve fitted to DeepBench's fp16 tensor-op points at this
    hidden size, and the A100 and H100 curves carried over from it."""
    v100 = fit_saturating(select(V100_TIMINGS, FP16_TENSOR_OP, hidden), phase).curve
    return {name: v100 if name == "v100" else carry_over(v100, DATASHEETS["v100"], sheet)
            for name, sheet in DATASHEETS.items()}


def comparison_table(hidden: int = 1024, phase: str = "training",
                     batches: Sequence[int] = (16, 32, 64, 128, 256)) -> str:
    """A markdown table: per profile, the published rate (TFLOP/s) at each batch beside the
    curve's; "-" where nothing is published."""
    published = {t.batch: t.rate(phase) for t in select(V100_TIMINGS, FP16_TENSOR_OP, hidden)}
    lines = ["| GPU | curve | " + " | ".join(f"B={b}" for b in batches) + " |",
             "| --- | --- | " + " | ".join("---" for _ in batches) + " |"]
    for name, curve in lstm_curves(hidden, phase).items():
        cells = []
        for b in batches:
            point = published.get(b) if name == "v100" else None
            measured = f"{point / 1e12:.1f}" if point else "-"
            cells.append(f"{measured} / {curve.rate(b) / 1e12:.1f}")
        lines.append(f"| {name} | peak {curve.peak_flops / 1e12:.0f} TFLOP/s, b_half "
                     f"{curve.b_half:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
