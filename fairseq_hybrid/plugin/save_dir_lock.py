"""A save directory belongs to one training at a time (installed by ``checkpoints.apply``
around fairseq's ``verify_checkpoint_directory``, for every model).

Two fairseq-train runs given one ``--save-dir`` both trained, overwrote each other's
``checkpoint_last.pt`` and deleted each other's temporary files; neither said a word. The
process that writes the checkpoints takes an exclusive ``flock`` on ``DIR/training.lock``
before the task is set up and keeps it for its lifetime: a second training on the directory
is refused with one line naming the holder (its pid and command, which the holder writes
into the file), before it changes anything there. The operating system releases the lock
when the holder ends in any way (``kill -9`` too), so a lock is never stale; at a normal exit
the holder also removes the file.

Who holds it: fairseq calls ``verify_checkpoint_directory`` from ``fairseq_cli.train.main``
in its master process only (``distributed_utils.is_master``: rank 0, which is the process
that writes the checkpoints, whether the ranks were spawned by fairseq, started by a
launcher or run as one process). A run with ``--no-save`` writes nothing there and takes no
lock (several may share a directory, e.g. a sweep); it reads ``cfg.checkpoint.no_save`` from
fairseq's ``main``, the only caller, because the function receives the directory alone.
A file system without ``flock`` (some network mounts) trains without the lock, with a warning.
fairseq-hydra-train writes ``.hydra/`` and its log into the save directory before the job
starts: its callback refuses a held directory before that (``refuse_if_held``).
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import socket
import sys
import time
from types import FrameType
from typing import Dict, Optional

from ..errors import HybridConfigError

logger = logging.getLogger(__name__)
LOCK_NAME = "training.lock"
# save directory (real path) -> the open file whose flock this process holds
HELD: Dict[str, int] = {}


def lock_path(save_dir: str) -> str:
    return os.path.join(save_dir, LOCK_NAME)


def holder_text() -> str:
    """What the lock file says about this process: ``pid host`` and the command."""
    command = " ".join([os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]])
    return f"{os.getpid()} {socket.gethostname()}\n{command}\n"


def describe_holder(path: str) -> str:
    """``pid 1234 (fairseq-train data-bin ...)`` from the holder's lock file (it writes it
    right after locking: wait a moment for it), or what is known."""
    text = ""
    for _ in range(10):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = ""
        if text.strip():
            break
        time.sleep(0.05)
    first, _, command = text.partition("\n")
    fields = first.split()
    if not fields or not fields[0].isdigit():
        return "another process"
    where = f" on {fields[1]}" if len(fields) > 1 and fields[1] != socket.gethostname() else ""
    command = command.strip()
    if len(command) > 160:
        command = command[:157] + "..."
    return f"pid {fields[0]}{where}" + (f" ({command})" if command else "")


def in_use(save_dir: str, path: str) -> HybridConfigError:
    return HybridConfigError(
        f"--save-dir {save_dir!r} is in use by another training: {describe_holder(path)} holds "
        f"{path}. Wait for it to end (or stop it), or give this run another --save-dir; nothing "
        "in the directory was changed"
    )


def _open_locked(path: str) -> Optional[int]:
    """An open descriptor of ``path`` holding its exclusive flock; None when another
    process holds it. Retries when the file was removed (its holder ended) between the
    open and the lock, so two runs never lock two different files of one name."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as error:
            os.close(fd)
            if isinstance(error, OSError) and error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def hold(save_dir: str) -> None:
    """Take ``save_dir``'s lock for the rest of this process, or raise the one line naming
    the training that has it. Taking it again in the same process is a no-op."""
    key = os.path.realpath(save_dir)
    if key in HELD:
        return
    path = lock_path(save_dir)
    try:
        fd = _open_locked(path)
    except OSError as error:  # no flock here (ENOLCK, EOPNOTSUPP ...): train without it
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return  # not writable: checkpoints.check_save_dir says so in its line
        logger.warning(f"could not lock {path} ({error.strerror or error}): nothing stops "
                       f"another training from using --save-dir {save_dir} at the same time")
        return
    if fd is None:
        raise in_use(save_dir, path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder_text().encode("utf-8"), 0)
    HELD[key] = fd
    atexit.register(release, key, path)


def refuse_if_held(save_dir: str) -> None:
    """Raise ``hold``'s line when another process holds ``save_dir``'s lock, taking none
    and creating nothing (a shared lock for a moment: it waits on no one)."""
    path = lock_path(save_dir)
    if os.path.realpath(save_dir) in HELD or not os.path.isfile(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise in_use(save_dir, path) from None
    finally:
        os.close(fd)


def release(key: str, path: str) -> None:
    """Remove the lock file (while still holding it, so no other run locks a removed file)
    and let go of it. At exit; the operating system does the same for a killed process,
    the file apart."""
    fd = HELD.pop(key, None)
    if fd is None:
        return
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.remove(path)
    except OSError:
        pass
    os.close(fd)


def saves_checkpoints(caller: Optional[FrameType]) -> bool:
    """False for a ``--no-save`` training: fairseq's ``fairseq_cli.train.main`` (the
    caller of ``verify_checkpoint_directory``) holds its config as ``cfg``. Any other
    caller is taken to save."""
    if caller is None or caller.f_code.co_name != "main" or \
            not caller.f_code.co_filename.endswith(os.path.join("fairseq_cli", "train.py")):
        return True
    cfg = caller.f_locals.get("cfg")
    checkpoint = getattr(cfg, "checkpoint", None)
    return not getattr(checkpoint, "no_save", False)
