"""What the plugin changes in fairseq's checkpoint handling (installed by
``fairseq_patches.apply``), so that nothing is lost and nothing fails silently:

- ``readable_checkpoints``: a truncated file or one that is not a checkpoint fails with one
  line instead of an unpickling traceback. The files loaded are remembered (``LOADED``), so
  a beam search that fails on non-finite scores can say that its ``--path`` is the
  ``crash.pt`` of a training stopped by a NaN/inf loss (``non_finite_scores``; the
  training's own line: ``stops.non_finite_training``).
- ``safe_saves``: fairseq writes ``checkpoint_<epoch>_<updates>.pt`` to ``NAME.tmp`` and
  renames it, but makes ``checkpoint_last.pt``/``checkpoint_best.pt`` with
  ``shutil.copyfile`` (a kill during the copy leaves a truncated file), and a failed write
  (disk full, read-only directory) is retried twice, logged as a traceback each time and
  leaves the partial ``NAME.tmp`` behind. Here every file is written to a temporary name in
  the save directory and renamed into place with the ordinary mode (umask); the copies are
  hard links where the file system has them (instant, no extra space; every later write
  replaces a name, never rewrites a file in place); a write that fails removes its
  temporary file and stops the run with one line naming the directory, the bytes the
  checkpoint needs and those free. The previous ``checkpoint_last.pt`` is never touched
  until its replacement is whole.
- ``checked_save_dir``: before training (fairseq's ``verify_checkpoint_directory``) the
  save directory must be writable (one line, not a traceback) and free: the training takes
  its lock (``save_dir_lock``: a second training on the directory is refused in one line);
  then the temporary files a killed save left there are removed.
- ``checked_resume``: a checkpoint to resume from that cannot be read is one line saying
  to delete it or naming an older one for ``--restore-file``; a ``--restore-file`` that
  does not exist or is a directory is one line (fairseq trained from scratch without a
  word); a rerun of a training that already reached ``--max-update``/``--max-epoch`` or
  spent ``--stop-time-hours`` says so in one line and exits 0 before it changes anything
  (fairseq made one more update and overwrote the checkpoints).
- ``patience.saving_patience`` (``plugin/patience.py``): ``--patience``'s count is kept in
  every checkpoint, so a resumed run stops where the uninterrupted one does; a rerun of a
  run that patience stopped says so here and exits like one that reached ``--max-update``.
"""
from __future__ import annotations

import errno
import functools
import glob
import logging
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Optional

import torch
from fairseq import checkpoint_utils, file_io

from ..errors import HybridConfigError, HybridRuntimeError
from . import save_dir_lock
from .patience import patience_of, patience_state, restore_patience, saving_patience

logger = logging.getLogger(__name__)
TEMPORARY = ("checkpoint*.pt.tmp", "checkpoint*.pt.*.tmp")
# path -> the update a crash.pt stopped at (None: an ordinary checkpoint), as loaded
LOADED: Dict[str, Optional[int]] = {}


# ------------------------------------------------------------------ reading
class UnreadableCheckpoint(HybridConfigError):
    """A checkpoint file that cannot be read; ``message`` without the prefix."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def first_sentence(text: str, limit: int = 160) -> str:
    """The first sentence of an error's text (torch's zip errors go on about miniz and
    what to do in Python), at most ``limit`` characters, cut between words."""
    text = " ".join(text.split())
    sentence = text.split(". ")[0].rstrip(".")
    if len(sentence) <= limit:
        return sentence
    return sentence[:limit].rsplit(" ", 1)[0] + " ..."


def resume_hint(path: str, restore_file: bool = False) -> str:
    """What to do when the checkpoint a training resumes from cannot be read: delete it
    (``--save-dir``'s checkpoint_last.pt) or give another ``--restore-file``, naming the
    newest other checkpoint of its directory (another file, not a link of it)."""
    directory = os.path.dirname(os.path.abspath(path))
    others = []
    for other in glob.glob(os.path.join(glob.escape(directory), "checkpoint*.pt")):
        try:
            if not os.path.samefile(other, path):
                others.append((os.path.getmtime(other), other))
        except OSError:
            continue
    newest = max(others)[1] if others else None
    if restore_file:
        return "give another --restore-file" + (f", e.g. {newest}" if newest else "")
    hint = "delete it (the training then starts over)"
    if newest:
        hint += f", or resume from an older checkpoint with --restore-file {newest}"
    return hint


def readable_checkpoints() -> None:
    """Install the wrapper (once) around fairseq's checkpoint loading."""

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        if os.path.isdir(path):
            raise HybridConfigError(f"{path!r} is a directory, not a fairseq checkpoint file")
        if not os.path.isfile(path):
            return original(path, *args, **kwargs)  # fairseq's own "not found" handling
        try:
            state = original(path, *args, **kwargs)
        except HybridConfigError:
            raise
        except Exception as error:  # unpickling, zip, EOF, missing keys ...
            raise UnreadableCheckpoint(
                path, f"{path!r} is not a readable fairseq checkpoint (truncated, or another kind "
                      f"of file): {type(error).__name__}: {first_sentence(str(error))}"
            ) from None
        if not isinstance(state, dict) or "model" not in state:
            raise HybridConfigError(f"{path!r} is not a fairseq checkpoint: it holds no model weights")
        LOADED[path] = crash_dump_update(path, state)
        return state

    load_checkpoint_to_cpu._hybrid_checked = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def crash_dump_update(path: str, state: dict) -> Optional[int]:
    """The update at which training stopped, when ``state`` is the ``crash.pt`` fairseq's
    trainer saved then (the state before that update; no ``val_loss`` in its extra state,
    unlike every checkpoint ``checkpoint_utils.save_checkpoint`` writes); else None."""
    extra = state.get("extra_state")
    if os.path.basename(path) != "crash.pt" or not isinstance(extra, dict) or "val_loss" in extra:
        return None
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0)) + 1


def non_finite_scores(ids: list) -> str:
    """The line for a beam search that could end no hypothesis: every score NaN or -inf."""
    shown = ", ".join(str(i) for i in sorted(ids)[:5]) + (" ..." if len(ids) > 5 else "")
    line = (f"no translation of the batch of sentence ids {shown} could be ended: every "
            "continuation scored NaN or -inf, so the model's output is not finite")
    crashes = [(path, update) for path, update in LOADED.items() if update is not None]
    if crashes:
        path, update = crashes[-1]
        return (f"{line}; {path!r} is the crash.pt fairseq saved when training stopped on a "
                f"non-finite loss at update {update} (the state before it, for debugging): "
                "translate with checkpoint_best.pt or checkpoint_last.pt of that training")
    paths = ", ".join(repr(path) for path in LOADED) or "--path"
    return f"{line}: the weights in {paths} are not usable (did their training diverge?)"


# ------------------------------------------------------------------ writing
def ordinary_mode(path: str) -> None:
    """The mode ``open()`` would have given ``path`` (mkstemp makes files 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


class _ByteCounter:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def save_failed(error: OSError, dst_path: str, needed: Optional[int]) -> HybridRuntimeError:
    directory = os.path.dirname(os.path.abspath(dst_path))
    try:
        free = f"{shutil.disk_usage(directory).free:,} bytes are free there"
    except OSError:
        free = "the free space is unknown"
    size = f"{needed:,} bytes" if needed is not None else "its size"
    last = os.path.join(directory, "checkpoint_last.pt")
    kept = ("the previous checkpoint_last.pt is unchanged" if os.path.isfile(last)
            else "no checkpoint was written")
    return HybridRuntimeError(
        f"could not write {os.path.basename(dst_path)} in {directory}: "
        f"{error.strerror or error} (the checkpoint needs {size}; {free}); {kept}. Free space "
        "or give a writable --save-dir, then rerun the same command"
    )


def _temporary(dst_path: str) -> str:
    directory = os.path.dirname(os.path.abspath(dst_path))
    handle, tmp_path = tempfile.mkstemp(prefix=os.path.basename(dst_path) + ".", suffix=".tmp",
                                        dir=directory)
    os.close(handle)
    return tmp_path


def atomic_save(obj: Any, filename: str, async_write: bool = False) -> None:
    """``checkpoint_utils.torch_persistent_save`` for local files: a temporary file, fsync,
    rename; on a write error the temporary file is removed and one line raised."""
    try:
        tmp_path = _temporary(filename)
    except OSError as error:
        raise save_failed(error, filename, None) from None
    try:
        with open(tmp_path, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        ordinary_mode(tmp_path)
        os.replace(tmp_path, filename)
    except BaseException as error:
        _remove(tmp_path)
        cause = os_error(error)
        if cause is None:
            raise
        counter = _ByteCounter()
        torch.save(obj, counter)
        raise save_failed(cause, filename, counter.size) from None


def atomic_copyfile(src_path: str, dst_path: str) -> str:
    """``dst_path`` becomes ``src_path``'s content at once: a hard link (or, where links
    are not possible, a copy) under a temporary name, renamed into place. When ``dst_path``
    already is a link to ``src_path``'s file, rename(2) does nothing and succeeds (POSIX),
    leaving the temporary link: ``dst_path`` holds the content already, the link goes."""
    try:
        tmp_path = _temporary(dst_path)
    except OSError as error:
        raise save_failed(error, dst_path, os.path.getsize(src_path)) from None
    try:
        try:
            os.remove(tmp_path)
            os.link(src_path, tmp_path)
        except OSError:  # no hard links here (or across devices): copy
            shutil.copyfile(src_path, tmp_path)
            ordinary_mode(tmp_path)
        os.replace(tmp_path, dst_path)
        if os.path.lexists(tmp_path):  # the same file under both names: nothing was renamed
            os.remove(tmp_path)
    except OSError as error:
        _remove(tmp_path)
        raise save_failed(error, dst_path, os.path.getsize(src_path)) from None
    except BaseException:
        _remove(tmp_path)
        raise
    return dst_path


def os_error(error: BaseException) -> Optional[OSError]:
    """The OSError behind ``error`` (torch.save reports a full disk as a RuntimeError of
    its zip writer raised while handling the OSError)."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, OSError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def safe_saves() -> None:
    """Install (once) for local files; remote ``iopath`` storage keeps its own saving."""

    manager = file_io.PathManager
    if file_io.IOPathManager is not None or getattr(manager.copy, "_hybrid_atomic", False):
        return

    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> str:
        return atomic_copyfile(src_path, dst_path)

    copy._hybrid_atomic = True
    manager.copy = staticmethod(copy)
    original = checkpoint_utils.torch_persistent_save

    @functools.wraps(original)
    def torch_persistent_save(obj: Any, filename: Any, async_write: bool = False) -> None:
        if async_write or not isinstance(filename, str):
            return original(obj, filename, async_write)
        return atomic_save(obj, filename)

    checkpoint_utils.torch_persistent_save = torch_persistent_save


# ------------------------------------------------------------------ before training
def remove_leftovers(save_dir: str) -> list:
    """Delete the temporary files of saves that were killed; returns their names."""
    removed = []
    for pattern in TEMPORARY:
        for path in glob.glob(os.path.join(glob.escape(save_dir), pattern)):
            _remove(path)
            removed.append(os.path.basename(path))
    return sorted(removed)


def check_save_dir(save_dir: str) -> None:
    """The save directory exists (or can be made) and takes a file; one line if not."""
    try:
        os.makedirs(save_dir, exist_ok=True)
        probe = _temporary(os.path.join(save_dir, "checkpoint_probe.pt"))
        _remove(probe)
    except OSError as error:
        reason = error.strerror or str(error)
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            reason += " (read-only or not yours)"
        raise HybridConfigError(
            f"--save-dir {save_dir!r} is not writable: {reason}; give a directory the "
            "checkpoints can be written to (or --no-save)"
        ) from None


def checked_save_dir() -> None:

    original = checkpoint_utils.verify_checkpoint_directory
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def verify_checkpoint_directory(save_dir: str) -> None:
        saves = save_dir_lock.saves_checkpoints(sys._getframe(1))  # not with --no-save
        if saves and os.path.isdir(save_dir):
            save_dir_lock.hold(save_dir)  # before this run writes anything there
        check_save_dir(save_dir)
        if not saves:
            return  # --no-save: writes nothing there (and may run beside a training)
        save_dir_lock.hold(save_dir)  # a directory check_save_dir made
        removed = remove_leftovers(save_dir)
        if removed:
            logger.warning(f"removed {len(removed)} temporary file(s) of an interrupted save "
                           f"from {save_dir}: {', '.join(removed)}")

    verify_checkpoint_directory._hybrid_checked = True
    checkpoint_utils.verify_checkpoint_directory = verify_checkpoint_directory


# ------------------------------------------------------------------ resuming
def restore_path(cfg: Any, suffix: str = "") -> Optional[str]:
    """The file a non-default ``--restore-file`` names (None for fairseq's default)."""
    restore = getattr(cfg, "restore_file", "checkpoint_last.pt") or "checkpoint_last.pt"
    if restore == "checkpoint_last.pt":
        return None
    return restore.replace(".pt", suffix + ".pt") if suffix else restore


def check_restore_file(cfg: Any, suffix: str = "") -> None:
    path = restore_path(cfg, suffix)
    if path is None:
        return
    if os.path.isdir(path):
        raise HybridConfigError(f"--restore-file {path!r} is a directory: give a checkpoint file "
                                "(e.g. DIR/checkpoint_last.pt)")
    if not os.path.isfile(path):
        raise HybridConfigError(
            f"--restore-file {path!r} does not exist (it is read relative to the current "
            "directory, not --save-dir); leave it out to resume from --save-dir's "
            "checkpoint_last.pt"
        )


def already_done(cfg: Any, trainer: Any, epoch_itr: Any) -> Optional[str]:
    """The line to print when the loaded checkpoint already reached the run's limits."""
    optimization = trainer.cfg.optimization
    updates, epoch = trainer.get_num_updates(), epoch_itr.next_epoch_idx
    stage = (f"in epoch {epoch_itr.epoch}" if epoch_itr.iterations_in_epoch
             else f"at the end of epoch {epoch_itr.epoch - 1}")
    where = f"{cfg.save_dir} is {stage}, {updates} updates"
    if optimization.max_update and updates >= optimization.max_update:
        return (f"{where}: --max-update {optimization.max_update} is already reached; nothing "
                "to do and no checkpoint changed (raise --max-update to train further)")
    if optimization.max_epoch and epoch > optimization.max_epoch:
        return (f"{where}: --max-epoch {optimization.max_epoch} is already done; nothing to do "
                "and no checkpoint changed (raise --max-epoch to train further)")
    hours, spent = optimization.stop_time_hours or 0, trainer.cumulative_training_time() / 3600
    if hours > 0 and spent > hours:
        return (f"{where}: --stop-time-hours {hours} is already spent ({spent:.4g} hours of "
                "training); nothing to do and no checkpoint changed (raise --stop-time-hours to "
                "train further)")
    state, patience = patience_state(), patience_of(cfg)
    if patience and state is not None and state["num_runs"] >= patience:
        return (f"{where}: --patience {patience} already stopped it ({state['num_runs']} "
                f"validations without a better {cfg.best_checkpoint_metric} than {state['best']}); "
                "nothing to do and no checkpoint changed (raise --patience to train further)")
    return None


def checked_resume() -> None:

    original = checkpoint_utils.load_checkpoint
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def load_checkpoint(cfg: Any, trainer: Any, **passthrough: Any) -> Any:
        check_restore_file(cfg, getattr(trainer, "checkpoint_suffix", "") or "")
        try:
            extra_state, epoch_itr = original(cfg, trainer, **passthrough)
        except UnreadableCheckpoint as error:
            hint = resume_hint(error.path, restore_file=restore_path(cfg) is not None)
            raise HybridConfigError(f"{error.message}; {hint}") from None
        restore_patience(cfg, extra_state)
        line = already_done(cfg, trainer, epoch_itr) if extra_state is not None else None
        if line is not None:
            if getattr(trainer, "data_parallel_rank", 0) == 0:
                print(f"fairseq_hybrid: training in {line}", file=sys.stderr, flush=True)
            raise SystemExit(0)
        return extra_state, epoch_itr

    load_checkpoint._hybrid_checked = True
    checkpoint_utils.load_checkpoint = load_checkpoint


def apply() -> None:
    readable_checkpoints()
    safe_saves()
    checked_save_dir()
    checked_resume()
    saving_patience()
