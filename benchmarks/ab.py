"""Before and after, interleaved, in one run: ``fairseq-train`` target tokens/s of the
scaling benchmark's configurations with this checkout's plugin (after) and either with the
plugin at another commit (``--base``: from a temporary git worktree) or with this plugin
with one of its internal switches set (``--switch``: the same code, one mechanism turned
back to what it was).

    python -m benchmarks.ab --base 228701d --configs e,c --rounds 5
    python -m benchmarks.ab --switch inline-collectives --configs e --rounds 6

Each round trains every configuration with both sides, the order alternating between
rounds (before-after, then after-before) so a machine that slows down or speeds up during
the run charges both alike; ``--updates`` updates each, the first log interval warm-up.
The report gives each side's median, the after/before ratio of the medians and every
round's own ratio: on a shared machine single runs move by up to 20%, so a change is
visible only where the rounds' ratios agree. Only the plugin (or the switch) differs
between the sides: the same venv, fairseq, data (the scaling benchmark's) and options. The
command that was run and each side's ``fairseq-train`` command are printed first. Run it
with nothing else on the machine.

Switches (environment variables the plugin reads; not user options):
- ``inline-collectives``: before = ``FAIRSEQ_HYBRID_INLINE_COLLECTIVES=1``, the head's
  parameter broadcast and gradient reduction run on the calling thread when issued (as the
  engine did before it overlapped them); after = overlapped on the collective worker.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from fairseq_hybrid.planning.measure import median

from .data import sample_data
from fairseq_hybrid.jsonio import write_json_atomic
from fairseq_hybrid.parallel.collective_worker import INLINE_VARIABLE

from .fairseq_runs import ROOT, USER_DIR, BenchmarkError, run_training, train_command
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


SWITCHES = {"inline-collectives": {INLINE_VARIABLE: "1"}}  # name -> the "before" side's env


@dataclass(frozen=True)
class Side:
    """What one side trains with: a plugin directory and environment variables to set."""
    user_dir: str = USER_DIR
    env: Dict[str, str] = field(default_factory=dict)


def side_commands(data: str, config, sides: Dict[str, Side], updates: int,
                  log_interval: int) -> Dict[str, str]:
    """Each side's ``fairseq-train`` command line (its environment in front) for ``config``."""
    return {name: " ".join([*(f"{k}={shlex.quote(v)}" for k, v in side.env.items()),
                            shlex.join(train_command(data, config, updates, log_interval, None, "",
                                                     user_dir=side.user_dir))])
            for name, side in sides.items()}


def compare(data: str, configs: Sequence, sides: Dict[str, Side], rounds: int, updates: int,
            log_interval: int, progress=print) -> Dict[str, object]:
    """``rounds`` interleaved rounds of every config with each side."""
    speeds: Dict[str, Dict[str, List[float]]] = {c.key: {side: [] for side in sides} for c in configs}
    names = list(sides)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for config in configs:
            for side in order:
                result = run_training(data, config, updates, log_interval,
                                      user_dir=sides[side].user_dir, env=dict(sides[side].env))
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
    """``base``: what the before side is (a commit, or a switch and its setting)."""
    lines = [f"after (this checkout) / before ({base}), target tokens/s, medians:"]
    for key, entry in report.items():
        rounds = ", ".join(f"{r:.3f}" for r in entry["round_ratios"])
        lines.append(f"  ({key}) {entry['name']}: {entry['median']['after']:,.0f} / "
                     f"{entry['median']['before']:,.0f} = {entry['ratio_after_over_before']:.3f}x "
                     f"(rounds: {rounds})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    before = parser.add_mutually_exclusive_group(required=True)
    before.add_argument("--base", help="the commit to compare against (before)")
    before.add_argument("--switch", choices=sorted(SWITCHES),
                        help="before: this checkout with the internal switch set")
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
    configs = [available[key] for key in wanted]
    # absolute: each run trains in a temporary directory of its own
    data = str(Path(args.data).resolve()) if args.data else str(
        sample_data(preset.vocab, Path(args.work).resolve() / f"sample-v{preset.vocab}"))
    command = shlex.join(["python", "-m", "benchmarks.ab", *(sys.argv[1:] if argv is None else argv)])
    print(f"command: {command}")
    with ExitStack() as stack:
        if args.base is not None:
            base_root = stack.enter_context(worktree(args.base))
            sides = {"before": Side(str(base_root / "fairseq_hybrid")), "after": Side()}
            base = args.base
        else:
            sides = {"before": Side(env=SWITCHES[args.switch]), "after": Side()}
            base = " ".join(f"{k}={v}" for k, v in SWITCHES[args.switch].items())
        for config in configs:
            for name, line in side_commands(data, config, sides, args.updates,
                                            args.log_interval).items():
                print(f"({config.key}) {name}: {line}")
        report = compare(data, configs, sides, args.rounds, args.updates, args.log_interval)
    print(format_report(report, base))
    if args.json:
        write_json_atomic({"base": base, "command": command, "configs": report}, args.json)


if __name__ == "__main__":
    main()
