"""The LSTM's rate over sentences per call, measured on this device and fitted the way the
published curves are (``make gpu-check``'s ``lstm-sweep`` check):

    python -m benchmarks.lstm_sweep [--device cuda:0] [--hidden 1000] [--steps 32] \
        [--batches 16,32,64,128,256] [--dtype float16] [--json results/bench/lstm-sweep.json]

What it times, per batch size: one layer as the model runs it (``initialized_layers.
lstm_layer``, ``lstm_stack.run_layer`` over whole sentences from a zero state; torch's
``nn.LSTM``, cuDNN on a GPU), forward and forward + backward, in the training precision
(``float16`` on CUDA: fairseq's ``--fp16`` casts parameters and activations to half;
``float32`` on the CPU), and the layer's input projection alone (``W_ih x + b_ih`` for every
step, forward and backward: the same matrix products the layer runs). The layer less its
projection is the recurrent part — what the published cuDNN calls time (DeepBench skips the
input projection) and what a profile's curves stand for (``planning/lstm_published.py``;
``planning/analytic.py`` charges the projection as a matrix product of its own). Those
times are fitted with the published curves' own fit (``lstm_published.fit_saturating``:
``rate(B) = peak * B / (B + b_half)``), printed beside each GPU profile's curve at the
nearest published hidden size, and the pipeline model (``pipeline_profile.profile_report``,
= ``python -m benchmarks.pipeline_model --profile NAME --lstm-sweep FILE``) is run with the
measured curves in place of the profile's.

Each time is the fastest of ``--repeats`` calls after warm-up calls, the device synchronised
around each (``timed_calls`` says why the fastest). On the CPU the same code runs (the test
runs it at small sizes); a CPU's curve in a GPU profile only exercises the path, and the
report says so.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_hybrid.model.initialized_layers import lstm_layer
from fairseq_hybrid.model.lstm_stack import run_layer
from fairseq_hybrid.planning.lstm_published import (
    PHASES, CurveFit, PublishedLstmTiming, SaturatingCurve, fit_saturating,
)
from fairseq_hybrid.planning.profiles import PROFILES, LstmCurves
from fairseq_hybrid.chunking.wavefront import Link

from fairseq_hybrid.jsonio import write_json_atomic
from .pipeline_profile import profile_for, profile_report

BATCHES = (16, 32, 64, 128, 256)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
WARM_UP = 3
PIPELINE_PRESET, PIPELINE_DEVICES, PIPELINE_CHUNKS = "wmt", (1, 2, 4), (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class SweepSettings:
    device: str  # "cpu" or "cuda:N"
    dtype: str  # a key of DTYPES
    hidden: int = 1000
    steps: int = 32
    batches: Tuple[int, ...] = BATCHES
    repeats: int = 20


@dataclass(frozen=True)
class SweepPoint:
    """The fastest seconds of one call at ``batch`` sentences (``timed_calls``)."""
    batch: int
    layer_forward_s: float
    layer_training_s: float  # forward + backward
    projection_forward_s: float
    projection_training_s: float


def check_settings(settings: SweepSettings) -> None:
    """One-line errors for values the sweep cannot run, before any work."""
    if settings.device != "cpu" and not (settings.device.startswith("cuda:")
                                         and settings.device[5:].isdigit()):
        raise ValueError(f"--device {settings.device!r}: cpu or cuda:N")
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {settings.device}: this machine has no CUDA device")
    if settings.dtype not in DTYPES:
        raise ValueError(f"--dtype {settings.dtype!r}: one of {', '.join(DTYPES)}")
    if settings.dtype == "float16" and settings.device == "cpu":
        raise ValueError("--dtype float16 on cpu: fp16 training needs CUDA (float32 or bfloat16)")
    for name, value in (("--hidden", settings.hidden), ("--steps", settings.steps),
                        ("--repeats", settings.repeats)):
        if value < 1:
            raise ValueError(f"{name} {value}: at least 1")
    if len(set(settings.batches)) < 2 or min(settings.batches) < 1:
        raise ValueError(f"--batches {','.join(map(str, settings.batches))}: at least two "
                         "different sizes, each >= 1 (the fit needs two)")


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed_calls(forward: Callable[[], torch.Tensor], grad: torch.Tensor, repeats: int,
                sync: Callable[[], None], clear: Callable[[], None]) -> Tuple[float, float]:
    """The fastest seconds of ``forward()`` and of ``forward()`` then its backward with
    ``grad``, of ``repeats`` calls after ``WARM_UP`` (``clear`` drops the gradients before
    each, as the training step's zero_grad does). The fastest, not the median: other work on
    the machine only ever adds time, and the fit subtracts two times and divides by their
    growth over the batch, which a slow outlier would turn negative."""
    forwards, trainings = [], []
    for index in range(WARM_UP + repeats):
        clear()
        sync()
        start = time.perf_counter()
        out = forward()
        sync()
        middle = time.perf_counter()
        out.backward(grad)
        sync()
        end = time.perf_counter()
        if index >= WARM_UP:
            forwards.append(middle - start)
            trainings.append(end - start)
    return min(forwards), min(trainings)


def measure_point(settings: SweepSettings, batch: int, seed: int = 0) -> SweepPoint:
    device, dtype = torch.device(settings.device), DTYPES[settings.dtype]
    torch.manual_seed(seed)
    layer = lstm_layer(settings.hidden, settings.hidden).to(device=device, dtype=dtype)
    x = torch.randn(settings.steps, batch, settings.hidden, device=device, dtype=dtype,
                    requires_grad=True)  # the layer below's output
    grad_out = torch.randn(settings.steps, batch, settings.hidden, device=device, dtype=dtype)
    grad_gates = torch.randn(settings.steps, batch, 4 * settings.hidden, device=device, dtype=dtype)
    sync = synchronizer(device)

    def clear() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    layer_times = timed_calls(lambda: run_layer(layer, x, None, None)[0], grad_out,
                              settings.repeats, sync, clear)
    projection_times = timed_calls(
        lambda: torch.nn.functional.linear(x, layer.weight_ih_l0, layer.bias_ih_l0), grad_gates,
        settings.repeats, sync, clear)
    return SweepPoint(batch, *layer_times, *projection_times)


def device_label(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({torch.get_num_threads()} torch thread(s))"


def recurrent_timing(point: SweepPoint, settings: SweepSettings, label: str) -> PublishedLstmTiming:
    """The layer less its input projection, as a timing of the published kind (inputs 0;
    backward in one term: the sweep does not split it by inputs and weights)."""
    forward = point.layer_forward_s - point.projection_forward_s
    backward = ((point.layer_training_s - point.layer_forward_s)
                - (point.projection_training_s - point.projection_forward_s))
    if forward <= 0 or backward <= 0:
        raise ValueError(f"at {point.batch} sentences the input projection alone took as long as "
                         f"the layer (forward {point.projection_forward_s:.2e} of "
                         f"{point.layer_forward_s:.2e} s): no recurrent time left to fit")
    return PublishedLstmTiming(
        gpu=label, precision=settings.dtype, hidden=settings.hidden, inputs=0,
        steps=settings.steps, batch=point.batch, forward_s=forward, backward_data_s=backward,
        backward_weights_s=0.0,
        source=(f"measured here: torch {torch.__version__} nn.LSTM({settings.hidden}, "
                f"{settings.hidden}) less its input projection, {settings.steps} steps"))


def fit_curves(timings: Sequence[PublishedLstmTiming]) -> Tuple[LstmCurves, Dict[str, CurveFit]]:
    """The forward and training curves, each fitted by ``fit_saturating``."""
    fits = {phase: fit_saturating(timings, phase) for phase in PHASES}
    return LstmCurves(timings[0].hidden, fits["forward"].curve, fits["training"].curve), fits


def curve_json(curve: SaturatingCurve) -> Dict[str, Any]:
    return {"peak_flops": curve.peak_flops, "b_half": curve.b_half, "basis": curve.basis}


def curves_from_report(report: Dict[str, Any]) -> LstmCurves:
    """The fitted curves of a sweep report (``run_sweep``'s or its JSON file's)."""
    try:
        fits = report["fits"]
        curves = {phase: SaturatingCurve(float(fits[phase]["peak_flops"]),
                                         float(fits[phase]["b_half"]), str(fits[phase]["basis"]))
                  for phase in PHASES}
        return LstmCurves(int(report["settings"]["hidden"]), curves["forward"], curves["training"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not an LSTM sweep report (benchmarks.lstm_sweep --json): "
                         f"{type(error).__name__}: {error}") from None


def profile_comparison(curves: LstmCurves, hidden: int, batches: Sequence[int]) -> Dict[str, Any]:
    """Per GPU profile: its curves at the published hidden size nearest ``hidden`` and their
    rates at ``batches``, beside the measured curves' (FLOP/s, training and forward)."""
    out: Dict[str, Any] = {}
    for name, source in (("measured", curves),
                         *((n, p.lstm_curves(hidden)) for n, p in PROFILES.items())):
        out[name] = {"hidden": source.hidden, **{
            phase: {**curve_json(getattr(source, phase)),
                    "rate_flops": {str(b): getattr(source, phase).rate(b) for b in batches}}
            for phase in PHASES}}
    return out


def pipeline_with_curves(curves: LstmCurves, profile_names: Sequence[str]) -> Dict[str, Any]:
    """The pipeline model (``profile_report``) for each profile with its published curves
    and with the measured ones: the speedups on each device count, on the profile's link."""
    out: Dict[str, Any] = {}
    for name in profile_names:
        rows = {}
        for label, lstm in (("published", None), ("measured", curves)):
            report = profile_report(name, PIPELINE_PRESET, PIPELINE_DEVICES, PIPELINE_CHUNKS,
                                    Link(), lstm=lstm)
            rows[label] = report["links"]["profile's link"]["rows"]
        out[name] = {"preset": PIPELINE_PRESET, "rows": rows}
    return out


def run_sweep(settings: SweepSettings, profile_names: Sequence[str],
              progress: Callable[[str], None] = lambda message: None) -> Dict[str, Any]:
    check_settings(settings)
    started = time.perf_counter()
    label = device_label(settings.device)
    points: List[SweepPoint] = []
    for batch in sorted(set(settings.batches)):
        points.append(measure_point(settings, batch))
        progress(f"{batch} sentences: layer {points[-1].layer_training_s * 1e3:.3f} ms fwd+bwd")
    timings = [recurrent_timing(p, settings, label) for p in points]
    curves, fits = fit_curves(timings)
    on_gpu = settings.device.startswith("cuda")
    return {
        "what": "one LSTM layer's recurrent part (the layer less its input projection), "
                f"forward and forward + backward, over sentences per call, on {label}",
        "device": settings.device, "device_name": label, "settings": asdict(settings),
        "note": ("" if on_gpu else "NO GPU: measured on the CPU; beside the GPU profiles and in "
                 "the pipeline model this only exercises the path"),
        "points": [{**asdict(p), "recurrent_flops": t.flops("training") / 3,
                    "forward_rate_flops": t.rate("forward"), "training_rate_flops": t.rate("training")}
                   for p, t in zip(points, timings)],
        "fits": {phase: {**curve_json(fit.curve), "max_relative_error": fit.max_relative_error,
                         "residuals": [list(r) for r in fit.residuals]}
                 for phase, fit in fits.items()},
        "profiles": profile_comparison(curves, settings.hidden, settings.batches),
        "pipeline": pipeline_with_curves(curves, profile_names),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def tflops(value: float) -> str:
    return f"{value / 1e12:.3g}" if value >= 1e10 else f"{value / 1e9:.3g} G"


def format_sweep(report: Dict[str, Any]) -> str:
    s = report["settings"]
    profiles = report["profiles"]
    names = [n for n in profiles if n != "measured"]
    lines = [report["what"], f"hidden {s['hidden']}, {s['steps']} steps, {s['dtype']}; "
             f"fastest of {s['repeats']} calls; rates in TFLOP/s (G: GFLOP/s)"]
    if report["note"]:
        lines.append(report["note"])
    for phase in ("training", "forward"):
        fit = report["fits"][phase]
        what = "forward + backward, 3x the forward FLOPs" if phase == "training" else "forward alone"
        lines += ["", f"{phase} ({what})",
                  "| sentences | layer ms | projection ms | measured | fitted | "
                  + " | ".join(f"{n} (hidden {profiles[n]['hidden']})" for n in names) + " |",
                  "|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
        for point in report["points"]:
            b = point["batch"]
            layer = point[f"layer_{phase}_s"] * 1e3
            projection = point[f"projection_{phase}_s"] * 1e3
            lines.append(f"| {b} | {layer:.3f} | {projection:.3f} | "
                         f"{tflops(point[f'{phase}_rate_flops'])} | "
                         f"{tflops(profiles['measured'][phase]['rate_flops'][str(b)])} | "
                         + " | ".join(tflops(profiles[n][phase]["rate_flops"][str(b)]) for n in names) + " |")
        lines.append(f"| curve | | | peak {tflops(fit['peak_flops'])}, b_half {fit['b_half']:.0f} "
                     f"(fit max error {fit['max_relative_error']:.1%}) | | "
                     + " | ".join(f"peak {tflops(profiles[n][phase]['peak_flops'])}, b_half "
                                  f"{profiles[n][phase]['b_half']:.0f}" for n in names) + " |")
    for name, entry in report["pipeline"].items():
        lines += ["", f"pipeline model, {name} profile, preset {entry['preset']}, profile's link "
                  "(speedup over 1 device at the same global batch):"]
        for label, rows in entry["rows"].items():
            cells = []
            for scheme, title in (("hybrid", "hybrid"), ("ddp_same_batch", "DDP same batch"),
                                  ("ddp_n_batch", "DDP N x batch")):
                cells.append(f"{title} " + ", ".join(
                    f"{r['devices']}: {r['speedup']:.2f}x" for r in rows[scheme] if r["devices"] > 1))
            lines.append(f"  LSTM curves {label:<9}  " + "; ".join(cells))
    lines.append(f"\n{report['elapsed_s']:.0f} s")
    return "\n".join(lines)


# ---------------------------------------------------------------- make gpu-check
CPU_SWEEP_HIDDEN, CPU_SWEEP_STEPS = 32, 8  # where a CPU's times still have a per-step floor


def lstm_sweep_check(device: str, quick: bool) -> Tuple[str, Dict[str, Any]]:
    """The LSTM's rate over sentences per call measured here and fitted; on a GPU at the WMT
    layer (hidden 1000, 32 steps, fp16), on the CPU a small layer in float32 on one thread
    (on this project's 2-core machine a CPU's times at hidden 64-128 sometimes grew faster
    than the batch, caches: no saturating curve fits that)."""
    threads = torch.get_num_threads()
    if device.startswith("cuda"):
        settings = SweepSettings(device, "float16", repeats=10 if quick else 20)
        profile = profile_for(device)
    else:
        settings = SweepSettings(device, "float32", CPU_SWEEP_HIDDEN, CPU_SWEEP_STEPS, repeats=7)
        profile = "h100-sxm"
        torch.set_num_threads(1)
    try:
        report = run_sweep(settings, [profile])
    finally:
        torch.set_num_threads(threads)
    print(format_sweep(report), flush=True)
    training = report["fits"]["training"]
    published = report["profiles"][profile]["training"]
    rows = report["pipeline"][profile]["rows"]

    def at_most(curves: str, scheme: str) -> str:
        row = max(rows[curves][scheme], key=lambda r: r["devices"])
        return f"{row['speedup']:.2f}x"

    largest = max(r["devices"] for r in rows["measured"]["hybrid"])
    detail = (f"hidden {settings.hidden} {settings.dtype} fwd+bwd: peak "
              f"{training['peak_flops'] / 1e12:.3g} TFLOP/s, b_half {training['b_half']:.0f} "
              f"(fit within {training['max_relative_error']:.0%}); {profile} curve peak "
              f"{published['peak_flops'] / 1e12:.3g}, b_half {published['b_half']:.0f}; "
              f"{largest} GPUs with the measured curve: hybrid {at_most('measured', 'hybrid')}, "
              f"DDP same batch {at_most('measured', 'ddp_same_batch')} (profile's curve: "
              f"{at_most('published', 'hybrid')}, {at_most('published', 'ddp_same_batch')})")
    return detail, report


def default_dtype(device: str) -> str:
    return "float16" if device.startswith("cuda") else "float32"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="cpu or cuda:N (default: cuda:0 when CUDA is present)")
    parser.add_argument("--dtype", help="float16 (default on CUDA: fairseq --fp16), bfloat16, "
                        "float32 (default on the CPU)")
    parser.add_argument("--hidden", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profiles", default=",".join(PROFILES),
                        help="profiles to run the pipeline model for, with the measured curves")
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args(argv)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        batches = tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        sys.exit(f"lstm_sweep.py: error: --batches {args.batches!r}: comma-separated integers")
    names = args.profiles.split(",")
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        sys.exit(f"lstm_sweep.py: error: --profiles {','.join(unknown)}: one of {', '.join(PROFILES)}")
    settings = SweepSettings(device, args.dtype or default_dtype(device), args.hidden, args.steps,
                             batches, args.repeats)
    try:
        check_settings(settings)
        report = run_sweep(settings, names,
                           progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
    except ValueError as error:
        sys.exit(f"lstm_sweep.py: error: {error}")
    print(format_sweep(report))
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
