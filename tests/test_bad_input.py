"""Bad input to fairseq's CLIs with the plugin: one clear line naming the bad value, exit
status != 0, and no checkpoint or output file written.

Each kind of error goes through the real command once here (its one line is the last line
on stderr, no traceback): a checkpoint fairseq-generate cannot read
(test_generate_with_a_file_that_is_not_a_checkpoint[truncated]) and one fairseq-train cannot
(test_restore_file_that_is_truncated_writes_nothing); the other cases of the same checks run
in this process (``cli.train_error_in_process``, ``cli.generate_error_in_process``)."""
import os
import shutil

import pytest

from fairseq_hybrid.plugin import save_dir_lock
from cli import (USER_DIR, generate_error_in_process, hypotheses, model_args, preprocess,
                 run_tool, train_error_in_process, write_sample_subset)
from cli import train_args as shared_train_args

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

SMALL = model_args(16)


def train_args(data_dir, save_dir, *extra):
    return shared_train_args(data_dir, SMALL, "--max-update", "2", *extra, save_dir=save_dir)


@pytest.fixture
def data(sample_data):
    """The training data: the suite's shared corpus (conftest.sample_data, 400 pairs; only read)."""
    return sample_data / "bin"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, sample_data):
    root = tmp_path_factory.mktemp("bad-input")
    run_tool("fairseq-train", train_args(sample_data / "bin", root / "ckpt"), cwd=root)
    checkpoint = root / "ckpt" / "checkpoint_last.pt"
    truncated = root / "truncated.pt"
    truncated.write_bytes(checkpoint.read_bytes()[:5000])
    text = root / "notes.pt"
    text.write_text("these are not weights\n")
    return root, checkpoint, truncated, text


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq_hybrid: error: "), proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last
    assert "Traceback" not in proc.stderr


def assert_error_line(line, *fragments):
    """``assert_one_line_error`` for the line a run in this process stopped with."""
    assert line.startswith("fairseq_hybrid: error: ") and "\n" not in line, line
    for fragment in fragments:
        assert fragment in line, line


def generate_args(data, path):
    return [str(data), "--user-dir", USER_DIR, "--path", str(path), "--beam", "2",
            "--gen-subset", "test", "--required-batch-size-multiple", "1"]


@pytest.mark.parametrize("which", ["truncated", "text"])
def test_generate_with_a_file_that_is_not_a_checkpoint(setup, data, monkeypatch, which):
    """The truncated file through the real command, the text file in this process."""
    root, _, truncated, text = setup
    if which == "truncated":
        proc = run_tool("fairseq-generate", generate_args(data, truncated), cwd=root, check=False)
        assert_one_line_error(proc, repr(str(truncated)), "is not a readable fairseq checkpoint")
    else:
        monkeypatch.chdir(root)
        line = generate_error_in_process(generate_args(data, text), monkeypatch)
        assert_error_line(line, repr(str(text)), "is not a readable fairseq checkpoint")


def test_restore_file_that_is_truncated_writes_nothing(setup, data, tmp_path, monkeypatch):
    root, _, truncated, _ = setup
    save = tmp_path / "save"
    proc = run_tool("fairseq-train", train_args(data, save, "--restore-file", str(truncated)),
                    cwd=root, check=False)
    assert_one_line_error(proc, f"'{truncated}' is not a readable fairseq checkpoint (truncated, or another "
                                "kind of file): ", "; give another --restore-file")
    assert not save.exists() or not any(save.iterdir())
    shutil.copytree(root / "ckpt", save, dirs_exist_ok=True)  # resuming a truncated checkpoint_last.pt
    older = save / "checkpoint_older.pt"
    os.replace(save / "checkpoint_last.pt", older)
    (save / "checkpoint_last.pt").write_bytes(truncated.read_bytes())
    monkeypatch.chdir(root)  # the same check as above: in this process
    line = train_error_in_process(train_args(data, save), monkeypatch)
    assert_error_line(line, "checkpoint_last.pt' is not a readable fairseq checkpoint", "; delete it (the "
                      "training then starts over), or resume from an older checkpoint with --restore-file ")


def test_checkpoint_with_another_dictionary(setup, small_sample_data, monkeypatch):
    """conftest.small_sample_data (40 pairs, not the checkpoint's 400) has another dictionary."""
    root, checkpoint, _, _ = setup
    monkeypatch.chdir(root)
    line = generate_error_in_process(generate_args(small_sample_data / "bin", checkpoint), monkeypatch)
    assert_error_line(line, "the checkpoint's dictionary has ", "embed_tokens.weight",
                      "was the data binarized with another dictionary?")


def test_checkpoint_of_another_shape_as_restore_file(setup, data, tmp_path, monkeypatch):
    """fairseq wraps this error in its own ("Cannot load model parameters from checkpoint");
    the real command's one line for that: test_reliability.
    test_the_command_line_prints_one_line_also_when_fairseq_rewraps_it."""
    root, checkpoint, _, _ = setup
    save = tmp_path / "save"
    save.mkdir()
    shutil.copy(checkpoint, save / "checkpoint_last.pt")
    before = (save / "checkpoint_last.pt").read_bytes()
    monkeypatch.chdir(root)
    line = train_error_in_process(train_args(data, save, "--encoder-layers", "3",
                                             "--decoder-layers", "3"), monkeypatch)
    assert_error_line(line, "trained with other model options than this run's: --encoder-layers 2 "
                            "(this run: 3), --decoder-layers 2 (this run: 3)")
    # and the lock this process holds (the command removes it at its exit: test_training_stops)
    assert sorted(p.name for p in save.iterdir()) == ["checkpoint_last.pt", save_dir_lock.LOCK_NAME]
    assert (save / save_dir_lock.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    assert (save / "checkpoint_last.pt").read_bytes() == before


@pytest.mark.parametrize("case,fragment", [
    ("missing", "does not exist"),
    ("no-pair", "--source-lang 'fr': data directory"),
    ("no-valid", "has no 'valid' split (no valid.* files)"),  # fairseq: FileNotFoundError
])
def test_bad_data_directory(setup, data, tmp_path, monkeypatch, case, fragment):
    """In this process (``cli.train_error_in_process``); the command's own one line is
    checked by ``test_restore_file_that_is_truncated_writes_nothing`` and the others here."""
    root = setup[0]
    given = root / "nowhere" if case == "missing" else data
    if case == "no-valid":
        given = tmp_path / "bin"
        shutil.copytree(data, given, ignore=shutil.ignore_patterns("valid.*"))
    extra = ["--source-lang", "fr", "--target-lang", "de"] if case == "no-pair" else []
    save = tmp_path / "save"
    monkeypatch.chdir(root)
    line = train_error_in_process(train_args(given, save, *extra), monkeypatch)
    assert line.startswith("fairseq_hybrid: error: ") and fragment in line, line
    assert not save.exists()


@pytest.mark.parametrize("case,fragments", [
    ("empty", ["the 'train' split in", "has no sentences", "--trainpref"]),
    ("max-tokens", ["--max-tokens 2 is smaller than every sentence pair of the 'train' split", "use --max-tokens"]),
    ("fp16", ["--fp16 needs a CUDA GPU", "use --bf16"]),
])
def test_training_data_and_precision_errors(setup, data, tmp_path, monkeypatch, case, fragments):
    """fairseq's own failures here are tracebacks (cannot mmap an empty file; IndexError in
    batch_by_size; Torch not compiled with CUDA enabled). In this process, as above."""
    root = setup[0]
    extra = []
    if case == "empty":
        write_sample_subset(tmp_path / "raw", train=0, valid=5, test=5)
        for lang in ("en", "de"):
            (tmp_path / "raw" / f"train.{lang}").write_text("")
        preprocess(tmp_path / "raw", tmp_path / "bin")
        data = tmp_path / "bin"
    elif case == "max-tokens":
        extra = ["--max-tokens", "2"]
    else:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        extra = ["--fp16"]
    save = tmp_path / "save"
    monkeypatch.chdir(root)
    line = train_error_in_process(train_args(data, save, *extra), monkeypatch)
    assert line.startswith("fairseq_hybrid: error: ") and all(f in line for f in fragments), line
    assert not save.exists()


def test_interactive_survives_odd_input(setup, data):
    """Empty and blank lines, emoji and control characters are translated; a line longer
    than --max-source-positions is skipped with a one-line warning; the session goes on."""
    root, checkpoint, _, _ = setup
    lines = ["Hello there.", "", "   ", " ".join(["xyzzy"] * 1100), "I love 🍕 and 😀!",
             "Tab\there \x01\x07 bell", "Last line."]
    proc = run_tool("fairseq-interactive", [
        str(data), "--user-dir", USER_DIR, "--path", str(checkpoint), "--beam", "2",
        "--source-lang", "en", "--target-lang", "de", "--max-len-b", "10",
    ], cwd=root, stdin="\n".join(lines) + "\n")
    translated = sorted(int(line.split("\t")[0][2:]) for line in hypotheses(proc.stdout))
    assert translated == [0, 1, 2, 4, 5, 6]
    warnings = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(warnings) == 1 and "skipped 1 source sentence of the input ('<unk> <unk> " in warnings[0]
    assert warnings[0].endswith(  # the line as the model reads it: 'xyzzy' is not in its dictionary
        "...'): longer than --max-source-positions 1024 allows (the longest has 1101 tokens with the "
        "end-of-sentence token); raise --max-source-positions to 1101 to translate it")
