"""Every way to train on this machine's cores, against fairseq's own ``lstm`` under its own
data parallelism: what a user gains by choosing this project.

    python -m benchmarks.versus_lstm --rounds 3          # on 2 CPU cores: ~15 minutes

All configurations train the small preset's sizes (2+2 layers x 256, the sample at an 8K
vocabulary) at one global batch (``--max-tokens`` 4000 over all processes), ``--optimizer
torch_adam``, from scratch with ``fairseq-train``; the first log interval is warm-up:

- lstm DDP (torch / legacy): fairseq's ``lstm`` (input feeding), N processes x 1 thread,
  ``--ddp-backend pytorch_ddp`` (which works on CPUs with the plugin loaded) and
  ``legacy_ddp``; the faster of the two is the baseline;
- hybrid DDP (torch / legacy): ``hybrid_lstm --hybrid-devices cpu``, N processes x 1 thread;
- hybrid cpu x N: ``hybrid_lstm`` on N CPU devices in one process (a worker thread each).

Rounds are interleaved (each round runs every configuration once, the order reversed
every other round) and the report gives medians, each configuration over the baseline, and
every round's ratios. Writes ``<out>/versus-lstm-cpu.json``.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_hybrid.planning.measure import median

from .data import sample_data
from .fairseq_runs import ROOT, TrainConfig, run_training
from fairseq_hybrid.jsonio import write_json_atomic
from .scaling import PRESETS

BASELINES = ("lstm-ddp-torch", "lstm-ddp-legacy")


def configurations(processes: int, max_tokens: int) -> List[TrainConfig]:
    preset = PRESETS["small"]
    lstm = f"--arch {preset.lstm_arch} {preset.model_options} --cpu"
    hybrid = f"--arch {preset.hybrid_arch} {preset.model_options}"
    per_process = max_tokens // processes
    devices = ",".join(["cpu"] * processes)
    return [
        TrainConfig("lstm-ddp-torch", f"fairseq lstm, DDP {processes} x 1 thread, pytorch_ddp",
                    f"{lstm} --ddp-backend pytorch_ddp", 1, processes, per_process),
        TrainConfig("lstm-ddp-legacy", f"fairseq lstm, DDP {processes} x 1 thread, legacy_ddp",
                    f"{lstm} --ddp-backend legacy_ddp", 1, processes, per_process),
        TrainConfig("hybrid-ddp-torch", f"hybrid_lstm, DDP {processes} x 1 thread, pytorch_ddp (default)",
                    f"{hybrid} --hybrid-devices cpu", 1, processes, per_process),
        TrainConfig("hybrid-ddp-legacy", f"hybrid_lstm, DDP {processes} x 1 thread, legacy_ddp",
                    f"{hybrid} --hybrid-devices cpu --ddp-backend legacy_ddp", 1, processes, per_process),
        TrainConfig("hybrid-devices", f"hybrid_lstm on {devices}, one process",
                    f"{hybrid} --hybrid-devices {devices}", os.cpu_count() or 1, 1, max_tokens),
    ]


def measure(data: str, configs: Sequence[TrainConfig], rounds: int, updates: int, log_interval: int,
            progress=print) -> Dict[str, object]:
    speeds: Dict[str, List[float]] = {c.key: [] for c in configs}
    for round_index in range(rounds):
        order = list(configs) if round_index % 2 == 0 else list(reversed(configs))
        for config in order:
            result = run_training(data, config, updates, log_interval)
            speeds[config.key].append(result.target_wps)
            progress(f"round {round_index + 1}/{rounds} {config.key}: {result.target_wps:,.0f} target tokens/s")
    medians = {key: median(values) for key, values in speeds.items()}
    baseline = max(BASELINES, key=lambda key: medians[key])
    return {
        "baseline": baseline,
        "configs": {c.key: {"name": c.name, "options": c.options, "processes": c.processes,
                            "max_tokens_per_process": c.max_tokens, "threads": c.threads,
                            "runs": speeds[c.key], "median": medians[c.key],
                            "over_baseline": medians[c.key] / medians[baseline],
                            "round_ratios": [s / b for s, b in zip(speeds[c.key], speeds[baseline])]}
                    for c in configs},
    }


def format_report(report: Dict[str, object]) -> str:
    baseline = report["baseline"]
    lines = [f"target tokens/s, medians over rounds; ratios over {baseline} (the faster fairseq lstm):"]
    for key, entry in report["configs"].items():
        rounds = ", ".join(f"{r:.2f}" for r in entry["round_ratios"])
        lines.append(f"  {entry['name']}: {entry['median']:,.0f}  {entry['over_baseline']:.2f}x (rounds: {rounds})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                        help="data-parallel processes and CPU devices (default: the cores)")
    parser.add_argument("--max-tokens", type=int, default=PRESETS["small"].max_tokens,
                        help="the global batch, split between processes")
    parser.add_argument("--updates", type=int, default=24)
    parser.add_argument("--log-interval", type=int, default=6)
    parser.add_argument("--work", default=str(ROOT / "work/bench"))
    parser.add_argument("--out", default=str(ROOT / "results/bench"))
    args = parser.parse_args(argv)
    for name in ("rounds", "processes", "max_tokens", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be an integer >= 1")
    if args.updates < 2 * args.log_interval:
        parser.error(f"--updates {args.updates}: at least two --log-interval {args.log_interval} intervals")
    vocab = PRESETS["small"].vocab
    data = str(sample_data(vocab, Path(args.work) / f"sample-v{vocab}"))
    report = measure(data, configurations(args.processes, args.max_tokens), args.rounds, args.updates,
                     args.log_interval)
    report["command"] = "python -m benchmarks.versus_lstm " + " ".join(argv if argv is not None else [])
    report["loadavg"] = os.getloadavg()
    write_json_atomic(report, Path(args.out) / "versus-lstm-cpu.json")
    print(format_report(report))


if __name__ == "__main__":
    main()
