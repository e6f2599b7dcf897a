"""Nothing lost, nothing silent (issue 23): saves that never lose the last good checkpoint,
a rerun of a finished training that changes nothing, one line for a bad --restore-file or
an unwritable --save-dir, and errors a Python caller can catch."""
from __future__ import annotations

import errno
import os
import shutil

import pytest
import torch

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import hydra_error_in_process, model_args, run_tool, train_args, train_error_in_process
from fairseq_hybrid.errors import HybridConfigError, HybridRuntimeError
from fairseq_hybrid.plugin import checkpoints, patience


def only_line(proc) -> str:
    """The run's one message: stderr has no traceback and exactly one plugin line."""
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fairseq_hybrid:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


# ------------------------------------------------------------------ saving
def test_a_full_disk_keeps_the_previous_checkpoint_and_names_the_bytes(tmp_path, monkeypatch):
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(b"previous")
    real_save = torch.save

    def disk_fills(obj, f, *args, **kwargs):
        if isinstance(f, str) or not hasattr(f, "fileno"):
            return real_save(obj, f, *args, **kwargs)  # the byte count
        f.write(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_fills)
    state = {"model": {"w": torch.zeros(1000)}}
    with pytest.raises(HybridRuntimeError) as error:  # not bad input: the disk filled up
        checkpoints.atomic_save(state, str(last))
    message = str(error.value)
    monkeypatch.setattr(torch, "save", real_save)
    counter = checkpoints._ByteCounter()
    torch.save(state, counter)
    assert f"could not write checkpoint_last.pt in {tmp_path}: No space left on device" in message
    assert f"needs {counter.size:,} bytes" in message and "bytes are free there" in message
    assert "the previous checkpoint_last.pt is unchanged" in message
    assert last.read_bytes() == b"previous" and os.listdir(tmp_path) == ["checkpoint_last.pt"]


def test_saves_get_the_ordinary_mode(tmp_path):
    path = tmp_path / "checkpoint_1_3.pt"
    checkpoints.atomic_save({"model": {}}, str(path))
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    assert torch.load(path)["model"] == {}


def test_an_unwritable_save_dir_is_one_line(tmp_path, monkeypatch):
    def refuses(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checkpoints.tempfile, "mkstemp", refuses)
    with pytest.raises(HybridConfigError, match=rf"--save-dir '{tmp_path}' is not writable: "
                                                r"Read-only file system \(read-only or not yours\)"):
        checkpoints.check_save_dir(str(tmp_path))


def test_leftovers_of_killed_saves_are_removed(tmp_path):
    names = ["checkpoint_last.pt", "checkpoint_1_3.pt.tmp", "checkpoint_best.pt.k2j4.tmp",
             "notes.tmp", "checkpoint_best.pt"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert checkpoints.remove_leftovers(str(tmp_path)) == [
        "checkpoint_1_3.pt.tmp", "checkpoint_best.pt.k2j4.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_best.pt", "checkpoint_last.pt", "notes.tmp"]


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_bad_restore_file_is_one_line(tmp_path, kind):
    from types import SimpleNamespace

    path = tmp_path / "other.pt"
    if kind == "directory":
        path.mkdir()
    expected = "is a directory" if kind == "directory" else "does not exist"
    with pytest.raises(HybridConfigError, match=f"--restore-file '{path}' {expected}"):
        checkpoints.check_restore_file(SimpleNamespace(restore_file=str(path)))
    checkpoints.check_restore_file(SimpleNamespace(restore_file="checkpoint_last.pt"))  # default


@pytest.mark.parametrize("extra_state, reset, expected", [
    ({"best": 5.0, "val_loss": 5.2, patience.PATIENCE_STATE: {"best": 5.0, "num_runs": 2}}, False, (5.0, 2)),
    ({"best": 5.0, "val_loss": 5.2}, False, (5.0, 0)),  # saved without the plugin: from its best
    ({"best": 5.0, "val_loss": 5.2, patience.PATIENCE_STATE: {"best": 5.0, "num_runs": 2}}, True, None),
    ({"val_loss": 5.2}, False, None),  # nothing to count from
    ({"best": 5.0, "val_loss": 5.2}, "no patience", None),  # this run does not count
])
def test_the_patience_count_is_restored_from_the_checkpoint(extra_state, reset, expected):
    from types import SimpleNamespace

    import fairseq_cli.train

    counter = fairseq_cli.train.should_stop_early
    kept = {name: vars(counter).pop(name) for name in ("best", "num_runs") if name in vars(counter)}
    try:
        cfg = SimpleNamespace(reset_optimizer=reset is True, reset_meters=False,
                              patience=-1 if reset == "no patience" else 3)
        patience.restore_patience(cfg, extra_state)
        got = (counter.best, counter.num_runs) if hasattr(counter, "best") else None
        assert got == expected
        assert patience.patience_state() == (None if expected is None else
                                                {"best": expected[0], "num_runs": expected[1]})
    finally:  # fairseq keeps the count on the function: leave it as it was
        for name in ("best", "num_runs"):
            vars(counter).pop(name, None)
        vars(counter).update(kept)


# ------------------------------------------------------------------ end to end
@pytest.fixture
def data(sample_data):
    """The suite's shared corpus (conftest.sample_data, 400 training pairs: 6 updates an
    epoch at --max-tokens 1000); these tests only read it."""
    return sample_data


def args(data, save_dir, *extra):
    return train_args(data / "bin", model_args(32, 2), "--seed", "3", "--no-epoch-checkpoints",
                      *extra, save_dir=save_dir, max_tokens=1000)


@pytest.mark.slow
def test_a_rerun_of_a_finished_training_changes_nothing(data, tmp_path, monkeypatch):
    save = tmp_path / "save"
    run_tool("fairseq-train", args(data, save, "--max-update", "6"), cwd=data)
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()}
    assert sorted(before) == ["checkpoint_best.pt", "checkpoint_last.pt"]
    (save / "checkpoint_last.pt.x81k.tmp").write_bytes(b"half a checkpoint")  # a killed copy

    for limit in (["--max-update", "6"], ["--max-update", "50", "--max-epoch", "1"]):
        again = run_tool("fairseq-train", args(data, save, *limit), cwd=data, check=False)
        assert again.returncode == 0
        assert only_line(again).startswith(
            f"fairseq_hybrid: training in {save} is at the end of epoch 1, 6 updates: "
            f"{limit[-2]} {limit[-1]} is already ")
        assert "no checkpoint changed" in again.stderr and "train_inner" not in again.stdout
        if limit[1] == "6":
            assert "removed 1 temporary file(s) of an interrupted save" in again.stdout
        assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()} == before

    # a parse-time check, in this process (cli.train_error_in_process): refused, not "finished"
    monkeypatch.chdir(data)
    missing = train_error_in_process(args(data, save, "--restore-file", "nowhere.pt"), monkeypatch)
    assert missing.startswith("fairseq_hybrid: error: --restore-file 'nowhere.pt' does not exist")


def validations(log: str):
    """The updates fairseq validated at, from ``--log-format json`` valid records."""
    import json
    return [int(json.loads(line[line.index("{"):])["valid_num_updates"])
            for line in log.splitlines() if '"valid_num_updates"' in line]


@pytest.mark.slow
def test_patience_counts_across_a_resume_and_a_rerun_after_it_stopped_trains_nothing(data, tmp_path):
    # with --lr 0 no validation is better than the first: --patience 3 stops at update 4
    def patience_args(save, updates, validations=3):
        return args(data, save, "--lr", "0", "--patience", str(validations), "--validate-interval-updates", "1",
                    "--save-interval-updates", "1", "--max-update", str(updates),
                    "--log-format", "json", "--log-interval", "1")

    whole = run_tool("fairseq-train", patience_args(tmp_path / "whole", 20), cwd=data)
    assert validations(whole.stdout) == [1, 2, 3, 4] and "early stop" in whole.stdout

    # a training stopped after update 2: the checkpoint the uninterrupted run saved then
    # (--save-interval-updates 1: checkpoint_1_2.pt, a copy of its checkpoint_last.pt at
    # that moment, after validations 1 and 2) as the checkpoint_last.pt of another directory
    save = tmp_path / "resumed"
    save.mkdir()
    shutil.copy(tmp_path / "whole" / "checkpoint_1_2.pt", save / "checkpoint_last.pt")
    first = torch.load(save / "checkpoint_last.pt", weights_only=False)
    assert first["optimizer_history"][-1]["num_updates"] == 2
    assert first["extra_state"][patience.PATIENCE_STATE]["num_runs"] == 1  # validation 2 not better
    resumed = run_tool("fairseq-train", patience_args(save, 20), cwd=data)
    assert validations(resumed.stdout) == [3, 4]  # fairseq alone restarted the count: 3..6
    assert "early stop" in resumed.stdout
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)["extra_state"]
    assert state[patience.PATIENCE_STATE]["num_runs"] == 3
    assert state[patience.PATIENCE_STATE]["best"] == state["best"]

    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()}
    again = run_tool("fairseq-train", patience_args(save, 20), cwd=data, check=False)
    assert again.returncode == 0 and "train_inner" not in again.stdout
    assert only_line(again).startswith(f"fairseq_hybrid: training in {save} is in epoch 1, 4 updates: "
                                       "--patience 3 already stopped it (3 validations without a better loss")
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()} == before
    more = run_tool("fairseq-train", patience_args(save, 20, validations=4), cwd=data)
    assert validations(more.stdout) == [5]  # a larger --patience trains on, one more validation


@pytest.mark.slow
def test_a_rerun_after_the_time_budget_was_spent_trains_nothing(data, tmp_path):
    save = tmp_path / "save"
    budget = ["--stop-time-hours", "0.0002", "--max-update", "500"]  # 0.72 s: a few updates
    first = run_tool("fairseq-train", args(data, save, *budget), cwd=data)
    assert "Stopping training due to cumulative_training_time" in first.stdout + first.stderr
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()}
    again = run_tool("fairseq-train", args(data, save, *budget), cwd=data, check=False)
    assert again.returncode == 0 and "train_inner" not in again.stdout
    assert "--stop-time-hours 0.0002 is already spent" in only_line(again)
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in save.iterdir()} == before


# ------------------------------------------------------------------ the last batch, errors
@pytest.mark.parametrize("indices", [
    list(range(10)) + [0, 1, 2],  # upsampled: 0, 1, 2 twice (were lost)
    list(range(8)) + [0, 1, 2],  # was an empty last batch
    list(range(300)), [5, 5, 5, 5, 5, 5, 5, 5, 5], list(range(7)),
])
def test_the_last_batch_keeps_every_occurrence_once(indices):
    from collections import Counter

    import numpy as np
    from fairseq.data import data_utils

    indices = np.asarray(indices, dtype=np.int64)
    fairseqs = data_utils.batch_by_size.__wrapped__(indices, lambda i: 3, max_sentences=8,
                                                    required_batch_size_multiple=8)
    ours = data_utils.batch_by_size(indices, lambda i: 3, max_sentences=8,
                                    required_batch_size_multiple=8)
    fairseq_count = sum(len(b) for b in fairseqs)
    expected = [list(b) for b in fairseqs]
    if fairseq_count < len(indices):
        expected.append(list(indices[fairseq_count:]))  # fairseq's batches plus the tail
    assert [list(b) for b in ours] == expected
    assert all(len(b) > 0 for b in ours)
    assert Counter(np.concatenate(ours).tolist()) == Counter(indices.tolist())


def test_errors_are_exceptions_a_caller_can_catch(tmp_path):
    from fairseq import checkpoint_utils

    bad = tmp_path / "model.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(Exception) as error:  # noqa: PT011 - what a caller would write
        checkpoint_utils.load_model_ensemble([str(bad)])
    assert isinstance(error.value, HybridConfigError) and not isinstance(error.value, SystemExit)
    assert str(error.value).startswith(f"fairseq_hybrid: error: {str(bad)!r} is not a readable")


def test_the_command_line_prints_one_line_also_when_fairseq_rewraps_it():
    import subprocess
    import sys

    script = (
        "import fairseq_hybrid\n"
        "from fairseq_hybrid.errors import HybridConfigError\n"
        "try:\n    raise HybridConfigError('the checkpoint does not fit')\n"
        "except Exception:\n    raise Exception('Cannot load model parameters from checkpoint')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1:] == ["fairseq_hybrid: error: the checkpoint does not fit"]
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ fairseq-hydra-train
@pytest.mark.slow
@pytest.mark.parametrize("override,train_option", [
    ("common.fp16=true", ["--fp16"]),  # skipped by the Hydra path before
    ("checkpoint.restore_file=nowhere.pt", ["--restore-file", "nowhere.pt"]),
    ("model.encoder_layers=abc", None),  # an OmegaConf traceback, .hydra/ written
    ("task.data=null", None),  # a TypeError, files written
    ("dataset.max_tokens=-5", ["--max-tokens", "-5"]),  # was "smaller than every sentence pair"
    ("+model.foo=1", None),  # was "model.foo None is not allowed"
])
def test_hydra_refuses_what_fairseq_train_refuses_with_the_same_line(data, tmp_path, monkeypatch,
                                                                     override, train_option):
    """Both in this process: fairseq-hydra-train's callback on the config the command composes
    (``cli.hydra_error_in_process``) and fairseq-train's parse-time checks
    (``cli.train_error_in_process``). How the real commands print these checks' line (one
    line, exit 1, no traceback, nothing written): fairseq-hydra-train's in
    test_hydra_train_prints_the_callbacks_line_before_writing_anything, fairseq-train's in
    tests/test_cli.py (a parse-time check of the same list, ``checks.run_checks``)."""
    save = tmp_path / "never"
    monkeypatch.chdir(data)
    line = hydra_error_in_process("hybrid_lstm", [
        f"task.data={data / 'bin'}", f"checkpoint.save_dir={save}", override])
    assert line.startswith("fairseq_hybrid: error: ") and "\n" not in line, line
    assert not save.exists()
    if train_option is not None:
        assert train_error_in_process(args(data, save, *train_option), monkeypatch) == line
        assert not save.exists()
    else:
        assert line.startswith(f"fairseq_hybrid: error: {override.lstrip('+').split('=')[0]} ")


@pytest.mark.slow
def test_hydra_train_prints_the_callbacks_line_before_writing_anything(data, tmp_path):
    """The real command for one case above (the one that once failed inside the job, after
    Hydra had written .hydra/ and its log): exit status 1, the line the callback refuses with,
    no traceback, nothing written."""
    from test_hydra import hydra_train, leftovers

    save = tmp_path / "never"
    overrides = [f"task.data={data / 'bin'}", f"checkpoint.save_dir={save}", "model.encoder_layers=abc"]
    hydra = hydra_train("hybrid_lstm", overrides, check=False)
    assert hydra.returncode == 1
    assert only_line(hydra) == hydra_error_in_process("hybrid_lstm", overrides)
    assert only_line(hydra).startswith("fairseq_hybrid: error: model.encoder_layers 'abc' is not allowed")
    assert not save.exists() and leftovers() == []


# ------------------------------------------------------------------ scoring
@pytest.mark.parametrize("script", ["score.py", "wmt_score.py"])
@pytest.mark.parametrize("hypotheses,message", [
    # 50 hypotheses, a 49-line reference: hypothesis 49 was silently dropped
    (50, "has 50 hypotheses but the reference has 49 lines (ids beyond it: [49])"),
    (49, "has 1 duplicated hypothesis id(s) (first: [7])"),
])
def test_scoring_refuses_a_reference_of_another_size_and_duplicated_ids(tmp_path, script,
                                                                        hypotheses, message):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "ref.de").write_text("".join(f"Satz {i} ist da.\n" for i in range(49)))
    lines = [f"D-{i}\t-0.5\tSatz {i} ist da.\n" for i in range(hypotheses)]
    if hypotheses == 49:
        lines.append("D-7\t-0.5\tSatz 7 ist da.\n")
    (tmp_path / "gen.out").write_text("".join(lines))
    extra = ["--lang", "de"] if script == "wmt_score.py" else []
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "recipes/lib" / script),
         "--generate-output", "gen.out", "--reference", "ref.de", "--json", "s.json", *extra],
        cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "s.json").exists()
