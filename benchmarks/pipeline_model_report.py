"""The pipeline model's report: per-stage summaries and the text table printed by
``python -m benchmarks.pipeline_model``."""
from __future__ import annotations

from typing import Any, Dict, Mapping

from fairseq_hybrid.planning import StageTimes


def phase_times(parts: Mapping[str, float]) -> Dict[str, float]:
    """A predicted step's parts grouped as the real step's timers see them: the
    criterion's forward (embeddings, pipeline, head), ``loss.backward()``, clip + Adam."""
    return {
        "forward": round(parts["embeddings_forward"] + parts["pipeline_forward"]
                         + parts.get("head_broadcast", 0.0) + parts["head_forward"], 5),
        "backward": round(parts["pipeline_backward"] + parts["head_backward"]
                          + parts["head_transfers"] + parts.get("head_reduction", 0.0)
                          + parts["embeddings_backward"], 5),
        "update": round(parts["rest"], 5),
    }


def stage_summary(stage: StageTimes) -> Dict[str, Any]:
    cells = {}
    for k, c in stage.cells.items():
        cells[str(k)] = {
            "source_chunks": c.source_chunks, "target_chunks": c.target_chunks,
            "forward_s": {"/".join(map(str, key)): round(v, 7) for key, v in c.forward.items()},
            "backward_s": {"/".join(map(str, key)): round(v, 7) for key, v in c.backward.items()},
            "forward_sum_s": round(sum(c.forward.values()), 6),
            "backward_sum_s": round(sum(c.backward.values()), 6),
            "output_bytes": {"/".join(map(str, key)): v for key, v in c.output_bytes.items()},
            "state_bytes": c.state_bytes,
        }
    return {
        "threads": stage.threads, "repeats": stage.repeats, "cells": cells,
        "embed_forward_s": round(stage.embed_forward, 6),
        "embed_backward_s": round(stage.embed_backward, 6),
        "head_forward_s": {str(s): round(v, 6) for s, v in stage.head_forward.items()},
        "head_backward_s": {str(s): round(v, 6) for s, v in stage.head_backward.items()},
        "head_param_bytes": stage.head_param_bytes,
        "head_input_bytes_per_sentence": stage.head_input_bytes_per_sentence,
        "rest_s": round(stage.rest, 6),
        "param_bytes_master": stage.param_bytes_master,
        "param_bytes_per_layer": list(stage.param_bytes_layer),
        "run_all_overhead_s": {str(n): round(v, 7) for n, v in stage.cycle_overhead.items()},
    }


def format_report(report: Dict[str, Any]) -> str:
    lines = [
        f"pipeline model: preset {report['preset']}, model {report['model']}, "
        f"batch {report['batch']}" + (f" ({report['batch_note']})" if report["batch_note"] else ""),
        f"per-device times measured on: {report['measured_on']}",
        f"denominator: {report['denominator']}",
    ]
    s = report["stage_times"]
    lines.append(
        f"stage times (1 device): embeddings {s['embed_forward_s'] + s['embed_backward_s']:.4f}s, "
        f"head fwd {s['head_forward_s']} bwd {s['head_backward_s']}, rest {s['rest_s']:.4f}s, "
        f"run_all round trip {s['run_all_overhead_s']}"
    )
    for k, c in s["cells"].items():
        lines.append(f"  K={k}: cells fwd sum {c['forward_sum_s']:.4f}s, bwd sum "
                     f"{c['backward_sum_s']:.4f}s")
    cuda = report["link"]["dataflow"]
    for schedule, rows in report["predictions"].items():
        label = ("CPU worker threads (barrier per cycle; head shards on the workers), no transfer cost"
                 if schedule == "cycle" else
                 f"CUDA schedule (dataflow), link {cuda['bandwidth_gbs']} GB/s + "
                 f"{cuda['latency_us']} us/transfer; per-device times as measured above")
        lines.append(f"predicted speedup, {label}:")
        lines.append(f"  {'N':>2} {'K':>3} {'step s':>9} {'pipe fwd':>9} {'pipe bwd':>9} "
                     f"{'head':>8} {'xfer':>7} {'emb+rest':>8} {'speedup':>8}")
        for r in rows:
            lines.append(
                f"  {r['devices']:>2} {r['chunks']:>3} {r['total']:>9.4f} "
                f"{r['pipeline_forward']:>9.4f} {r['pipeline_backward']:>9.4f} "
                f"{r['head_forward'] + r['head_backward']:>8.4f} "
                f"{r['head_transfers'] + r.get('head_broadcast', 0.0) + r.get('head_reduction', 0.0):>7.4f} "
                f"{r['embeddings_forward'] + r['embeddings_backward'] + r['rest']:>8.4f} "
                f"{r['speedup']:>8.3f}"
            )
    if "validation" in report:
        lines.append("validation (real step on CPU devices, 1 thread each, median of "
                     f"{report['validation']['repeats']}):")
        v = report["validation"]
        lines.append(
            "  two CPU workers at once run "
            f"{v['two_worker_slowdown']['lstm']['used']:.2f}x (LSTM cells) / "
            f"{v['two_worker_slowdown']['head']['used']:.2f}x (head shards) slower each than "
            "one alone on this box now (1.00 = independent cores)")
        lines.append(f"  {'N':>2} {'K':>3} {'meas s':>8} {'pred s':>8} {'meas x':>7} "
                     f"{'min x':>7} {'pred x':>7} {'err':>7} {'pred+c x':>8} {'err':>7}")
        for r in report["validation"]["rows"]:
            lines.append(
                f"  {r['devices']:>2} {r['chunks']:>3} {r['measured_step_s']:>8.4f} "
                f"{r['predicted_step_s']:>8.4f} {r['measured_speedup']:>7.3f} "
                f"{r['measured_speedup_of_fastest_runs']:>7.3f} "
                f"{r['predicted_speedup']:>7.3f} {100 * r['speedup_error']:>6.1f}% "
                f"{r['predicted_speedup_with_measured_contention']:>8.3f} "
                f"{100 * r['speedup_error_with_measured_contention']:>6.1f}%"
            )
        lines.append("  phases, measured / predicted / predicted with contention (s): "
                     "forward, backward, update")
        for r in report["validation"]["rows"]:
            ph = r["phases_s"]
            lines.append(f"  {r['devices']:>2} {r['chunks']:>3}  " + "   ".join(
                f"{name} {ph['measured'][name]:.3f}/{ph['predicted'][name]:.3f}/"
                f"{ph['predicted_with_contention'][name]:.3f}"
                for name in ("forward", "backward", "update")))
        lines.append("  (speedups over the cpu K=1 step, measured (median; min x: fastest runs) "
                     "and predicted; err = (pred - meas) / meas against the median; pred+c: "
                     "with the measured two-worker slowdown)")
    load = report["load_average_1_5_15min"]
    lines.append(f"load average (1 min) at start {load['start'][0]:.2f}, end {load['end'][0]:.2f}; "
                 f"elapsed {report['elapsed_s']}s")
    return "\n".join(lines)
