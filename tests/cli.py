"""Run fairseq's command-line tools the way a user does (subprocesses of this venv)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "fairseq_hybrid")
SAMPLE = REPO / "data" / "ende-sample"
BIN = Path(sys.executable).parent


def run_tool(tool: str, args: List[str], cwd: Path, stdin: Optional[str] = None,
             check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [str(BIN / tool), *args], cwd=cwd, input=stdin, capture_output=True, text=True,
        env=env, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{tool} exited {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\n"
            f"STDERR:\n{proc.stderr[-4000:]}"
        )
    return proc


def write_sample_subset(dest: Path, train: int, valid: int, test: int) -> None:
    """The first lines of the bundled corpus, whitespace-tokenised (no sentencepiece)."""
    dest.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("valid", valid), ("test", test)):
        for lang in ("en", "de"):
            lines = (SAMPLE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (dest / f"{split}.{lang}").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")


def preprocess(raw: Path, dest: Path) -> None:
    run_tool("fairseq-preprocess", [
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
        "--testpref", str(raw / "test"), "--destdir", str(dest),
        "--joined-dictionary", "--workers", "1",
    ], cwd=raw)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(tool: str, args: List[str], world_size: int, cwd: Path, timeout: int = 600):
    """Start ``world_size`` processes of one distributed job on this machine (gloo over
    loopback) and wait for all of them."""
    port = free_port()
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [str(BIN / tool), *args, "--distributed-world-size", str(world_size),
             "--distributed-rank", str(rank), "--distributed-backend", "gloo",
             "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn"],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in range(world_size)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for result in results:
        if result.returncode != 0:
            raise AssertionError(f"{tool} rank exited {result.returncode}:\n{result.stderr[-4000:]}")
    return results


def prepared_sample(root: Path, train: int, valid: int, test: int) -> Path:
    """A binarized subset of the bundled corpus under ``root`` (raw/ and bin/)."""
    write_sample_subset(root / "raw", train=train, valid=valid, test=test)
    preprocess(root / "raw", root / "bin")
    return root
