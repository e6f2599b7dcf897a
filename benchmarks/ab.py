"""Before and after, interleaved, in one run: ``fairseq-train`` target tokens/s of the
scaling benchmark's configurations with this checkout's plugin (after) and with the
plugin at another commit (before, from a temporary git worktree).

    python -m benchmarks.ab --base 228701d --configs e,c --rounds 5

Each round trains every configuration with both plugins, the order alternating between
rounds (before-after, then after-before) so a machine that slows down or speeds up during
the run charges both alike; ``--updates`` updates each, the first log interval warm-up.
The report gives each side's median, the after/before ratio of the medians and every
round's own ratio: on a shared machine single runs move by up to 20%, so a change is
visible only where the rounds' ratios agree. Only the plugin differs between the sides:
the same venv, fairseq, data (the scaling benchmark's) and options.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from fairseq_hybrid.planning.measure import median

from .data import sample_data
from .fairseq_runs import ROOT, USER_DIR, BenchmarkError, run_training
from fairseq_hybrid.jsonio import write_json_atomic
from .scaling import PRESETS, configurations, parse_devices


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of ``revision`` (removed afterwards)."""
    resolved = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                              capture_output=True, text=True)
    if resolved.returncode != 0:
        raise BenchmarkError(f"--base {revision!r}: not a commit of this repository")
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        path = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path),
                        resolved.stdout.strip()], check=True, capture_output=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           capture_output=True)


def compare(data: str, configs: Sequence, user_dirs: Dict[str, str], rounds: int, updates: int,
            log_interval: int, progress=print) -> Dict[str, object]:
    """``rounds`` interleaved rounds of every config with each side's plugin."""
    speeds: Dict[str, Dict[str, List[float]]] = {c.key: {side: [] for side in user_dirs} for c in configs}
    sides = list(user_dirs)
    for round_index in range(rounds):
        order = sides if round_index % 2 == 0 else sides[::-1]
        for config in configs:
            for side in order:
                result = run_training(data, config, updates, log_interval, user_dir=user_dirs[side])
                speeds[config.key][side].append(result.target_wps)
                progress(f"round {round_index + 1}/{rounds} ({config.key}) {side}: "
                         f"{result.target_wps:,.0f} target tokens/s")
    report: Dict[str, object] = {}
    for config in configs:
        runs = speeds[config.key]
        report[config.key] = {
            "name": config.name, "options": config.options, "runs": runs,
            "median": {side: median(values) for side, values in runs.items()},
            "ratio_after_over_before": median(runs["after"]) / median(runs["before"]),
            "round_ratios": [a / b for a, b in zip(runs["after"], runs["before"])],
        }
    return report


def format_report(report: Dict[str, object], base: str) -> str:
    lines = [f"after (this checkout) / before ({base}), target tokens/s, medians:"]
    for key, entry in report.items():
        rounds = ", ".join(f"{r:.3f}" for r in entry["round_ratios"])
        lines.append(f"  ({key}) {entry['name']}: {entry['median']['after']:,.0f} / "
                     f"{entry['median']['before']:,.0f} = {entry['ratio_after_over_before']:.3f}x "
                     f"(rounds: {rounds})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (before)")
    parser.add_argument("--configs", default="e", help="scaling configurations, e.g. e,c,b1 (default e)")
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--preset", choices=["small"], default="small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=32)
    parser.add_argument("--log-interval", type=int, default=8)
    parser.add_argument("--data", help="a fairseq-preprocess directory (default: the scaling benchmark's)")
    parser.add_argument("--work", default=str(ROOT / "work/bench"))
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.log_interval < 1 or args.updates < 2 * args.log_interval:
        parser.error(f"--rounds {args.rounds}, --updates {args.updates}, --log-interval "
                     f"{args.log_interval}: at least 1 round and two log intervals of updates")
    preset = PRESETS[args.preset]
    available = {c.key: c for c in configurations(preset, parse_devices(args.devices))}
    wanted = args.configs.split(",")
    unknown = [key for key in wanted if key not in available]
    if unknown:
        parser.error(f"--configs {args.configs}: {', '.join(unknown)} not among {', '.join(available)}")
    data = args.data or str(sample_data(preset.vocab, Path(args.work) / f"sample-v{preset.vocab}"))
    with worktree(args.base) as base_root:
        report = compare(data, [available[key] for key in wanted],
                         {"before": str(base_root / "fairseq_hybrid"), "after": USER_DIR},
                         args.rounds, args.updates, args.log_interval)
    print(format_report(report, args.base))
    if args.json:
        write_json_atomic({"base": args.base, "configs": report}, args.json)


if __name__ == "__main__":
    main()
