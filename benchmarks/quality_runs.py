"""One run of the quality study: ``fairseq-train`` of one model and seed with validation
and interval checkpoints, its learning curve read from fairseq's JSON log, the average of
its last interval checkpoints (``recipes/lib/average.py``), and beam search on the test
set with ``fairseq-generate``, its hypotheses put back in corpus order.

The learning curve's time axis is training time only: the running sum of fairseq's
per-interval ``train_wall`` (the time spent in training steps; validation and checkpoint
saving excluded, since they do not depend on how fast a model learns). fairseq's ``wall``
(everything since the start) is kept next to it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .fairseq_runs import BIN, ROOT, USER_DIR, BenchmarkError

AVERAGE = ROOT / "recipes/lib/average.py"


@dataclass(frozen=True)
class Model:
    key: str
    name: str
    options: str  # fairseq-train options naming the architecture and its variant
    criterion: str


SIZES = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --encoder-hidden-size 256 "
         "--decoder-embed-dim 256 --decoder-hidden-size 256 --decoder-out-embed-dim 256")
MODELS = [
    Model("lstm", "fairseq lstm (input feeding)", "--arch lstm", "label_smoothed_cross_entropy"),
    Model("hybrid", "hybrid_lstm (no input feeding)", "--arch hybrid_lstm --hybrid-devices cpu",
          "hybrid_cross_entropy"),
    Model("hybrid_if", "hybrid_lstm --input-feeding", "--arch hybrid_lstm --hybrid-devices cpu --input-feeding",
          "hybrid_cross_entropy"),
]


@dataclass(frozen=True)
class Schedule:
    """What every model and seed shares (the matched settings)."""

    updates: int
    interval: int  # validate and save every this many updates
    average: int  # average the last N interval checkpoints
    max_tokens: int = 2000
    lr: float = 0.003
    dropout: float = 0.3
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    optimizer: str = "torch_adam"
    adam_betas: str = "(0.9, 0.98)"
    lr_scheduler: str = "fixed"
    sizes: str = SIZES
    share: str = "--share-all-embeddings"
    beam: int = 5
    max_len_a: float = 1.5
    max_len_b: int = 10
    threads: int = 1


def train_command(data: str, model: Model, schedule: Schedule, seed: int, save_dir: Path) -> List[str]:
    s = schedule
    return [
        str(BIN / "fairseq-train"), data, "--user-dir", USER_DIR, *shlex.split(model.options),
        *shlex.split(s.sizes), *shlex.split(s.share), "--dropout", str(s.dropout),
        "--criterion", model.criterion, "--label-smoothing", str(s.label_smoothing),
        "--optimizer", s.optimizer, "--adam-betas", s.adam_betas, "--lr", str(s.lr),
        "--lr-scheduler", s.lr_scheduler, "--clip-norm", str(s.clip_norm),
        "--max-tokens", str(s.max_tokens), "--max-update", str(s.updates), "--seed", str(seed),
        "--validate-interval", "1000000", "--validate-interval-updates", str(s.interval),
        "--save-interval", "1000000", "--save-interval-updates", str(s.interval),
        "--keep-interval-updates", str(s.average), "--no-epoch-checkpoints", "--save-dir", str(save_dir),
        "--required-batch-size-multiple", "1", "--num-workers", "0",
        "--log-format", "json", "--log-interval", str(s.interval),
    ]


def records(log: str, kind: str) -> List[Dict[str, str]]:
    """fairseq's JSON log records of one kind (train_inner, valid, train)."""
    marker = f"| {kind} |"
    return [json.loads(line[line.index("{"):]) for line in log.splitlines() if marker in line and "{" in line]


PARAMS = re.compile(r"num\. (?:model|shared model) params: ([\d,]+)")


def learning_curve(log: str) -> List[Dict[str, float]]:
    """Validation loss, nll_loss (bits/token), perplexity at each validation, with the
    training seconds and wall seconds at that update (from the train_inner record of the
    same update; the validation interval is a multiple of the log interval)."""
    train_seconds, clock = 0.0, {}
    for record in records(log, "train_inner"):
        train_seconds += float(record["train_wall"])
        clock[int(record["num_updates"])] = (train_seconds, float(record["wall"]))
    curve = []
    for record in records(log, "valid"):
        updates = int(record["valid_num_updates"])
        if updates not in clock:
            raise BenchmarkError(f"no train_inner record at update {updates}: the validation interval "
                                 "must be a multiple of the log interval")
        curve.append({"updates": updates, "loss": float(record["valid_loss"]),
                      "nll_loss": float(record["valid_nll_loss"]), "ppl": float(record["valid_ppl"]),
                      "train_seconds": clock[updates][0], "wall_seconds": clock[updates][1]})
    return curve


def parameters(log: str) -> int:
    match = PARAMS.search(log)
    if not match:
        raise BenchmarkError("fairseq-train did not log its parameter count")
    return int(match.group(1).replace(",", ""))


def environment(threads: int) -> Dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_checked(command: List[str], log_path: Path, threads: int, timeout: float,
                stdout_path: Optional[Path] = None) -> str:
    """Run ``command`` with its stderr (and stdout, unless ``stdout_path`` gets it) in
    ``log_path``; return the log (or, with ``stdout_path``, the stdout)."""
    with open(log_path, "w", encoding="utf-8") as log, \
            open(stdout_path or os.devnull, "w", encoding="utf-8") as out:
        proc = subprocess.run(command, stdout=out if stdout_path else log, stderr=log, text=True,
                              env=environment(threads), timeout=timeout, cwd=log_path.parent)
    text = log_path.read_text(encoding="utf-8")
    if proc.returncode != 0:
        raise BenchmarkError(f"{shlex.join(command)} exited {proc.returncode} (log: {log_path}):\n{text[-3000:]}")
    return stdout_path.read_text(encoding="utf-8") if stdout_path else text


def train(data: str, model: Model, schedule: Schedule, seed: int, run_dir: Path,
          timeout: float) -> Dict[str, object]:
    """Train one model and seed; return its curve, parameter count and seconds."""
    save_dir = run_dir / "checkpoints"
    save_dir.mkdir(parents=True, exist_ok=True)
    log = run_checked(train_command(data, model, schedule, seed, save_dir), run_dir / "train.log",
                      schedule.threads, timeout)
    curve = learning_curve(log)
    if not curve or curve[-1]["updates"] != schedule.updates:
        raise BenchmarkError(f"{model.name} seed {seed}: training stopped before update {schedule.updates} "
                             f"(log: {run_dir / 'train.log'})")
    train_records = records(log, "train_inner")
    return {"parameters": parameters(log), "curve": curve,
            "train_seconds": curve[-1]["train_seconds"], "wall_seconds": float(train_records[-1]["wall"])}


def interval_checkpoints(save_dir: Path) -> List[Path]:
    """checkpoint_<epoch>_<updates>.pt files, oldest first."""
    found = []
    for path in save_dir.glob("checkpoint_*_*.pt"):
        match = re.fullmatch(r"checkpoint_(\d+)_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(2)), path))
    return [p for _, p in sorted(found)]


def average_last(save_dir: Path, count: int, threads: int, timeout: float) -> Tuple[Path, List[int]]:
    """Average the last ``count`` interval checkpoints fairseq kept. fairseq writes no
    interval checkpoint at an update that also ends an epoch (it would be an epoch
    checkpoint, which the study turns off), so the average may reach one interval further
    back; the updates averaged are returned and recorded."""
    checkpoints = interval_checkpoints(save_dir)[-count:]
    if len(checkpoints) < count:
        raise BenchmarkError(f"{save_dir}: {len(checkpoints)} interval checkpoints, {count} needed to average")
    out = save_dir / f"average_last{count}.pt"
    run_checked([sys.executable, str(AVERAGE), "--out", str(out), *map(str, checkpoints)],
                save_dir / "average.log", threads, timeout)
    return out, [int(p.stem.split("_")[2]) for p in checkpoints]


GENERATE_SUMMARY = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s")


def generate(data: str, checkpoint: Path, schedule: Schedule, remove_bpe: Optional[str], out: Path,
             timeout: float) -> Dict[str, object]:
    """Beam search over the test set; hypotheses (D-), references (T-) and sources (S-)
    in corpus order, as fairseq prints them after ``--remove-bpe``."""
    command = [
        str(BIN / "fairseq-generate"), data, "--user-dir", USER_DIR, "--path", str(checkpoint),
        "--gen-subset", "test", "--beam", str(schedule.beam), "--batch-size", "64",
        "--max-len-a", str(schedule.max_len_a), "--max-len-b", str(schedule.max_len_b),
        "--required-batch-size-multiple", "1", "--num-workers", "0",
        *(["--remove-bpe", remove_bpe] if remove_bpe else []),
    ]
    output = run_checked(command, out.with_suffix(".log"), schedule.threads, timeout, stdout_path=out)
    lines: Dict[str, Dict[int, str]] = {"S": {}, "T": {}, "D": {}}
    for line in output.splitlines():
        kind = line[:2]
        if kind in ("S-", "T-", "D-") and "\t" in line:
            parts = line.split("\t")
            lines[kind[0]][int(parts[0][2:])] = parts[-1] if kind == "D-" else parts[1]
    count = len(lines["T"])
    missing = [i for i in range(count) if i not in lines["D"]]
    if count == 0 or missing:
        raise BenchmarkError(f"{out}: {len(missing)} of {count} test sentences have no hypothesis")
    match = GENERATE_SUMMARY.search(output + out.with_suffix(".log").read_text(encoding="utf-8"))
    return {key: [lines[key][i] for i in range(count)] for key in ("S", "T", "D")} | {
        "seconds": float(match.group(3)) if match else None}
