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

from cli import BIN, model_args, prepared_sample, run_tool, train_args, train_losses

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

UPDATES = 14


def args(data, save_dir, devices):
    return train_args(
        data / "bin", model_args(32, 3, "--dropout", "0.3"), "--hybrid-devices", devices,
        "--label-smoothing", "0.1", "--clip-norm", "1.0", "--max-update", str(UPDATES),
        "--no-epoch-checkpoints", "--save-interval-updates", "3", "--log-format", "json",
        "--log-interval", "1", "--seed", "11", "--required-batch-size-multiple", "1",
        "--disable-validation", save_dir=save_dir, max_tokens=250,
    )


losses = train_losses


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
        line[line.index("{"):] for line in log.splitlines() if "train_inner" in line))["num_updates"])
    assert 1 < start <= kill_after + 1 and start <= UPDATES
    after = losses(log)
    assert sorted(after) == list(range(start, UPDATES + 1))
    assert {u: reference[u] for u in after} == after  # same updates as never interrupted
    assert {u: reference[u] for u in before} == before
