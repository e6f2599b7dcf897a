"""Runs ``fairseq-train`` / ``fairseq-generate`` as a user would and reads their speed
from fairseq's own logs.

Training speed: fairseq logs ``train_inner`` records every ``--log-interval`` updates with
that interval's target tokens/s (``wps``) and tokens per batch (``wpb``); the first
interval is warm-up and dropped, the rest give tokens / seconds over the timed updates.
Peak memory: each process's resident-set high-water mark and, on CUDA, each device's
``max_memory_allocated``, written at exit by ``fairseq_hybrid.plugin.memory_report`` (loaded
with ``--user-dir``) into the directory ``FAIRSEQ_HYBRID_MEMORY_REPORT`` names.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
USER_DIR = str(ROOT / "fairseq_hybrid")
BIN = Path(sys.executable).parent


class BenchmarkError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"benchmarks: error: {message}")


# glibc returns every allocation above 32 MB to the system when it is freed, so each step
# page-faults its large tensors (logits, gradients) in again; with these it keeps freed
# memory, as a caching allocator does. Off by default (the benchmark runs what users run);
# --malloc-cache applies it to every configuration alike. It sped up both fairseq lstm and
# hybrid_lstm by 3-16% in-process here, without changing their ratio beyond the noise.
MALLOC_CACHE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}


class OutOfMemory(BenchmarkError):
    pass


@dataclass
class TrainConfig:
    """One training configuration: fairseq-train options, and how it is launched."""

    key: str  # a..f: the configurations listed in scaling.py's docstring
    name: str
    options: str  # fairseq-train model/placement options
    threads: int  # torch threads per process
    processes: int = 1  # > 1: fairseq data parallelism over gloo (CPU) or spawned GPUs
    max_tokens: int = 4000  # per process
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def criterion(self) -> str:
        return "hybrid_cross_entropy" if "hybrid_lstm" in self.options else "label_smoothed_cross_entropy"


@dataclass
class TrainResult:
    target_wps: float  # target tokens/s over the timed updates
    sentences_per_s: float
    timed_updates: int
    target_tokens_per_update: float
    peak_rss_bytes: List[int]  # per process
    peak_cuda_bytes: Dict[str, int]  # per CUDA device, over the processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def interval_speed(log: str, log_interval: int) -> tuple:
    """(target tokens/s, sentences/s, timed updates, tokens per update) over every
    ``train_inner`` interval but the first."""
    records = []
    for line in log.splitlines():
        if "| train_inner |" in line and "{" in line:
            records.append(json.loads(line[line.index("{"):]))
    if len(records) < 2:
        raise BenchmarkError(
            f"fewer than two train_inner records in the log (need warm-up + timed intervals):\n{log[-2000:]}"
        )
    tokens = seconds = sentences = 0.0
    updates = 0
    previous = int(records[0]["num_updates"])
    for record in records[1:]:
        count = int(record["num_updates"]) - previous
        previous = int(record["num_updates"])
        interval_tokens = float(record["wpb"]) * count
        interval_seconds = interval_tokens / float(record["wps"])
        tokens += interval_tokens
        seconds += interval_seconds
        sentences += float(record["bsz"]) * count
        updates += count
    return tokens / seconds, sentences / seconds, updates, tokens / updates


def with_threads(env: Dict[str, str], threads: int) -> Dict[str, str]:
    """``env`` with ``OMP_NUM_THREADS`` where a process is to use fewer threads than the
    cores, and without it (as a user runs it) where it uses them all: the plugin's CPU
    device workers then split the cores between them, where a user's ``OMP_NUM_THREADS``
    gives each worker that many threads."""
    env = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads < (os.cpu_count() or 1):
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def train_command(
    data: str, config: TrainConfig, updates: int, log_interval: int, save_dir: Optional[str],
    extra: str, optimizer: str = "torch_adam", user_dir: str = USER_DIR,
) -> List[str]:
    save = ["--save-dir", save_dir, "--no-epoch-checkpoints"] if save_dir else ["--no-save"]
    return [
        str(BIN / "fairseq-train"), data, "--user-dir", user_dir,
        "--optimizer", optimizer, "--lr", "0.001", "--clip-norm", "1.0",
        "--criterion", config.criterion, "--label-smoothing", "0.1",
        "--max-tokens", str(config.max_tokens), "--max-update", str(updates),
        "--disable-validation", "--num-workers", "0", "--seed", "1",
        "--log-format", "json", "--log-interval", str(log_interval),
        "--required-batch-size-multiple", "1", *save,
        *shlex.split(config.options), *shlex.split(extra),
    ]


def run_training(
    data: str, config: TrainConfig, updates: int, log_interval: int,
    save_dir: Optional[str] = None, extra: str = "", timeout: float = 1800,
    optimizer: str = "torch_adam", env: Optional[Dict[str, str]] = None,
    user_dir: str = USER_DIR,
) -> TrainResult:
    """Train ``config`` for ``updates`` updates and measure it (see the module doc).
    ``user_dir``: the plugin fairseq loads (another checkout's, for ``benchmarks.ab``)."""
    with tempfile.TemporaryDirectory() as tmp:
        memory_dir = Path(tmp) / "memory"
        memory_dir.mkdir()
        env = with_threads(dict(os.environ, PYTHONWARNINGS="ignore", FAIRSEQ_HYBRID_MEMORY_REPORT=str(memory_dir),
                                **(env or {}), **config.env), config.threads)
        command = train_command(data, config, updates, log_interval, save_dir, extra, optimizer,
                                user_dir)
        if config.processes > 1 and "cuda" not in config.options:
            port = free_port()
            commands = [
                command + ["--distributed-world-size", str(config.processes),
                           "--distributed-rank", str(rank), "--distributed-backend", "gloo",
                           "--distributed-init-method", f"tcp://127.0.0.1:{port}",
                           "--distributed-no-spawn"]
                for rank in range(config.processes)
            ]
        elif config.processes > 1:
            commands = [command + ["--distributed-world-size", str(config.processes)]]
        else:
            commands = [command]
        procs = [subprocess.Popen(c, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for c in commands]
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=timeout)[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        for proc, out in zip(procs, outputs):
            if "out of memory" in out.lower():  # fairseq may skip an OOM batch and go on
                raise OutOfMemory(f"{config.name}: out of memory at --max-tokens {config.max_tokens}")
            if proc.returncode != 0:
                raise BenchmarkError(
                    f"{config.name}: {shlex.join(proc.args)} exited {proc.returncode}:\n{out[-3000:]}"
                )
        reports = [json.loads(p.read_text()) for p in sorted(memory_dir.glob("*.json"))]
    peaks = [r["peak_rss_bytes"] for r in reports]
    cuda_peaks: Dict[str, int] = {}
    for report in reports:
        for device, value in report.get("cuda_max_allocated_bytes", {}).items():
            cuda_peaks[device] = max(value, cuda_peaks.get(device, 0))
    wps, sps, timed, per_update = interval_speed(outputs[0], log_interval)
    return TrainResult(wps, sps, timed, per_update, peaks, cuda_peaks)


GENERATE_SUMMARY = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)


def run_generation(
    data: str, checkpoint: str, beam: int, subset: str, options: str, threads: int,
    timeout: float = 1800, env: Optional[Dict[str, str]] = None,
) -> Dict[str, float]:
    """Beam search with fairseq-generate; its own summary line gives sentences/s and
    tokens/s (model loading excluded)."""
    command = [
        str(BIN / "fairseq-generate"), data, "--user-dir", USER_DIR, "--path", checkpoint,
        "--gen-subset", subset, "--beam", str(beam), "--required-batch-size-multiple", "1",
        "--num-workers", "0", "--quiet", *shlex.split(options),
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads), **(env or {}))
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    log = proc.stdout + proc.stderr
    match = GENERATE_SUMMARY.search(log)
    if proc.returncode != 0 or match is None:
        raise BenchmarkError(f"{shlex.join(command)} exited {proc.returncode}:\n{log[-3000:]}")
    return {
        "sentences": int(match.group(1).replace(",", "")),
        "tokens": int(match.group(2).replace(",", "")),
        "seconds": float(match.group(3)),
        "sentences_per_s": float(match.group(4)),
        "tokens_per_s": float(match.group(5)),
    }
