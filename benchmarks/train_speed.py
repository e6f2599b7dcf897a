"""Training throughput of fairseq-train configurations, measured in one run.

    python -m benchmarks.train_speed --data work/sample/bin --updates 200 --repeats 3 \
        --config lstm="--arch lstm ..." --config hybrid="OMP_NUM_THREADS=1 --arch hybrid_lstm ..." \
        --json results/bench/train_speed.json

Each configuration trains for ``--updates`` updates from scratch; the configurations run
interleaved (A B A B ...) so machine noise hits them alike. Throughput is fairseq's own
end-of-epoch/-run ``wps`` (target tokens per second over the timed training steps,
without validation); the report gives the median of the repeats and every run, and ratios
against the first configuration, named.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import torch

COMMON = (
    "--optimizer adam --lr 0.001 --clip-norm 1.0 --criterion {criterion} "
    "--max-tokens {max_tokens} --max-update {updates} --disable-validation --no-save "
    "--num-workers 0 --log-format json --log-interval 1000000 --seed 1 "
    "--required-batch-size-multiple 1"
)


def split_env(options: str) -> tuple:
    """Leading ``VAR=value`` words of a config set the environment (e.g. threads)."""
    words = shlex.split(options)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def train_wps(data: str, options: str, updates: int, max_tokens: int, user_dir: str) -> Dict[str, float]:
    criterion = "hybrid_cross_entropy" if "hybrid_lstm" in options else "label_smoothed_cross_entropy"
    env, words = split_env(options)
    command = [
        str(Path(sys.executable).parent / "fairseq-train"), data, "--user-dir", user_dir,
        *shlex.split(COMMON.format(criterion=criterion, max_tokens=max_tokens, updates=updates)),
        *words,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp,
                              env=dict(os.environ, PYTHONWARNINGS="ignore", **env))
    if proc.returncode != 0:
        sys.exit(f"train_speed.py: error: {' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    for line in reversed((proc.stdout + proc.stderr).splitlines()):
        if "| train |" in line and "{" in line:
            record = json.loads(line[line.index("{"):])
            return {"wps": float(record["train_wps"]), "ups": float(record["train_ups"]),
                    "wpb": float(record["train_wpb"]), "updates": int(record["train_num_updates"])}
    sys.exit(f"train_speed.py: error: no end-of-training record in the log of {' '.join(command)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="fairseq-preprocess output directory")
    parser.add_argument("--config", action="append", required=True, metavar="NAME=OPTIONS")
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args()
    if args.repeats < 1 or args.updates < 1:
        sys.exit("train_speed.py: error: --repeats and --updates must be >= 1")
    configs = []
    for item in args.config:
        if "=" not in item:
            sys.exit(f"train_speed.py: error: --config {item!r} is not NAME=OPTIONS")
        name, options = item.split("=", 1)
        configs.append((name, options))
    user_dir = str(Path(__file__).resolve().parent.parent / "fairseq_hybrid")
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name, _ in configs}
    for repeat in range(args.repeats):
        for name, options in configs:
            result = train_wps(args.data, options, args.updates, args.max_tokens, user_dir)
            runs[name].append(result)
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {result['wps']:.0f} wps", flush=True)
    medians = {name: statistics.median(r["wps"] for r in results) for name, results in runs.items()}
    base = configs[0][0]
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "python": platform.python_version()},
        "data": args.data, "updates": args.updates, "max_tokens": args.max_tokens,
        "configs": dict(configs), "runs": runs, "median_wps": medians,
        "ratios": {f"{name} / {base}": medians[name] / medians[base] for name in medians if name != base},
    }
    for name, value in medians.items():
        print(f"{name:>24}: median {value:8.0f} wps")
    for label, ratio in report["ratios"].items():
        print(f"{label:>40}: {ratio:.2f}x")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False) as tmp:
            json.dump(report, tmp, indent=2)
        os.replace(tmp.name, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
