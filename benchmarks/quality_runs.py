"""Training one run of the quality study: the models, the matched schedule, the
``fairseq-train`` command (validation every ``interval`` updates, ``--patience``, the
same ``--max-update`` budget for every model, resumable from ``checkpoint_last.pt``), and
what is read back from fairseq's JSON log and the plugin's memory report.

The learning curve's time axis is training time only: the running sum of fairseq's
per-interval ``train_wall`` (validation and checkpoint saving excluded). A resumed run
appends to the same log; records are keyed by update, so updates replayed after a resume
count once.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

import numpy as np

from .fairseq_runs import BIN, USER_DIR, BenchmarkError

MEMORY_ENV = "FAIRSEQ_HYBRID_MEMORY_REPORT"  # fairseq_hybrid/plugin/memory_report.py


@dataclass(frozen=True)
class Model:
    key: str
    name: str
    options: str  # fairseq-train options naming the architecture and its variant
    criterion: str


MODELS = [
    Model("lstm", "fairseq lstm (input feeding)", "--arch lstm", "label_smoothed_cross_entropy"),
    Model("hybrid", "hybrid_lstm (no input feeding)", "--arch hybrid_lstm --hybrid-devices cpu",
          "hybrid_cross_entropy"),
    Model("hybrid_if", "hybrid_lstm --input-feeding", "--arch hybrid_lstm --hybrid-devices cpu --input-feeding",
          "hybrid_cross_entropy"),
]
MODEL = {m.key: m for m in MODELS}
# --preset wmt: the WMT recipes' models (recipes/lib/wmt.sh): 4+4 x 1000, Luong attention
WMT_ARCHS = {"lstm": "lstm_luong_wmt_en_de", "hybrid": "hybrid_lstm_wmt_en_de", "hybrid_if": "hybrid_lstm_wmt_en_de"}


def model_options(key: str, preset: str, hybrid_devices: str) -> str:
    """fairseq-train options of one model: its --arch (the preset's), its devices."""
    options = MODEL[key].options.replace("--hybrid-devices cpu", f"--hybrid-devices {hybrid_devices}")
    if preset == "wmt":
        options = options.replace(f"--arch {'hybrid_lstm' if key != 'lstm' else 'lstm'}",
                                  f"--arch {WMT_ARCHS[key]}", 1)
    return options


def visible_devices(options: str, hybrid_devices: str) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES of a run: "" (no GPU) on CPU; the hybrid as the caller has it
    (its --hybrid-devices name the GPUs); the baseline (and beam search) only the first of
    them, as recipes/lib/wmt.sh runs them."""
    if "cuda" not in hybrid_devices:
        return ""
    return None if "--hybrid-devices" in options else hybrid_devices.split(",")[0].split(":")[1]


def sizes(layers: int, dim: int) -> str:
    return (f"--encoder-layers {layers} --decoder-layers {layers} --encoder-embed-dim {dim} "
            f"--encoder-hidden-size {dim} --decoder-embed-dim {dim} --decoder-hidden-size {dim} "
            f"--decoder-out-embed-dim {dim}")


@dataclass(frozen=True)
class Schedule:
    """What every model and seed shares (the matched settings). The optimizer and the
    learning-rate schedule are the sample recipe's (recipes/sample/run.sh): fairseq's
    ``adam``, betas (0.9, 0.98), lr 0.003 fixed, clip-norm 1, dropout 0.3, label smoothing
    0.1, ``--max-tokens 2000``."""

    max_update: int  # the budget: the same for every model
    interval: int  # validate and save every this many updates
    patience: int  # stop after this many validations without a lower validation loss
    max_tokens: int = 2000
    lr: float = 0.003
    dropout: float = 0.3
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    optimizer: str = "adam"
    adam_betas: str = "(0.9, 0.98)"
    lr_scheduler: str = "--lr-scheduler fixed"
    sizes: str = sizes(2, 256)
    share: str = "--share-all-embeddings"
    beam: int = 5
    max_len_a: float = 1.5
    max_len_b: int = 10
    lenpens: tuple = (0.6, 0.8, 1.0, 1.2, 1.4)  # swept on the validation set
    threads: int = 1


def train_command(data: str, model: Model, schedule: Schedule, seed: int, save_dir: Path) -> List[str]:
    s = schedule
    return [
        str(BIN / "fairseq-train"), data, "--user-dir", USER_DIR, *shlex.split(model.options),
        *shlex.split(s.sizes), *shlex.split(s.share), "--dropout", str(s.dropout),
        "--criterion", model.criterion, "--label-smoothing", str(s.label_smoothing),
        "--optimizer", s.optimizer, "--adam-betas", s.adam_betas, "--lr", str(s.lr),
        *shlex.split(s.lr_scheduler), "--clip-norm", str(s.clip_norm),
        "--max-tokens", str(s.max_tokens), "--max-update", str(s.max_update), "--max-epoch", "0",
        "--patience", str(s.patience), "--seed", str(seed),
        "--validate-interval", "1000000", "--validate-interval-updates", str(s.interval),
        "--save-interval", "1000000", "--save-interval-updates", str(s.interval),
        "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--save-dir", str(save_dir),
        "--required-batch-size-multiple", "1", "--num-workers", "0",
        "--log-format", "json", "--log-interval", str(s.interval),
    ]


def records(log: str, kind: str) -> List[Dict[str, str]]:
    """fairseq's JSON log records of one kind (train_inner, valid, train)."""
    marker = f"| {kind} |"
    return [json.loads(line[line.index("{"):]) for line in log.splitlines() if marker in line and "{" in line]


PARAMS = re.compile(r"num\. (?:model|shared model) params: ([\d,]+)")


def learning_curve(log: str) -> List[Dict[str, float]]:
    """Validation loss, nll_loss (bits/token) and perplexity at each validation, with the
    training seconds and target tokens up to that update. Records are keyed by update (the
    last one wins), so what a resume replays counts once."""
    inner = {int(r["num_updates"]): r for r in records(log, "train_inner")}
    valid = {int(r["valid_num_updates"]): r for r in records(log, "valid")}
    curve, seconds, tokens, previous = [], 0.0, 0.0, 0
    for updates in sorted(inner):
        record = inner[updates]
        seconds += float(record["train_wall"])
        tokens += float(record["wpb"]) * (updates - previous)
        previous = updates
        if updates in valid:
            v = valid[updates]
            curve.append({"updates": updates, "loss": float(v["valid_loss"]), "nll_loss": float(v["valid_nll_loss"]),
                          "ppl": float(v["valid_ppl"]), "train_seconds": seconds, "train_tokens": tokens})
    missing = sorted(set(valid) - set(inner))
    if missing:
        raise BenchmarkError(f"no train_inner record at update {missing[0]}: the validation interval must be a "
                             "multiple of the log interval")
    return curve


def training_speed(log: str) -> Dict[str, Optional[float]]:
    """Target tokens per second of training steps (``wpb`` x updates / ``train_wall``),
    the first logged interval (warm-up) left out."""
    inner = {int(r["num_updates"]): r for r in records(log, "train_inner")}
    tokens = seconds = 0.0
    previous = 0
    for updates in sorted(inner):
        record = inner[updates]
        if previous and updates > previous:
            tokens += float(record["wpb"]) * (updates - previous)
            seconds += float(record["train_wall"])
        previous = updates
    return {"tokens_per_second": tokens / seconds if seconds else None, "timed_tokens": tokens,
            "timed_seconds": seconds}


UNDISTURBED_PERCENTILE = 90


def undisturbed_speed(curve: List[Dict[str, float]]) -> Optional[float]:
    """Training target tokens/s of a run when nothing else slowed it: the 90th percentile
    (nearest rank) of its per-interval speeds between consecutive validations (the first
    interval, warm-up, left out). The study runs niced beside whatever else uses the
    machine, and a paused or crowded interval only ever lowers a speed: over a whole run
    (``training_speed``) the 2026-12-05 runs measured 1,100-2,500 tokens/s where their
    undisturbed intervals ran at 3,500-6,000. None with fewer than two validations."""
    speeds = [(after["train_tokens"] - before["train_tokens"]) / (after["train_seconds"] - before["train_seconds"])
              for before, after in zip(curve, curve[1:]) if after["train_seconds"] > before["train_seconds"]]
    if not speeds:
        return None
    # numpy's inverted_cdf is the nearest-rank percentile: always one of the measured speeds
    return float(np.percentile(speeds, UNDISTURBED_PERCENTILE, method="inverted_cdf"))


def patience_stop(curve: List[Dict[str, float]], patience: int) -> Optional[int]:
    """The index of the validation at which ``--patience`` stops a run that was never
    interrupted: fairseq's own rule (``should_stop_early``: a loss not lower than the best so
    far adds one, a lower one starts again at 0; the losses it compares are the logged ones,
    rounded to 3 decimals by its meters). None: the curve never gets there."""
    best, since = None, 0
    for index, point in enumerate(curve):
        if best is None or point["loss"] < best:
            best, since = point["loss"], 0
        else:
            since += 1
            if since >= patience:
                return index
    return None


def stopping(curve: List[Dict[str, float]], schedule: Schedule) -> Dict[str, object]:
    """Where the validation loss was lowest, where training stopped and why, and the first
    update within 1% of the lowest loss (how soon the model got to its final level) — up to
    where ``--patience`` stops the run uninterrupted (``patience_stop``). A curve that goes on
    past that point (fairseq before the plugin kept the count across a resume: it restarted
    it) says how far (``trained_past_stop``, updates) and whether its lowest loss came only
    after (``best_after_stop``: the run's best checkpoint is then not the uninterrupted
    run's)."""
    if not curve:
        raise BenchmarkError("no validation in the training log")
    stop_at = patience_stop(curve, schedule.patience)
    counted = curve if stop_at is None else curve[:stop_at + 1]
    best = min(counted, key=lambda p: (p["loss"], p["updates"]))
    after = sum(p["updates"] > best["updates"] for p in counted)
    near = next(p["updates"] for p in counted if p["loss"] <= best["loss"] * 1.01)
    last = counted[-1]["updates"]
    reason = "patience" if stop_at is not None else "max_update" if last >= schedule.max_update else None
    return {"best_updates": best["updates"], "best_loss": best["loss"], "best_nll_loss": best["nll_loss"],
            "best_ppl": best["ppl"], "last_updates": last, "validations_after_best": after,
            "stopped_by": reason, "updates_to_within_1pct": near,
            "last_loss_change": counted[-1]["loss"] - best["loss"],
            "trained_past_stop": curve[-1]["updates"] - last,
            "best_after_stop": min(p["loss"] for p in curve) < best["loss"]}


def as_uninterrupted(record: Dict[str, object], schedule: Schedule, files: Sequence[Path] = ()) -> Dict[str, object]:
    """A stored run as the uninterrupted run would have ended: its stop recomputed from the
    curve (records stored before ``stopping`` knew ``patience_stop`` get it too), the curve,
    training time and tokens cut at that stop. A run whose best checkpoint came after it
    cannot be cut: an error names the files to delete (``files``: its record and hypotheses)
    so that a rerun trains it again."""
    curve = record["curve"]
    stop = stopping(curve, schedule)
    if stop["best_after_stop"]:
        raise BenchmarkError(
            f"{record['model']} seed {record['seed']} trained past its --patience stop at update "
            f"{stop['last_updates']} (resumed before the plugin kept the count) and its best checkpoint "
            "comes from later, where an uninterrupted run never gets: delete "
            f"{' and '.join(map(str, files)) or 'its record and hypotheses'} to train it again")
    counted = [p for p in curve if p["updates"] <= stop["last_updates"]]
    return {**record, "stop": stop, "curve": counted, "train_seconds": counted[-1]["train_seconds"],
            "train_tokens": counted[-1]["train_tokens"]}


def parameters(log: str) -> int:
    match = PARAMS.search(log)
    if not match:
        raise BenchmarkError("fairseq-train did not log its parameter count")
    return int(match.group(1).replace(",", ""))


def environment(threads: int, memory_dir: Optional[Path] = None, visible: Optional[str] = "") -> Dict[str, str]:
    """A run's environment: ``threads`` torch threads, the memory report into ``memory_dir``,
    CUDA_VISIBLE_DEVICES ``visible`` ("": no GPU; None: as given)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    env.pop(MEMORY_ENV, None)
    if memory_dir is not None:
        env[MEMORY_ENV] = str(memory_dir)
    return env


STOP = threading.Event()  # set by stop_children(): no new child starts
_children: Set[subprocess.Popen] = set()
_lock = threading.Lock()


def stop_children() -> None:
    """Stop every running fairseq child (SIGTERM) and start no new one: what the study does
    when it is told to stop, so that no orphan keeps writing into a run's directory."""
    STOP.set()
    with _lock:
        for child in _children:
            child.terminate()


def run_checked(command: List[str], log_path: Path, env: Dict[str, str], timeout: float, append: bool = False) -> str:
    """Run ``command`` with stdout and stderr in ``log_path``; return the whole log."""
    with open(log_path, "a" if append else "w", encoding="utf-8") as log:
        with _lock:
            if STOP.is_set():
                raise BenchmarkError("stopped")
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                    cwd=log_path.parent)
            _children.add(proc)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            with _lock:
                _children.discard(proc)
    text = log_path.read_text(encoding="utf-8")
    if proc.returncode != 0:
        raise BenchmarkError(f"{shlex.join(command)} exited {proc.returncode} (log: {log_path}):\n{text[-3000:]}")
    return text


def peak_memory(memory_dir: Path) -> Dict[str, object]:
    """The resident-set high-water mark of each training process (one per session)."""
    peaks = [json.loads(p.read_text())["peak_rss_bytes"] for p in sorted(memory_dir.glob("*.json"))]
    return {"peak_rss_bytes": max(peaks) if peaks else None, "sessions_rss_bytes": peaks}


def train(data: str, model: Model, schedule: Schedule, seed: int, run_dir: Path,
          timeout: float, visible: Optional[str] = "") -> Dict[str, object]:
    """Train (or resume) one model and seed until patience or the budget stops it; return
    its curve, stopping point, speed, memory and parameter count."""
    save_dir = run_dir / "checkpoints"
    save_dir.mkdir(parents=True, exist_ok=True)
    memory_dir = run_dir / "memory"
    memory_dir.mkdir(exist_ok=True)
    log_path = run_dir / "train.log"
    resumed = (save_dir / "checkpoint_last.pt").exists()
    log = log_path.read_text(encoding="utf-8") if resumed and log_path.exists() else ""
    done_already = False
    if log and records(log, "valid"):  # killed after patience ran out but before the exit
        done_already = stopping(learning_curve(log), schedule)["stopped_by"] is not None
    if not done_already:
        log = run_checked(train_command(data, model, schedule, seed, save_dir), log_path,
                          environment(schedule.threads, memory_dir, visible), timeout, append=resumed)
    curve = learning_curve(log)
    stop = stopping(curve, schedule)
    if stop["stopped_by"] is None:
        raise BenchmarkError(f"{model.name} seed {seed}: training ended at update {stop['last_updates']} without "
                             f"patience or the budget stopping it (log: {log_path})")
    if not (save_dir / "checkpoint_best.pt").exists():
        raise BenchmarkError(f"{model.name} seed {seed}: no checkpoint_best.pt in {save_dir}")
    return {"parameters": parameters(log), "curve": curve, "stop": stop, "speed": training_speed(log),
            "memory": peak_memory(memory_dir), "sessions": len(PARAMS.findall(log)),
            "train_seconds": curve[-1]["train_seconds"], "train_tokens": curve[-1]["train_tokens"]}
