"""A training killed with SIGKILL mid-epoch and resumed from its last checkpoint makes
the same updates as a training that was never interrupted (1 and 3 CPU devices, with
dropout, so the random state matters too). The uninterrupted run is the one-device run for
both: on CPU devices the hybrid model draws its dropout masks as one device does
(``model/dropout.py``), so its numbers are the one device's."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

from cli import BIN, model_args, run_tool, train_args, train_losses

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


@pytest.fixture
def data(sample_data):
    # conftest: binarized once per session; 18 batches an epoch at this batch size, so every
    # kill (after update 5 to 10) lands mid-epoch and the runs end in the first epoch
    return sample_data


@pytest.fixture(scope="module")
def uninterrupted(sample_data, tmp_path_factory):
    """update -> loss of the run never interrupted, on one device (run once; tests only read)."""
    run = run_tool("fairseq-train", args(sample_data, tmp_path_factory.mktemp("whole"), "cpu"),
                   cwd=sample_data)
    log = run.stdout + run.stderr
    assert "end of epoch 2" not in log, "the runs must end in the first epoch"
    return losses(log)


@pytest.mark.parametrize("devices", ["cpu", "cpu,cpu,cpu"])
def test_sigkill_then_resume_makes_the_same_updates(data, tmp_path, uninterrupted, devices):
    reference = uninterrupted
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
