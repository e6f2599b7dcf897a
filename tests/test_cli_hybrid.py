"""Several devices through fairseq's own CLIs: the same per-update losses and weights as
one device, placement-free checkpoints (train on 3 devices, resume on 1, generate on 2),
and one-line errors for bad placements before anything is written."""
import re
import shutil

import pytest
import torch

from cli import USER_DIR, hypotheses, model_args, run_ranks, run_tool, train_in_process, train_losses
from cli import train_args as shared_train_args

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

MODEL = model_args(32, 3, "--share-all-embeddings", "--dropout", "0")


def train_args(data, save_dir, devices, max_update, chunks=None, extra=()):
    chunk_args = () if chunks is None else ("--pipeline-chunks", str(chunks))
    return shared_train_args(
        data / "bin", MODEL, "--hybrid-devices", devices, "--label-smoothing", "0.1",
        "--clip-norm", "1.0", "--max-update", str(max_update), "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", "1", "--seed", "5",
        "--required-batch-size-multiple", "1", *extra, *chunk_args, save_dir=save_dir,
    )


def train(data, save_dir, devices, max_update, chunks=None, extra=()):
    return run_tool("fairseq-train", train_args(data, save_dir, devices, max_update, chunks, extra),
                    cwd=data)


def per_update_losses(proc):
    return train_losses(proc.stdout + proc.stderr)


def weights(path):
    return torch.load(path, map_location="cpu")["model"]


@pytest.fixture
def data(sample_data):
    return sample_data  # conftest: binarized once per session


UPDATES = 8  # of two batches each: the 16 batches of the first epoch at --max-tokens 300


@pytest.fixture(scope="module")
def one_device(sample_data, tmp_path_factory):
    """The reference of the tests below, run once: one process on one device, each update
    on two batches (--update-freq 2). Tests only read it."""
    save = tmp_path_factory.mktemp("one-device")
    proc = train(sample_data, save, "cpu", UPDATES, extra=["--update-freq", "2"])
    return save / "checkpoint_last.pt", per_update_losses(proc)


@pytest.fixture(scope="module")
def three_devices(sample_data, tmp_path_factory):
    """The reference's updates on three devices in one process, run once: compared with it
    below, and the checkpoint the placement test resumes (from a copy)."""
    save = tmp_path_factory.mktemp("three-devices")
    proc = train(sample_data, save, "cpu,cpu,cpu", UPDATES, chunks=3, extra=["--update-freq", "2"])
    return save, proc.stdout + proc.stderr


def test_three_devices_train_like_one(one_device, three_devices):
    checkpoint_one, losses_one = one_device
    save, log = three_devices
    assert "3 device(s), 3 pipeline chunk(s)" in log
    assert sorted(losses_one) == list(range(1, UPDATES + 1))
    assert train_losses(log) == losses_one
    reference = weights(checkpoint_one)
    hybrid = weights(save / "checkpoint_last.pt")
    assert reference.keys() == hybrid.keys()
    for name in reference:
        torch.testing.assert_close(hybrid[name], reference[name], rtol=1e-4, atol=1e-5)


def test_checkpoints_are_placement_free(data, tmp_path, three_devices):
    save = tmp_path / "portable"
    shutil.copytree(three_devices[0], save)  # trained on three devices
    resumed = train(data, save, "cpu", UPDATES + 3)
    log = resumed.stdout + resumed.stderr
    assert re.search(rf"Loaded checkpoint .*\(epoch \d+ @ {UPDATES} updates\)", log)
    assert torch.load(save / "checkpoint_last.pt", weights_only=False)[
        "optimizer_history"][-1]["num_updates"] == UPDATES + 3
    outputs = {}
    for devices in ("cpu", "cpu,cpu"):
        args = [
            str(data / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
            "--beam", "4", "--gen-subset", "test", "--batch-size", "8",
            "--required-batch-size-multiple", "1", "--max-len-b", "15",
        ]
        if devices != "cpu":
            args += ["--model-overrides", f"{{'hybrid_devices': '{devices}'}}"]
        gen = run_tool("fairseq-generate", args, cwd=data)
        outputs[devices] = sorted(hypotheses(gen.stdout, ("H-", "P-")))
        if devices != "cpu":
            assert "generation placement" in gen.stderr + gen.stdout
    assert len(hypotheses("\n".join(outputs["cpu"]))) == 20
    assert outputs["cpu,cpu"] == outputs["cpu"]


def bad_placement_args(data, save, devices):
    return [str(data / "bin"), "--user-dir", USER_DIR, *MODEL, "--hybrid-devices", devices,
            "--criterion", "hybrid_cross_entropy", "--max-tokens", "300", "--save-dir", str(save)]


@pytest.mark.parametrize("devices,message", [
    ("cuda:9", "--hybrid-devices 'cuda:9': cuda:9 is not available"),
    ("cpu,cpu,cpu,cpu,cpu", "--hybrid-devices 'cpu,cpu,cpu,cpu,cpu' lists 5 devices for 3 encoder / 3 decoder layers"),
    ("cpu,,cpu", "--hybrid-devices 'cpu,,cpu' has an empty entry"),
    ("tpu:0", "unknown device 'tpu:0'"),
])
def test_bad_placement_is_one_line_before_any_work(data, tmp_path, monkeypatch, devices, message):
    """In this process (cli.train_in_process): the message, and nothing written; the next
    test checks how the real command prints it."""
    save = tmp_path / "save"
    error = train_in_process(bad_placement_args(data, save, devices), monkeypatch)
    assert str(error).startswith("fairseq_hybrid: error: ") and message in str(error)
    assert not save.exists()


def test_a_bad_placement_is_one_line_on_fairseq_trains_stderr(data, tmp_path):
    save = tmp_path / "save"
    proc = run_tool("fairseq-train", bad_placement_args(data, save, "cpu,,cpu"), cwd=data, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq_hybrid: error: --hybrid-devices 'cpu,,cpu' has an empty entry"), \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not save.exists()


def test_zero_chunks_is_rejected(data, tmp_path, monkeypatch):
    error = train_in_process([
        str(data / "bin"), "--user-dir", USER_DIR, *MODEL, "--pipeline-chunks", "0",
        "--criterion", "hybrid_cross_entropy", "--max-tokens", "300",
        "--save-dir", str(tmp_path / "save"),
    ], monkeypatch)
    assert "--pipeline-chunks 0 is not allowed: an integer >= 1" in str(error)


@pytest.mark.parametrize("devices, backend", [("cpu", "pytorch_ddp"), ("cpu,cpu", "legacy_ddp")])
def test_two_processes_make_the_update_of_one_process_on_both_batches(data, tmp_path, one_device,
                                                                      devices, backend):
    """fairseq's own data parallelism (gloo) around the hybrid model, with the backend it
    gets by default: torch DDP for one device per process, legacy_ddp for several. 2
    processes make the same updates as 1 process on one device that sees both processes'
    batches (--update-freq 2 groups the same two batches that 2 ranks take; on CPU devices
    the hybrid model's numbers are the one device's, test_three_devices_train_like_one)."""
    checkpoint_one, losses_one = one_device
    chunks = 2 if "," in devices else None
    ranks = run_ranks("fairseq-train", train_args(data, tmp_path / "dp-two", devices, UPDATES, chunks=chunks),
                      world_size=2, cwd=data)
    assert f"'ddp_backend': '{backend}'" in ranks[0].stdout + ranks[0].stderr
    losses_two = per_update_losses(ranks[0])
    assert sorted(losses_two) == list(range(1, UPDATES + 1))
    assert losses_two == losses_one
    reference = weights(checkpoint_one)
    two = weights(tmp_path / "dp-two" / "checkpoint_last.pt")
    for name in reference:
        torch.testing.assert_close(two[name], reference[name], rtol=1e-4, atol=1e-5)


def test_fairseqs_own_lstm_trains_on_cpus_with_torch_ddp(data, tmp_path):
    """fairseq's default --ddp-backend (torch DDP) hands device_ids to a CPU module, which
    torch refuses; with the plugin loaded fairseq's own --arch lstm trains with it on 2
    CPU processes, making the updates of one process on both batches."""
    lstm = ["--arch", "lstm", "--encoder-embed-dim", "16", "--encoder-hidden-size", "16",
            "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16",
            "--cpu", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "300", "--max-update", "4",
            "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints", "--seed", "3",
            "--log-format", "json", "--log-interval", "1", "--required-batch-size-multiple", "1"]
    one = run_tool("fairseq-train", [str(data / "bin"), "--user-dir", USER_DIR, *lstm, "--update-freq", "2",
                                     "--save-dir", str(tmp_path / "one")], cwd=data)
    ranks = run_ranks("fairseq-train", [str(data / "bin"), "--user-dir", USER_DIR, *lstm,
                                        "--save-dir", str(tmp_path / "two")], world_size=2, cwd=data)
    assert "'ddp_backend': 'pytorch_ddp'" in ranks[0].stdout + ranks[0].stderr
    assert per_update_losses(ranks[0]) == per_update_losses(one)
    assert sorted(per_update_losses(one)) == [1, 2, 3, 4]


def test_bf16_trains_on_cpu_devices(data, tmp_path):
    proc = train(data, tmp_path / "bf16", "cpu,cpu", 5, chunks=2, extra=["--bf16"])
    losses = per_update_losses(proc)
    assert sorted(losses) == [1, 2, 3, 4, 5]
    assert all(0 < float(v) < 20 for v in losses.values())
    assert float(losses[5]) < float(losses[1])
    assert "'bf16': True" in proc.stdout + proc.stderr
