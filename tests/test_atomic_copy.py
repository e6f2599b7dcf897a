"""checkpoint_last.pt is replaced atomically: a copy that dies half way leaves the
previous file whole and no temporary file behind."""
import os
import shutil

import pytest
from fairseq.file_io import PathManager

import fairseq_hybrid  # noqa: F401  (installs the atomic copy)


def test_fairseq_copies_atomically(tmp_path, monkeypatch):
    new, last = tmp_path / "checkpoint_3_9.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"new weights" * 1000)
    last.write_bytes(b"previous weights")
    real_copyfile = shutil.copyfile

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    def dies_half_way(src, dst, *args, **kwargs):
        with open(dst, "wb") as out:
            out.write(open(src, "rb").read()[:100])
        raise KeyboardInterrupt("killed during the copy")

    monkeypatch.setattr(os, "link", no_links)  # a file system without hard links: copied
    monkeypatch.setattr(shutil, "copyfile", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        PathManager.copy(str(new), str(last), overwrite=True)
    assert last.read_bytes() == b"previous weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_3_9.pt", "checkpoint_last.pt"]

    monkeypatch.setattr(shutil, "copyfile", real_copyfile)
    assert PathManager.copy(str(new), str(last), overwrite=True)
    assert last.read_bytes() == new.read_bytes()
    assert oct(last.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_copies_are_hard_links_with_the_ordinary_mode(tmp_path):
    new, last = tmp_path / "checkpoint_3_9.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"new weights")
    new.chmod(0o644)
    last.write_bytes(b"previous weights")
    assert PathManager.copy(str(new), str(last), overwrite=True)
    assert os.path.samefile(new, last) and last.read_bytes() == b"new weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_3_9.pt", "checkpoint_last.pt"]
