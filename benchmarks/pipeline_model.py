"""A performance model of the hybrid training step: measure one device, simulate N.

The model itself (measurement on one device, the clock-cycle simulator) is
``fairseq_hybrid.planning``; this module validates and reports it (``run`` / the CLI): the
real training step of ``HybridLSTMModel`` with ``hybrid_cross_entropy`` measured on ``cpu``
and ``cpu,cpu`` (one torch thread per device) against the model's prediction, with and
without the measured contention between CPU devices; and predictions for more devices (e.g.
the WMT preset on 4) from one device's stage times.

    python -m benchmarks.pipeline_model --preset small --devices 2 --chunks 1,2,4 \
        --validate --quick --json results/bench/pipeline_model.json
    python -m benchmarks.pipeline_model --preset wmt --devices 4 --chunks 1,2,4,8,16

Per-device times are *this machine's* (on a CPU box: one CPU core per device); the same
command on a GPU box measures GPU stage times. Transfers use ``--bandwidth-gbs`` and
``--latency-us`` for the ``dataflow`` schedule (GPUs); CPU devices share memory (no transfer cost).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning import (
    BENCHMARK_PRESETS, BatchSize, ModelSize, measure_concurrency, predict_speedups,
)
from fairseq_hybrid.jsonio import write_json_atomic
from fairseq_hybrid.planning.profiles import GPU_HOST, PROFILES, LstmCurves
from fairseq_hybrid.planning.measure import median

from .host_time import measure_host_times
from .lstm_sweep import curves_from_report
from .models import build_model, measure_stage_times, synthetic_sample
from .pipeline_profile import (
    check_report, format_check, format_profile_report, measured_report, parse_link,
    profile_report,
)
from .pipeline_model_report import phase_times, stage_summary, format_report


DEFAULT_BANDWIDTH_GBS, DEFAULT_LATENCY_US = 10.0, 20.0  # the measured model's cuda schedule


def measure_real_steps(
    size: ModelSize, batch: BatchSize, configs: Sequence[Tuple[int, int]], repeats: int = 3,
    threads: int = 1, progress: Callable[[str], None] = lambda message: None,
) -> Dict[Tuple[int, int], Dict[str, Any]]:
    """Median seconds of the real training step (zero_grad, ``hybrid_cross_entropy``
    forward through ``HybridLSTMModel``'s engine, backward, clip, Adam step) for each
    (devices, chunks) on CPU devices with ``threads`` torch threads per device;
    configurations interleaved (A B C A B C ...) after one warm-up step per device count."""
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    model, task = build_model(size)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1)
    sample = synthetic_sample(task.target_dictionary, batch)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-6)
    engines = {}
    try:
        for n, k in configs:
            model.runtime.cpu_threads = threads
            engine = model.runtime.build_engine(devices=(torch.device("cpu"),) * n, chunks=k, balance=None)
            engine.workers.run_all([(i, "start", lambda: None) for i in range(n)])
            engines[(n, k)] = engine
        samples: Dict[Tuple[int, int], List[float]] = {c: [] for c in configs}
        phases: Dict[Tuple[int, int], Dict[str, List[float]]] = {
            c: {"forward": [], "backward": [], "update": []} for c in configs
        }
        warm_up = list({n: (n, k) for n, k in reversed(configs)}.values())
        for round_index in range(repeats + 1):
            for config in (configs if round_index > 0 else warm_up):
                model.runtime.use_engine(engines[config])
                start = time.perf_counter()
                model.zero_grad(set_to_none=True)
                loss, _, _ = criterion(model, sample)
                forward_end = time.perf_counter()
                loss.backward()
                backward_end = time.perf_counter()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                end = time.perf_counter()
                if round_index > 0:
                    samples[config].append(end - start)
                    phases[config]["forward"].append(forward_end - start)
                    phases[config]["backward"].append(backward_end - forward_end)
                    phases[config]["update"].append(end - backward_end)
            progress(f"real steps: round {round_index}/{repeats}")
        return {
            c: {"median_s": median(v), "runs_s": v,
                "phases_median_s": {name: median(t) for name, t in phases[c].items()}}
            for c, v in samples.items()
        }
    finally:
        model.runtime.close()  # every engine it built
        torch.set_num_threads(saved_threads)


def _gbs_link(bandwidth_gbs: float, latency_us: float) -> Link:
    return Link(bandwidth_gbs * 1e9, latency_us * 1e-6)


def run(
    preset: str = "small",
    quick: bool = False,
    validate: bool = False,
    devices: Optional[int] = None,
    chunks: Optional[Sequence[int]] = None,
    bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS,
    latency_us: float = DEFAULT_LATENCY_US,
    repeats: Optional[int] = None,
    progress: Callable[[str], None] = lambda message: None,
    device: str = "cpu",
    sentences: Optional[int] = None,
) -> Dict[str, Any]:
    """Measure one device's stage times for ``preset``, predict speedups for 1..``devices``
    devices and ``chunks`` chunk counts under both schedule, and (``validate``) compare
    with the real step on CPU devices (N in 1, 2; K in ``chunks``). Returns a JSON-ready
    dict (see ``format_report``); benchmarks/scaling.py can merge it into its report.
    ``device``: where one device's stage times are measured ("cpu", or "cuda" on a GPU
    box: then the ``dataflow`` rows are GPU predictions; validation needs "cpu")."""
    if validate and torch.device(device).type != "cpu":
        raise ValueError("--validate compares with CPU devices: measure with --device cpu")
    if preset not in BENCHMARK_PRESETS:
        raise ValueError(f"preset {preset!r}: one of {sorted(BENCHMARK_PRESETS)}")
    spec = BENCHMARK_PRESETS[preset]
    batch = spec.quick_batch if quick else spec.batch
    note = spec.note
    if sentences is not None:
        batch = with_sentences(batch, sentences)
        note = f"{sentences} sentences (set with --sentences)"
    devices = devices or (2 if preset == "small" else 4)
    if devices > spec.model.layers:
        raise ValueError(f"{devices} devices for {spec.model.layers} layers: at most one per layer")
    chunks = list(chunks or ([1, 2, 4] if preset == "small" else [1, 2, 4, 8, 16]))
    if 1 not in chunks:
        chunks = [1] + chunks  # the denominator's K
    repeats = repeats or (3 if quick else 5)
    device_counts = list(range(1, devices + 1))
    started = time.perf_counter()
    load_start = os.getloadavg()
    stage = measure_stage_times(spec.model, batch, chunks, device_counts, repeats, 1, progress,
                                device)
    link = _gbs_link(bandwidth_gbs, latency_us)
    report: Dict[str, Any] = {
        "what": "pipeline performance model: per-cell stage times measured on one device, "
                "clock-cycle schedule simulated for N devices and K chunks",
        "preset": preset,
        "model": asdict(spec.model),
        "batch": asdict(batch),
        "batch_note": note,
        "measured_on": (
            f"{torch.cuda.get_device_name(torch.device(stage.device))} ({stage.device})"
            if stage.device.startswith("cuda") else
            f"{platform.processor() or platform.machine()}, 1 torch thread per device "
            f"(this machine's CPU; {os.cpu_count()} cores)"),
        "torch": torch.__version__,
        "denominator": "predicted step of hybrid_lstm on 1 device, K = 1 (same model, batch)",
        "link": {"cycle": "shared memory: no transfer cost",
                 "dataflow": {"bandwidth_gbs": bandwidth_gbs, "latency_us": latency_us}},
        "stage_times": stage_summary(stage),
        "predictions": {},
    }
    for schedule, sem_link in (("cycle", Link()), ("dataflow", link)):
        table = predict_speedups(stage, device_counts, chunks, schedule, sem_link)
        report["predictions"][schedule] = [
            {"devices": n, "chunks": k, **{name: round(v, 6) for name, v in parts.items()}}
            for (n, k), parts in table.items()
        ]
    if validate:
        configs = [(n, k) for n in (1, 2) if n <= spec.model.layers for k in chunks]
        probes = 2 if quick else repeats

        def probe() -> Dict[str, float]:
            return {w: measure_concurrency(spec.model, batch, 2, probes, w)
                    for w in ("lstm", "head")}

        before = probe()
        real = measure_real_steps(spec.model, batch, configs, repeats, 1, progress)
        after = probe()
        contention = {w: {2: (before[w] + after[w]) / 2} for w in before}
        progress(f"2-worker slowdown before {before}, after {after}")
        predicted = predict_speedups(stage, [1, 2], chunks, "cycle", Link())
        contended = predict_speedups(stage, [1, 2], chunks, "cycle", Link(),
                                     contention["lstm"], contention["head"])
        base = real[(1, 1)]["median_s"]
        base_min = min(real[(1, 1)]["runs_s"])
        rows = []
        for n, k in configs:
            measured = base / real[(n, k)]["median_s"]
            measured_min = base_min / min(real[(n, k)]["runs_s"])
            model_speedup = predicted[(n, k)]["speedup"]
            contended_speedup = contended[(n, k)]["speedup"]
            rows.append({
                "devices": n, "chunks": k,
                "measured_step_s": round(real[(n, k)]["median_s"], 6),
                "predicted_step_s": round(predicted[(n, k)]["total"], 6),
                "measured_speedup": round(measured, 4),
                "predicted_speedup": round(model_speedup, 4),
                "speedup_error": round((model_speedup - measured) / measured, 4),
                "measured_speedup_of_fastest_runs": round(measured_min, 4),
                "speedup_error_vs_fastest_runs": round((model_speedup - measured_min) / measured_min, 4),
                "step_time_error": round(
                    (predicted[(n, k)]["total"] - real[(n, k)]["median_s"])
                    / real[(n, k)]["median_s"], 4),
                "predicted_speedup_with_measured_contention": round(contended_speedup, 4),
                "speedup_error_with_measured_contention": round(
                    (contended_speedup - measured) / measured, 4),
                "runs_s": [round(v, 6) for v in real[(n, k)]["runs_s"]],
                "phases_s": {
                    "measured": {name: round(t, 5)
                                 for name, t in real[(n, k)]["phases_median_s"].items()},
                    "predicted": phase_times(predicted[(n, k)]),
                    "predicted_with_contention": phase_times(contended[(n, k)]),
                },
            })
        report["validation"] = {
            "what": "real hybrid training step (zero_grad, hybrid_cross_entropy fwd through "
                    "HybridLSTMModel's engine, backward, clip, Adam) on cpu vs cpu,cpu "
                    "(1 torch thread per device), median of repeats, against the "
                    "cycle-schedule prediction; speedups relative to the measured / predicted "
                    "cpu K=1 step; error = (predicted - measured) / measured",
            "repeats": repeats,
            "two_worker_slowdown": {
                w: {"before": round(before[w], 4), "after": round(after[w], 4),
                    "used": round(contention[w][2], 4)} for w in before
            },
            "contention_note": "the plain prediction assumes devices that do not slow each "
                               "other down; the second one scales pipeline cells that run "
                               "while both CPU workers are busy by the slowdown of two "
                               "concurrent LSTM layers, and the concurrent head shards' "
                               "forward by that of two concurrent head shards, both "
                               "measured on this box around the real steps (1.0 = "
                               "independent cores)",
            "rows": rows,
        }
    report["load_average_1_5_15min"] = {"start": load_start, "end": os.getloadavg()}
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


def pipeline_model_check(device: str, quick: bool) -> Tuple[str, Dict[str, Any]]:
    """``make gpu-check``'s check of the model: predictions from stage times measured on
    ``device``, the host's issue time per task there (``host_time``) and, on a GPU, the
    closest profile's error there."""
    if device.startswith("cuda"):
        report = run("wmt", quick=quick, devices=4, chunks=[1, 2, 4, 8, 16],
                                    device=device, sentences=128)
        schedule, devices = "dataflow", 4
    else:
        report = run("small", quick=True, devices=2, chunks=[1, 2, 4],
                                    repeats=1, sentences=16)
        schedule, devices = "cycle", 2
    rows = [r for r in report["predictions"][schedule] if r["devices"] == devices]
    best = max(rows, key=lambda r: r["speedup"])
    data = {"stage_times": report["stage_times"], "predictions": rows,
            "measured_on": report["measured_on"], "batch": report["batch"]}
    detail = (f"predicted {best['speedup']:.2f}x on {devices} devices at K={best['chunks']} "
              f"({schedule} schedule, stage times measured on {device})")
    # the host's issue time per task (the GPU profiles assume it: ``profiles.GPU_HOST``)
    host = measure_host_times(device, devices=2, chunks=4, steps=5 if quick else 20)
    data["host_times"] = host
    detail += (f"; host per cell {host['seconds']['cell_forward'] * 1e6:.0f}/"
               f"{host['seconds']['cell_backward'] * 1e6:.0f} us fwd/bwd (profiles assume "
               f"{GPU_HOST.cell_forward * 1e6:.0f}/{GPU_HOST.cell_backward * 1e6:.0f})")
    if device.startswith("cuda"):  # the GPU profile's error on the GPU at hand
        profile_check = check_report("wmt", repeats=1 if quick else 3, device=device, sentences=128)
        print(format_check(profile_check), flush=True)
        data["profile_check"] = profile_check
        detail += f"; profile {profile_check['profile']['name']} error on the step " \
                  f"{profile_check['error']['total']:+.0%}"
    return detail, data


def unused_options(args: argparse.Namespace) -> Optional[str]:
    """The options the chosen mode would ignore, as a one-line error (None if none): a
    ``--profile`` takes its link from ``--link`` and measures nothing; the measured model
    (no ``--profile``) takes ``--bandwidth-gbs``/``--latency-us``, not ``--link``."""
    if args.profile:
        given = [flag for flag, value in (("--validate", args.validate), ("--quick", args.quick),
                                          ("--bandwidth-gbs", args.bandwidth_gbs is not None),
                                          ("--latency-us", args.latency_us is not None)) if value]
        if given:
            return (f"{', '.join(given)}: not used with --profile {args.profile} (its link is "
                    "--link: nvlink, pcie, ib or GB/s)")
    elif args.link is not None:
        return f"--link {args.link}: only with --profile (without it: --bandwidth-gbs, --latency-us)"
    if args.lstm_sweep and args.profile in (None, "measured", "cpu"):
        return f"--lstm-sweep {args.lstm_sweep}: only with --profile {' or '.join(PROFILES)}"
    return None


def swept_curves(path: Optional[str]) -> Optional[LstmCurves]:
    """``--lstm-sweep FILE``: the curves it holds (None without the option)."""
    if path is None:
        return None
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--lstm-sweep {path}: {error}") from None
    try:
        return curves_from_report(report)
    except ValueError as error:
        raise ValueError(f"--lstm-sweep {path}: {error}") from None


def with_sentences(batch: BatchSize, sentences: int) -> BatchSize:
    """``batch`` with ``sentences`` sentences, lengths kept (``--sentences``)."""
    if sentences < 1:
        raise ValueError(f"--sentences {sentences}: at least 1")
    return BatchSize(sentences, batch.source_len, batch.target_len)


def profile_batch(profile: str, preset: str, sentences: Optional[int]) -> Tuple[Optional[BatchSize], str]:
    """``--sentences`` with ``--profile``: the profile's batch (the preset's GPU batch; for
    ``measured``, its measuring batch) with that many sentences, lengths kept, and the
    suffix of the default JSON name (the committed default-batch results stay as they are).
    (None, "") without ``--sentences``; ``--profile cpu`` (the model's check) takes none."""
    if sentences is None:
        return None, ""
    if profile == "cpu":
        raise ValueError(f"--sentences {sentences}: --profile cpu checks the model at the preset's "
                         "batch; use --sentences with a GPU profile or measured")
    spec = BENCHMARK_PRESETS[preset]
    base = spec.batch if profile == "measured" else (spec.gpu_batch or spec.batch)
    return with_sentences(base, sentences), f"-{sentences}-sentences"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(BENCHMARK_PRESETS), default="small")
    parser.add_argument("--devices", help="device counts to predict: a list (1,2,4) or the "
                        "largest N (default: small 2, wmt 4)")
    parser.add_argument("--profile", choices=[*PROFILES, "measured", "cpu"],
                        help="predict GPUs from FLOPs and bytes at a named profile's rates "
                        "(measured: stage times measured on --device), beside fairseq's DDP "
                        "of the same model; prints every assumption. cpu: the FLOP and byte "
                        "model checked against stage times measured on this CPU")
    parser.add_argument("--link", help="with --profile: the link between devices: nvlink "
                        "(the profile's), pcie, ib, or a bandwidth in GB/s")
    parser.add_argument("--chunks", help="comma-separated K values (default: small 1,2,4; "
                        "wmt 1,2,4,8,16)")
    parser.add_argument("--validate", action="store_true",
                        help="also measure the real step on cpu and cpu,cpu and report the error")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (and for wmt a "
                        "smaller batch)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--sentences", type=int,
                        help="sentences per batch (default: the preset's; lengths stay)")
    parser.add_argument("--bandwidth-gbs", type=float,
                        help="without --profile: device link bandwidth for the cuda schedule "
                        f"(GB/s, default {DEFAULT_BANDWIDTH_GBS})")
    parser.add_argument("--latency-us", type=float,
                        help="without --profile: per-transfer latency for the cuda schedule "
                        f"(microseconds, default {DEFAULT_LATENCY_US})")
    parser.add_argument("--device", default="cpu",
                        help="where to measure one device's stage times: cpu (default) or cuda")
    parser.add_argument("--lstm-sweep", help="with --profile: the LSTM curves of a sweep's JSON "
                        "(python -m benchmarks.lstm_sweep --json) in place of the profile's")
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args(argv)
    ignored = unused_options(args)
    if ignored:
        sys.exit(f"pipeline_model.py: error: {ignored}")
    logging.getLogger("fairseq_hybrid").setLevel(logging.WARNING)  # no placement tables
    try:
        chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else None
    except ValueError:
        sys.exit(f"pipeline_model.py: error: --chunks {args.chunks!r}: comma-separated integers")
    if chunks is not None and min(chunks) < 1:
        sys.exit("pipeline_model.py: error: --chunks values must be >= 1")
    try:
        counts = [int(n) for n in args.devices.split(",")] if args.devices else None
    except ValueError:
        sys.exit(f"pipeline_model.py: error: --devices {args.devices!r}: comma-separated integers")
    if counts is not None and min(counts) < 1:
        sys.exit("pipeline_model.py: error: --devices must be >= 1")
    if counts is not None and len(counts) == 1:
        counts = list(range(1, counts[0] + 1))
    if args.profile:
        try:
            link = parse_link(args.link)
            preset_layers = BENCHMARK_PRESETS[args.preset].model.layers
            counts = counts or list(range(1, min(4, preset_layers) + 1))
            chunk_list = chunks or [1, 2, 4, 8, 16]
            batch, suffix = profile_batch(args.profile, args.preset, args.sentences)
            if args.profile == "cpu":
                report = check_report(args.preset, args.repeats or 3)
                print(format_check(report))
                out = args.json or f"results/bench/pipeline-model-{args.preset}-cpu-check.json"
                write_json_atomic(report, out)
                print(f"wrote {out}")
                return
            if args.profile == "measured":
                report = measured_report(args.device, args.preset, counts, chunk_list, link, batch=batch)
            else:
                report = profile_report(args.profile, args.preset, counts, chunk_list, link, batch=batch,
                                        lstm=swept_curves(args.lstm_sweep))
        except ValueError as error:
            sys.exit(f"pipeline_model.py: error: {error}")
        print(format_profile_report(report))
        out = args.json or f"results/bench/pipeline-model-{args.preset}-{args.profile}{suffix}.json"
        write_json_atomic(report, out)
        print(f"wrote {out}")
        return
    try:
        report = run(args.preset, args.quick, args.validate, max(counts) if counts else None, chunks,
                     DEFAULT_BANDWIDTH_GBS if args.bandwidth_gbs is None else args.bandwidth_gbs,
                     DEFAULT_LATENCY_US if args.latency_us is None else args.latency_us, args.repeats,
                     progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True),
                     device=args.device, sentences=args.sentences)
    except ValueError as error:
        sys.exit(f"pipeline_model.py: error: {error}")
    print(format_report(report))
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
