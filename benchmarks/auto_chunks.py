"""Validation of ``--pipeline-chunks auto`` and of the advisor's step-time model with
``fairseq-train`` on ``cpu,cpu``: the K that auto picks against the fastest K in
{1, 2, 4, 8}, every K's predicted tokens/s (the advisor's model: stage times of the real
model on a real median batch) against fairseq's measured ones, and how long auto's
measurement takes next to a 1,000-update run.

    python -m benchmarks.auto_chunks --rounds 3 --updates 25 \\
        --json results/bench/auto-chunks-cpu-cpu.json

Every configuration trains from scratch (seed 1) on the bundled sample (8,000-piece
sentencepiece vocabulary, hybrid_lstm 2+2 x 256, ``--max-tokens 4000``, torch_adam);
configurations are interleaved over the rounds (auto, 1, 2, 4, 8, auto, 1, ...) and each
speed is fairseq's own target tokens/s over the updates after the first log interval;
medians over the rounds. This machine's timing is noisy when it is shared: the ratios that
matter are taken within the run.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_hybrid.jsonio import write_json_atomic

from .data import sample_data
from .fairseq_runs import ROOT, USER_DIR, BenchmarkError, TrainConfig, interval_speed, train_command

FIXED = (1, 2, 4, 8)
MODEL = "--arch hybrid_lstm --hybrid-devices cpu,cpu"
CHOICE = re.compile(r"pipeline chunks: (\d+), chosen by the performance model from ([\d.]+) s of measurement")


def train_once(data: str, chunks: str, updates: int, log_interval: int, max_tokens: int,
               threads: int) -> Dict[str, Any]:
    config = TrainConfig(f"K={chunks}", f"--pipeline-chunks {chunks}", f"{MODEL} --pipeline-chunks {chunks}",
                         threads=threads, max_tokens=max_tokens)
    command = train_command(data, config, updates, log_interval, None, "")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(config.threads))
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BenchmarkError(f"{shlex.join(command)} exited {proc.returncode}:\n{log[-3000:]}")
    wps, _, timed, per_update = interval_speed(log, log_interval)
    result: Dict[str, Any] = {"target_wps": wps, "timed_updates": timed, "tokens_per_update": per_update}
    match = CHOICE.search(log)
    if match:
        result["chosen"], result["measurement_s"] = int(match.group(1)), float(match.group(2))
    return result


def predicted_tokens_per_s(data: str, max_tokens: int) -> Dict[str, Any]:
    """The advisor's model for each fixed K: stage times of the real model on the median
    batch at ``max_tokens`` measured on one CPU device, the step simulated for cpu,cpu."""
    from fairseq_hybrid.tools.advise import load_task_and_model, measure_batch, parse, representative_batch
    from fairseq_hybrid.plugin.placement_options import placement_options
    from fairseq_hybrid.planning.recommend import predict

    args = parse([data, "--user-dir", USER_DIR, *shlex.split(MODEL), "--criterion", "hybrid_cross_entropy",
                  "--label-smoothing", "0.1", "--max-tokens", str(max_tokens),
                  "--required-batch-size-multiple", "1"])
    task, model, _ = load_task_and_model(args)
    sample = representative_batch(task.dataset("train"), max_tokens, args)
    stage = measure_batch(model, task, sample, placement_options(args).all_devices()[0], threads=1)
    tokens = int(sample["ntokens"])
    return {"batch_target_tokens": tokens,
            "by_k": {k: predict(stage, 2, k, "cycle", tokens=tokens).tokens_per_s for k in FIXED}}


def run(data: str, rounds: int, updates: int, log_interval: int, max_tokens: int, threads: int = 2,
        progress=lambda message: None) -> Dict[str, Any]:
    started = time.perf_counter()
    load_start = os.getloadavg()
    labels = ["auto", *map(str, FIXED)]
    runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in labels}
    for round_index in range(rounds):
        for label in labels:
            runs[label].append(train_once(data, label, updates, log_interval, max_tokens, threads))
            progress(f"round {round_index + 1}/{rounds}: --pipeline-chunks {label}: "
                     f"{runs[label][-1]['target_wps']:,.0f} tok/s")
    predicted = predicted_tokens_per_s(data, max_tokens)
    median = {label: statistics.median(r["target_wps"] for r in runs[label]) for label in labels}
    fastest = max(FIXED, key=lambda k: median[str(k)])
    chosen = [r["chosen"] for r in runs["auto"]]
    measurement = [r["measurement_s"] for r in runs["auto"]]
    step_s = statistics.median(r["tokens_per_update"] for r in runs["auto"]) / median["auto"]
    rows = [{"chunks": k, "measured_wps": round(median[str(k)], 1),
             "measured_runs": [round(r["target_wps"], 1) for r in runs[str(k)]],
             "predicted_wps": round(predicted["by_k"][k], 1),
             "error": round(predicted["by_k"][k] / median[str(k)] - 1, 4),
             "auto_chose_it": sum(c == k for c in chosen)} for k in FIXED]
    auto_k = statistics.mode(chosen)
    return {
        "what": "fairseq-train on cpu,cpu: --pipeline-chunks auto against fixed K; the "
                "advisor's predicted tokens/s against the measured ones",
        "data": data, "model": MODEL, "max_tokens": max_tokens, "updates": updates,
        "log_interval": log_interval, "rounds": rounds, "omp_num_threads": threads,
        "auto": {"chosen_per_round": chosen, "measured_wps": round(median["auto"], 1),
                 "measured_runs": [round(r["target_wps"], 1) for r in runs["auto"]],
                 "measurement_s": measurement},
        "fixed": rows,
        "fastest_fixed_k": fastest,
        "auto_vs_fastest": round(median["auto"] / median[str(fastest)], 4),
        "chosen_k_vs_fastest": round(median[str(auto_k)] / median[str(fastest)], 4)
        if str(auto_k) in median else None,
        "measurement_share_of_1000_updates": round(statistics.median(measurement) / (1000 * step_s), 5),
        "step_s_auto": round(step_s, 4),
        "prediction_batch_target_tokens": predicted["batch_target_tokens"],
        "load_average_1_5_15min": {"start": load_start, "end": os.getloadavg()},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def format_report(report: Dict[str, Any]) -> str:
    auto = report["auto"]
    lines = [f"--pipeline-chunks auto on cpu,cpu ({report['rounds']} rounds x {report['updates']} updates, "
             f"--max-tokens {report['max_tokens']}, "
             f"OMP_NUM_THREADS={report.get('omp_num_threads', 2)}; "
             f"load {report['load_average_1_5_15min']['start'][0]:.1f} "
             f"-> {report['load_average_1_5_15min']['end'][0]:.1f})", "",
             "| K | measured tok/s (median) | predicted tok/s | error | auto chose it |",
             "|---:|---:|---:|---:|---:|"]
    for row in report["fixed"]:
        lines.append(f"| {row['chunks']} | {row['measured_wps']:,.0f} | {row['predicted_wps']:,.0f} | "
                     f"{row['error']:+.1%} | {row['auto_chose_it']}/{report['rounds']} |")
    lines.append(f"| auto | {auto['measured_wps']:,.0f} | | | |")
    lines += ["",
              f"- auto chose K = {auto['chosen_per_round']} (per round); fastest fixed K: {report['fastest_fixed_k']}",
              f"- auto / fastest fixed K = {report['auto_vs_fastest']:.3f} (target >= 0.92)",
              f"- chosen K / fastest fixed K = {report['chosen_k_vs_fastest']}",
              f"- auto's measurement: {', '.join(f'{s:.2f}' for s in auto['measurement_s'])} s = "
              f"{report['measurement_share_of_1000_updates']:.2%} of a 1,000-update run "
              f"({report['step_s_auto']:.3f} s/update) (goal < 5%)"]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="binarized data (default: the bundled sample at 8,000 pieces, "
                        "prepared under --work)")
    parser.add_argument("--work", default=str(ROOT / "work" / "bench-sample-8000"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=25)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2,
                        help="OMP_NUM_THREADS of each fairseq-train (default 2: this box's cores; the "
                             "CPU device workers split the cores whatever it is)")
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.updates <= args.log_interval:
        sys.exit("auto_chunks: error: --rounds >= 1 and --updates > --log-interval")
    data = args.data or str(sample_data(8000, Path(args.work)))
    report = run(data, args.rounds, args.updates, args.log_interval, args.max_tokens, args.threads,
                 progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
    print(format_report(report))
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
