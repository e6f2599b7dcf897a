"""Makes fairseq's checkpoint copies atomic.

fairseq writes ``checkpoint_<epoch>_<updates>.pt`` atomically (to ``.tmp``, then rename)
but makes ``checkpoint_last.pt`` and ``checkpoint_best.pt`` with ``PathManager.copy`` =
``shutil.copyfile``: a training killed during that copy leaves a truncated
``checkpoint_last.pt``, and the rerun that should resume cannot. Copies of local files
now go to a temporary name in the same directory and are renamed into place, so the
previous ``checkpoint_last.pt`` stays whole until the new one is.
"""
from __future__ import annotations

import os
import shutil
import tempfile


def atomic_copyfile(src_path: str, dst_path: str) -> str:
    directory = os.path.dirname(os.path.abspath(dst_path))
    handle, tmp_path = tempfile.mkstemp(prefix=os.path.basename(dst_path) + ".", suffix=".tmp",
                                        dir=directory)
    os.close(handle)
    try:
        shutil.copyfile(src_path, tmp_path)
        os.replace(tmp_path, dst_path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    return dst_path


def atomic_checkpoint_copies() -> None:
    """Install (once) for local files; remote ``iopath`` storage keeps its own copy."""
    from fairseq import file_io

    manager = file_io.PathManager
    if file_io.IOPathManager is not None or getattr(manager.copy, "_hybrid_atomic", False):
        return

    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> str:
        return atomic_copyfile(src_path, dst_path)

    copy._hybrid_atomic = True
    manager.copy = staticmethod(copy)
