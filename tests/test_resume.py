"""A training killed with SIGKILL mid-epoch and resumed from its last checkpoint makes
the same updates as a training that was never interrupted (1 and 3 CPU devices, with
dropout, so the random state matters too)."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

from cli import BIN, USER_DIR, prepared_sample, run_tool

UPDATES = 14


def args(data, save_dir, devices):
    return [
        str(data / "bin"), "--user-dir", USER_DIR, "--arch", "hybrid_lstm",
        "--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "32",
        "--encoder-hidden-size", "32", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
        "--decoder-out-embed-dim", "32", "--dropout", "0.3", "--hybrid-devices", devices,
        "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.003", "--clip-norm", "1.0", "--max-tokens", "250",
        "--max-update", str(UPDATES), "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--save-interval-updates", "3", "--log-format", "json", "--log-interval", "1",
        "--seed", "11", "--num-workers", "0", "--required-batch-size-multiple", "1",
        "--disable-validation",
    ]


def losses(text):
    found = {}
    for line in text.splitlines():
        if "train_inner" in line:
            record = json.loads(line[line.index("{"):])
            found[int(record["num_updates"])] = record["loss"]
    return found


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # ~120 updates per epoch at this batch size: every kill lands mid-epoch
    return prepared_sample(tmp_path_factory.mktemp("resume"), train=2000, valid=20, test=10)


@pytest.mark.parametrize("devices", ["cpu", "cpu,cpu,cpu"])
def test_sigkill_then_resume_makes_the_same_updates(data, tmp_path, devices):
    reference = losses(run_tool("fairseq-train", args(data, tmp_path / "whole", devices), cwd=data).stdout)
    assert sorted(reference) == list(range(1, UPDATES + 1))

    save = tmp_path / "killed"
    kill_after = random.Random(devices).randint(5, 10)
    proc = subprocess.Popen(
        [str(BIN / "fairseq-train"), *args(data, save, devices)], cwd=data,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
    )
    seen = []
    deadline = time.time() + 300
    for line in proc.stdout:
        seen.append(line)
        done = losses(line)
        if done and max(done) >= kill_after:
            proc.send_signal(signal.SIGKILL)
            break
        assert time.time() < deadline, "training never reached the kill point"
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    before = losses("".join(seen))
    assert (save / "checkpoint_last.pt").is_file()

    resumed = run_tool("fairseq-train", args(data, save, devices), cwd=data)
    log = resumed.stdout + resumed.stderr
    start = int(json.loads(next(
        l[l.index("{"):] for l in log.splitlines() if "train_inner" in l))["num_updates"])
    assert 1 < start <= kill_after + 1 and start <= UPDATES
    after = losses(log)
    assert sorted(after) == list(range(start, UPDATES + 1))
    assert {u: reference[u] for u in after} == after  # same updates as never interrupted
    assert {u: reference[u] for u in before} == before
