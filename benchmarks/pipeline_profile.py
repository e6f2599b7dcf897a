"""``python -m benchmarks.pipeline_model --profile NAME``: the performance model for GPUs
without one (and ``make gpu-check``'s pipeline-model check on one). Stage times come from
FLOPs and bytes at a named profile's rates
(``fairseq_hybrid/planning/profiles.py``; ``measured``: this machine's device, measured),
the head's traffic as the code moves it (``planning/traffic.py``, the engine's ledger),
and beside today's hybrid schedule, fairseq's data parallelism (DDP) of the same model at
the same global batch and at N x the batch. Every assumption is printed with the numbers,
with the range the least certain ones span, a 25 GB/s (PCIe-class) link row, and the hybrid
without the host bound (what removing the one process's serialised issue time would give)."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Sequence

import torch

from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.planned import PLANNED_LADDER, STEPS, planned_speedups
from fairseq_hybrid.planning.compare import (
    SHARDED_OPTIMIZER, SchemePrediction, compare, compare_profile, fastest,
)
from fairseq_hybrid.planning.profiles import (
    LINKS, PROFILES, DeviceProfile, LstmCurves, sensitivity_variants, with_link,
)
from fairseq_hybrid.planning.rates import measure_profile
from fairseq_hybrid.planning.step_time import predict_step
from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning.sizes import BENCHMARK_PRESETS, BatchSize, ModelSize
from fairseq_hybrid.planning.stage_times import HostTimes

from .models import measure_stage_times

MODELLED = "modelled, not measured: no GPU has run this"
SCHEMES = (("hybrid", "hybrid (today's schedule)"), ("ddp_same_batch", "DDP, same global batch"),
           ("ddp_sharded", "DDP + sharded optimizer"), ("groups", "hybrid groups in DDP"),
           ("ddp_n_batch", "DDP, N x the batch"))
TITLES = dict(SCHEMES)


def parse_link(text: Optional[str]) -> Link:
    """``--link``: nvlink (the profile's), pcie, ib, or a bandwidth in GB/s."""
    if text is None:
        return Link()
    if text in LINKS:
        return LINKS[text]
    try:
        gbs = float(text)
    except ValueError:
        raise ValueError(f"--link {text!r}: one of {', '.join(LINKS)} or a bandwidth in GB/s") from None
    if gbs <= 0:
        raise ValueError(f"--link {text!r}: a bandwidth > 0 GB/s")
    return Link(gbs * 1e9, LINKS["pcie"].latency_s)


def rows_json(rows: Dict[str, List[SchemePrediction]]) -> Dict[str, List[Dict[str, Any]]]:
    return {name: [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(p).items()}
                   for p in predictions] for name, predictions in rows.items()}


def profile_report(profile_name: str, preset: str, device_counts: Sequence[int],
                   chunk_counts: Sequence[int], link: Link,
                   batch: Optional[BatchSize] = None,
                   lstm: Optional[LstmCurves] = None) -> Dict[str, Any]:
    """The predictions for ``profile_name`` (not ``measured``), JSON-ready; ``lstm``: LSTM
    curves for every layer in place of the profile's (``benchmarks.lstm_sweep``'s)."""
    spec = BENCHMARK_PRESETS[preset]
    model: ModelSize = spec.model
    batch = batch or spec.gpu_batch or spec.batch
    profile: DeviceProfile = PROFILES[profile_name]
    if lstm is not None:
        profile = replace(profile, lstm=(lstm,), note=f"{profile.note}; LSTM curves: "
                          f"{lstm.training.basis}")
    profile = with_link(profile, link)
    links = {"profile's link" if link.bandwidth_bytes_per_s <= 0 else "--link": profile.link,
             "25 GB/s (PCIe-class)": Link(25e9, LINKS["pcie"].latency_s)}
    report: Dict[str, Any] = {
        "what": "hybrid (today's schedule) vs fairseq DDP of the same model; " + MODELLED,
        "profile": profile.assumptions(), "profile_lines": profile.lines(), "preset": preset,
        "model": asdict(model), "batch": asdict(batch), "chunks": list(chunk_counts),
        "speedup": "target tokens/s over the same model on 1 device at the global batch",
        "links": {}, "sensitivity": {},
    }
    for label, each in links.items():
        rows = compare_profile(profile, model, batch, device_counts, chunk_counts, each)
        report["links"][label] = {
            "bandwidth_gbs": each.bandwidth_bytes_per_s / 1e9, "latency_us": each.latency_s * 1e6,
            "rows": rows_json(rows),
            "fastest_same_batch": {n: fastest(rows, n) for n in device_counts if n > 1},
        }
    unbound = replace(profile, host=HostTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    report["without_host_bound"] = {
        label: rows_json({"hybrid": compare_profile(unbound, model, batch, device_counts,
                                                    chunk_counts, each)["hybrid"]})["hybrid"]
        for label, each in links.items()}
    largest = max(device_counts)
    for label, variant in {"as profiled": profile, **sensitivity_variants(profile)}.items():
        rows = compare_profile(variant, model, batch, [largest], chunk_counts)
        report["sensitivity"][label] = {
            name: next((p.speedup for p in rows[name] if p.devices == largest), None)
            for name, _ in SCHEMES
        }
    hybrid_largest = max(n for n in device_counts if n <= model.layers)  # a layer per device
    report["planned"] = planned_report(profile, model, batch, hybrid_largest, chunk_counts, links)
    return report


def planned_report(profile: DeviceProfile, model: ModelSize, batch: BatchSize, devices: int,
                   chunk_counts: Sequence[int], links: Dict[str, Link]) -> Dict[str, Any]:
    """The planned schedule's steps (``planning.planned``), cumulatively, on ``devices``
    devices over each link, and the whole plan across the sensitivity range."""
    if devices < 2:
        return {}
    out: Dict[str, Any] = {"devices": devices, "links": {}, "sensitivity": {}}
    for label, link in links.items():
        stage = stage_times_from_profile(model, batch, with_link(profile, link), chunk_counts,
                                         [1, devices])
        out["links"][label] = [
            {"steps": list(steps), "chunks": k, "speedup": speedup}
            for steps, (k, speedup) in planned_speedups(stage, devices, chunk_counts, link,
                                                        PLANNED_LADDER).items()]
    for label, variant in {"as profiled": profile, **sensitivity_variants(profile)}.items():
        stage = stage_times_from_profile(model, batch, variant, chunk_counts, [1, devices])
        best = planned_speedups(stage, devices, chunk_counts, variant.link, [STEPS])
        out["sensitivity"][label] = best[tuple(STEPS)][1]
    return out


def measured_report(device: str, preset: str, device_counts: Sequence[int],
                    chunk_counts: Sequence[int], link: Link, repeats: int = 3,
                    batch: Optional[BatchSize] = None) -> Dict[str, Any]:
    """The same comparison from stage times measured on ``device`` (this machine), at
    ``batch`` (default: the preset's measuring batch)."""
    spec = BENCHMARK_PRESETS[preset]
    batch = batch or spec.batch

    def stage_for(b: BatchSize, chunks: Sequence[int], devices: Sequence[int]):
        return measure_stage_times(spec.model, b, list(chunks), list(devices), repeats, 1,
                                   device=device)

    started = time.perf_counter()
    rows = compare(stage_for, spec.model.layers, batch, device_counts, chunk_counts, link)
    return {"what": f"hybrid vs DDP from stage times measured on {device}", "preset": preset,
            "model": asdict(spec.model), "batch": asdict(batch),
            "links": {"--link": {"bandwidth_gbs": link.bandwidth_bytes_per_s / 1e9,
                                 "latency_us": link.latency_s * 1e6, "rows": rows_json(rows),
                                 "fastest_same_batch": {n: fastest(rows, n) for n in device_counts if n > 1}}},
            "elapsed_s": round(time.perf_counter() - started, 1)}


def format_profile_report(report: Dict[str, Any]) -> str:
    lines = [report["what"], ""]
    lines += report.get("profile_lines", [])
    model, batch = report["model"], report["batch"]
    lines.append(f"model: {model['layers']}+{model['layers']} layers x {model['hidden']}, vocabulary "
                 f"{model['vocab']}; batch {batch['sentences']} sentences x {batch['source_len']} "
                 f"source / {batch['target_len']} target tokens")
    lines.append("speedup: " + report.get("speedup", "over 1 device"))
    for label, entry in report["links"].items():
        lines.append("")
        lines.append(f"link {label}: {entry['bandwidth_gbs']:.0f} GB/s, {entry['latency_us']:.0f} us")
        counts = [row["devices"] for row in entry["rows"]["ddp_same_batch"]]
        lines.append(f"  {'scheme':<28}" + "".join(f"{f'{n} dev':>9}   " for n in counts))
        for name, title in SCHEMES:
            cells = {row["devices"]: row for row in entry["rows"][name]}
            text = ""
            for n in counts:
                row = cells.get(n)
                if row is None:
                    text += f"{'-':>5}{'':<7}"
                else:
                    k = f" K{row['chunks']}" if row.get("chunks") else ""
                    if name == "groups":
                        k = f" {row['replicas']}x{row['stages']}"
                    mark = "*" if entry["fastest_same_batch"].get(n) == name else " "
                    text += f"{row['speedup']:>5.2f}x{mark}{k:<5}"
            lines.append(f"  {title:<28}{text}")
        lines.append("  * the fastest at the same global batch" + (
            "" if SHARDED_OPTIMIZER else " (the sharded optimizer not counted: the plugin does "
            "not run it yet)") + "; groups: processes x devices each")
    if report.get("without_host_bound"):
        lines += ["", "without the host bound (the cells as CUDA graphs, or a process per "
                  "device): hybrid"]
        for label, rows in report["without_host_bound"].items():
            lines.append(f"  link {label}: " + ", ".join(
                f"{row['devices']} dev {row['speedup']:.2f}x K{row['chunks']}" for row in rows))
    if report.get("sensitivity"):
        lines.append("")
        lines.append("sensitivity (largest N, profile's link):")
        for label, values in report["sensitivity"].items():
            lines.append(f"  {label:<30} " + ", ".join(
                f"{TITLES[name]} {value:.2f}x" for name, value in values.items() if value is not None))
        for name, title in SCHEMES:
            values = [v[name] for v in report["sensitivity"].values() if v.get(name) is not None]
            if values:
                lines.append(f"  range {title}: {min(values):.2f}x - {max(values):.2f}x")
    planned = report.get("planned")
    if planned:
        lines += ["", f"the planned schedule (planning/planned.py), {planned['devices']} devices, "
                  "steps added one by one:"]
        for label, rows in planned["links"].items():
            lines.append(f"  link {label}:")
            for row in rows:
                lines.append(f"    {' + '.join(row['steps']) or 'today':<52} "
                             f"{row['speedup']:.2f}x K{row['chunks']}")
        values = list(planned["sensitivity"].values())
        lines.append(f"  every step, sensitivity range: {min(values):.2f}x - {max(values):.2f}x")
    return "\n".join(lines)


CHECKED_PARTS = ("embeddings_forward", "embeddings_backward", "pipeline_forward",
                 "pipeline_backward", "head_forward", "head_backward", "rest", "total")


def profile_for(device: str) -> str:
    """The named profile closest to the GPU ``device`` is (h100-sxm when none matches)."""
    name = torch.cuda.get_device_name(torch.device(device)).lower()
    for key, profile in (("h100", "h100-sxm"), ("h200", "h100-sxm"), ("a100", "a100-sxm"),
                         ("v100", "v100")):
        if key in name:
            return profile
    return "h100-sxm"


def check_report(preset: str, repeats: int = 3, threads: int = 1, device: str = "cpu",
                 profile_name: Optional[str] = None, sentences: Optional[int] = None) -> Dict[str, Any]:
    """The FLOP and byte model checked where it can be: stage times from a profile's rates
    (on the CPU a ``cpu`` profile measured here, ``planning/rates.py``; on a GPU the named
    profile closest to it, in bfloat16) against stage times measured directly on
    ``device``, part by part of the one-device step, and the 2-device speedups each
    predicts (the CPU's schedule on CPU devices, the GPU's dataflow on GPUs)."""
    spec = BENCHMARK_PRESETS[preset]
    batch = spec.batch if device == "cpu" else (spec.gpu_batch or spec.batch)
    if sentences:
        batch = BatchSize(sentences, batch.source_len, batch.target_len)
    started, load = time.perf_counter(), os.getloadavg()
    if device == "cpu":
        profile = measure_profile(spec.model, batch, "cpu", threads, repeats)
        dtype, schedule = torch.float32, "cycle"
    else:
        profile = PROFILES[profile_name or profile_for(device)]
        dtype, schedule = torch.bfloat16, "dataflow"
    chunks = [1, 2, 4]
    measured = measure_stage_times(spec.model, batch, chunks, [1, 2], repeats, threads,
                                   device=device, dtype=dtype)
    modelled = stage_times_from_profile(spec.model, batch, profile, chunks, [1, 2])
    stages = (("measured", measured), ("modelled", modelled))
    parts = {name: predict_step(stage, 1, 1, schedule) for name, stage in stages}
    errors = {part: (parts["modelled"][part] - parts["measured"][part]) / parts["measured"][part]
              for part in CHECKED_PARTS if parts["measured"][part] > 0}
    speedups = {name: {k: predict_step(stage, 1, 1, schedule)["total"]
                       / predict_step(stage, 2, k, schedule)["total"] for k in chunks}
                for name, stage in stages}
    return {
        "what": f"the FLOP and byte model on {device}: stage times from the {profile.name} "
                f"profile's rates vs stage times measured directly ({dtype}, "
                f"{threads} torch thread(s) on the CPU)",
        "preset": preset, "model": asdict(spec.model), "batch": asdict(batch),
        "profile": profile.assumptions(), "profile_lines": profile.lines(),
        "one_device_step_s": {name: {p: round(v, 6) for p, v in values.items() if p in CHECKED_PARTS}
                              for name, values in parts.items()},
        "error": {p: round(e, 4) for p, e in errors.items()},
        "two_device_speedup": {name: {k: round(v, 4) for k, v in values.items()}
                               for name, values in speedups.items()},
        "load_average_start_end": [load, os.getloadavg()],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def format_check(report: Dict[str, Any]) -> str:
    lines = [report["what"], *report["profile_lines"], "",
             f"  {'part of the 1-device step':<26}{'measured s':>12}{'modelled s':>12}{'error':>9}"]
    step = report["one_device_step_s"]
    for part, error in report["error"].items():
        lines.append(f"  {part:<26}{step['measured'][part]:>12.4f}{step['modelled'][part]:>12.4f}"
                     f"{error:>+9.1%}")
    lines.append("")
    for name, values in report["two_device_speedup"].items():
        lines.append(f"  2-device speedup from {name} stage times: "
                     + ", ".join(f"K={k} {v:.2f}x" for k, v in values.items()))
    load = report["load_average_start_end"]
    lines.append(f"  load average {load[0][0]:.1f} -> {load[1][0]:.1f}; {report['elapsed_s']:.0f} s")
    return "\n".join(lines)
