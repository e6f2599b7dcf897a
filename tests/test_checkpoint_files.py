"""plugin/checkpoints.py on files a user may hand it: a directory, a truncated or foreign
file, a file without weights, a write that fails, a copy where hard links are refused —
each one line naming the file, and no temporary file left behind."""
import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_hybrid  # noqa: F401  (installs the checkpoint patches)
from fairseq_hybrid.errors import HybridConfigError, HybridRuntimeError
from fairseq_hybrid.plugin import checkpoints, stops


def test_unreadable_checkpoints_are_one_line(tmp_path):
    with pytest.raises(HybridConfigError, match="is a directory, not a fairseq checkpoint file"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(HybridConfigError, match="is not a readable fairseq checkpoint") as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(garbage))
    assert "\n" not in str(error.value)
    weightless = tmp_path / "weightless.pt"
    torch.save({"args": None, "cfg": None, "extra_state": {}, "optimizer": {}, "optimizer_history": [
        {"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {"best": 1.0},
         "num_updates": 0}]}, weightless)  # fairseq reads it; only the weights are missing
    with pytest.raises(HybridConfigError, match="holds no model weights"):
        checkpoint_utils.load_checkpoint_to_cpu(str(weightless))
    assert stops.saved_updates(str(garbage)) is None


def test_a_failed_write_leaves_no_temporary_and_names_the_bytes(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint_last.pt"

    def full_disk(obj, handle, *args, **kwargs):
        if isinstance(handle, str) or hasattr(handle, "fileno"):
            raise OSError(28, "No space left on device")
        return real_save(obj, handle, *args, **kwargs)

    real_save = torch.save
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(HybridRuntimeError, match="No space left on device|bytes") as error:
        checkpoints.atomic_save({"model": {"w": torch.ones(3)}}, str(target))
    assert str(tmp_path) in str(error.value) and "no checkpoint was written" in str(error.value)
    assert os.listdir(tmp_path) == []


def test_a_copy_falls_back_from_hard_links_and_keeps_the_ordinary_mode(tmp_path, monkeypatch):
    source = tmp_path / "checkpoint_3_300.pt"
    source.write_bytes(b"weights")

    def no_links(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    copied = checkpoints.atomic_copyfile(str(source), str(tmp_path / "checkpoint_last.pt"))
    assert open(copied, "rb").read() == b"weights"
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(copied).st_mode & 0o777 == 0o666 & ~umask
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_3_300.pt", "checkpoint_last.pt"]


def test_save_failures_say_what_is_free_or_that_it_is_unknown(tmp_path):
    error = checkpoints.save_failed(OSError(28, "No space left on device"),
                                    str(tmp_path / "missing" / "checkpoint_last.pt"), 1234)
    assert "1,234 bytes" in str(error) and "the free space is unknown" in str(error)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    error = checkpoints.save_failed(OSError(28, "No space left on device"),
                                    str(tmp_path / "checkpoint_best.pt"), None)
    assert "bytes are free there" in str(error) and "previous checkpoint_last.pt is unchanged" in str(error)
