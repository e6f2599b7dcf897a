"""End to end through fairseq's own CLIs with the plugin: preprocess -> train -> resume ->
generate -> interactive, and one-line errors for bad values."""
import re

import pytest

from cli import USER_DIR, hypotheses, model_args, run_tool, train_in_process
from cli import train_args as shared_train_args

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

SMALL_MODEL = model_args(32, None, "--share-all-embeddings")


def train_args(data, save_dir, max_update):
    return shared_train_args(
        data, SMALL_MODEL, "--label-smoothing", "0.1", "--softmax-chunk-tokens", "64",
        "--clip-norm", "1.0", "--max-update", str(max_update), "--no-epoch-checkpoints",
        "--save-interval-updates", "3", "--log-format", "json", "--log-interval", "1",
        "--seed", "3", save_dir=save_dir, lr=0.005, max_tokens=400,
    )


@pytest.fixture
def data(sample_data):
    return sample_data  # conftest: binarized once per session


def test_train_resume_generate_interactive(data, tmp_path):
    save = tmp_path / "ckpt"
    first = run_tool("fairseq-train", train_args(data / "bin", save, 4), cwd=data)
    assert (save / "checkpoint_last.pt").is_file()
    assert "num. shared model params" in first.stdout + first.stderr

    resumed = run_tool("fairseq-train", train_args(data / "bin", save, 7), cwd=data)
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 4 updates\)", log), log[-3000:]
    assert "done training" in log

    gen = run_tool("fairseq-generate", [
        str(data / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
        "--beam", "5", "--gen-subset", "test", "--batch-size", "8", "--max-len-b", "20",
        "--required-batch-size-multiple", "1",  # fairseq #5036 drops the last batch otherwise
    ], cwd=data)
    generated = hypotheses(gen.stdout)
    assert len(generated) == 20  # every test sentence
    assert re.search(r"BLEU4? = ", gen.stdout + gen.stderr)

    source = "Where is the station?\nI like it.\n"
    inter = run_tool("fairseq-interactive", [
        str(data / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
        "--beam", "3", "--source-lang", "en", "--target-lang", "de", "--max-len-b", "20",
    ], cwd=data, stdin=source)
    assert len(hypotheses(inter.stdout)) == 2


@pytest.mark.parametrize("option,value,message", [
    ("--encoder-layers", "0", "--encoder-layers 0 is not allowed: an integer >= 1"),
    ("--softmax-chunk-tokens", "-1", "--softmax-chunk-tokens -1 is not allowed: an integer >= 0"),
    ("--decoder-layers", "3", "--decoder-layers 3 is not allowed: must equal --encoder-layers (2)"),
])
def test_bad_values_are_one_clear_line(data, tmp_path, monkeypatch, option, value, message):
    """In this process (cli.train_in_process): the message, and nothing written;
    the next test checks how the real command prints it."""
    save = tmp_path / "never"
    error = train_in_process([*train_args(data / "bin", save, 2), option, value], monkeypatch)
    assert str(error).startswith(f"fairseq_hybrid: error: {message}")
    assert not save.exists()


def test_a_bad_value_is_one_line_on_fairseq_trains_stderr(data, tmp_path):
    save = tmp_path / "never"
    proc = run_tool("fairseq-train", [*train_args(data / "bin", save, 2), "--encoder-layers", "0"],
                    cwd=data, check=False)
    assert proc.returncode == 1
    assert "fairseq_hybrid: error: --encoder-layers 0 is not allowed: an integer >= 1" in \
        proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert not save.exists()
