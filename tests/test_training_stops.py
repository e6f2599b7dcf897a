"""Two trainings never share a save directory (its lock), the atomic copy never leaves a
temporary link, and a training that stops early says so in one line: Ctrl-C (the update
reached, how to resume) and a loss grown by orders of magnitude."""
from __future__ import annotations

import errno
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import BIN, model_args, run_tool, train_args, train_losses
from fairseq_hybrid.errors import HybridConfigError, HybridRuntimeError
from fairseq_hybrid.plugin import checkpoints, save_dir_lock, stops


# ------------------------------------------------------------------ the lock, in this process
def hold_then_sleep(save_dir: str, ready) -> None:
    save_dir_lock.hold(save_dir)
    ready.set()
    time.sleep(120)


@pytest.fixture
def holder(tmp_path):
    """A forked process that holds ``tmp_path``'s lock until it is killed (here, or at the
    end of the test)."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    process = context.Process(target=hold_then_sleep, args=(str(tmp_path), ready))
    process.start()
    assert ready.wait(30)
    yield process
    process.kill()
    process.join(30)


def test_a_held_save_dir_is_refused_naming_the_holder_until_it_dies(tmp_path, holder):
    lock = tmp_path / save_dir_lock.LOCK_NAME
    command = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])
    with pytest.raises(HybridConfigError) as refused:
        save_dir_lock.hold(str(tmp_path))
    line = str(refused.value)
    assert line.startswith(f"fairseq_hybrid: error: --save-dir '{tmp_path}' is in use by another "
                           f"training: pid {holder.pid} ({command[:60]}")
    assert line.endswith(f"holds {lock}. Wait for it to end (or stop it), or give this run another "
                         "--save-dir; nothing in the directory was changed") and "\n" not in line
    assert str(tmp_path.resolve()) not in save_dir_lock.HELD
    with pytest.raises(HybridConfigError) as probed:  # fairseq-hydra-train's check, before .hydra/
        save_dir_lock.refuse_if_held(str(tmp_path))
    assert str(probed.value) == line

    os.kill(holder.pid, signal.SIGKILL)  # the OS releases the lock; the file stays behind
    holder.join(30)
    assert lock.read_text().split()[0] == str(holder.pid)
    save_dir_lock.refuse_if_held(str(tmp_path))  # free: no error, nothing taken
    assert str(tmp_path.resolve()) not in save_dir_lock.HELD
    save_dir_lock.hold(str(tmp_path))
    save_dir_lock.hold(str(tmp_path))  # again in the same process: it already holds it
    try:
        assert lock.read_text().split()[0] == str(os.getpid())
    finally:
        save_dir_lock.release(str(tmp_path.resolve()), str(lock))
    assert not lock.exists()  # removed by its holder at the end


def test_a_lock_file_removed_between_open_and_lock_is_not_locked(tmp_path, monkeypatch):
    """The holder removes the file at its exit: a run that opened it just before must lock
    the file that is there afterwards, not the removed one."""
    path = str(tmp_path / save_dir_lock.LOCK_NAME)
    real_flock = save_dir_lock.fcntl.flock
    calls = []

    def holder_exits_first(fd, operation):
        if not calls:
            os.remove(path)  # what the previous holder does at its exit
        calls.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(save_dir_lock.fcntl, "flock", holder_exits_first)
    fd = save_dir_lock._open_locked(path)
    try:
        assert len(calls) == 2 and os.fstat(fd).st_ino == os.stat(path).st_ino
    finally:
        os.close(fd)


@pytest.mark.parametrize("code,warned", [(errno.ENOLCK, True), (errno.EROFS, False)])
def test_a_directory_without_flock_trains_without_the_lock(tmp_path, monkeypatch, caplog, code, warned):
    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(save_dir_lock.fcntl, "flock", no_locks)
    save_dir_lock.hold(str(tmp_path))  # a read-only one is check_save_dir's to report
    assert str(tmp_path.resolve()) not in save_dir_lock.HELD
    assert ("nothing stops another training from using --save-dir" in caplog.text) is warned


def test_only_a_training_that_saves_takes_the_lock():
    def main(cfg):  # stands for fairseq_cli.train.main, which holds the config as cfg
        return sys._getframe(0)

    main.__code__ = main.__code__.replace(co_filename=os.path.join("site", "fairseq_cli", "train.py"))
    for no_save in (True, False):
        cfg = SimpleNamespace(checkpoint=SimpleNamespace(no_save=no_save))
        assert save_dir_lock.saves_checkpoints(main(cfg)) is not no_save
    assert save_dir_lock.saves_checkpoints(sys._getframe(0))  # another caller: it saves
    assert save_dir_lock.saves_checkpoints(None)


def test_a_copy_onto_a_link_of_the_same_file_leaves_no_temporary_link(tmp_path):
    """rename(2) of a hard link onto another name of the same file does nothing: the
    temporary link stayed as checkpoint_last.pt.<random>.tmp."""
    new, last = tmp_path / "checkpoint_1_8.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"weights of update 8")
    os.link(new, last)
    checkpoints.atomic_copyfile(str(new), str(last))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1_8.pt", "checkpoint_last.pt"]
    assert last.read_bytes() == b"weights of update 8" and os.path.samefile(new, last)


# ------------------------------------------------------------------ a loss that explodes
def trainer_at(update: int, save_dir: str, lr: float = 1e30) -> SimpleNamespace:
    return SimpleNamespace(get_num_updates=lambda: update, get_lr=lambda: lr,
                           cfg=SimpleNamespace(checkpoint=SimpleNamespace(save_dir=save_dir)))


@pytest.mark.parametrize("first,later,stops_at", [
    (11.5, [9.0, 30.0, 11.0, 1.15e5], None),  # spikes up to 10^4 x the first: trained on
    (11.5, [9.0, 1.15e5 + 1, 3.0], 2),
    (11.5, [float("inf")], 1), (11.5, [float("nan")], 1),
    (1e-3, [5.0, 9e3], None),  # near 0 at the start: the limit is never below 10^4
    (-2.0, [1e9], None), (None, [1e9], None),  # a loss of another kind / a skipped batch
])
def test_a_loss_grown_by_orders_of_magnitude_stops_the_training(tmp_path, first, later, stops_at):
    trainer = trainer_at(0, str(tmp_path))
    stops.check_loss_growth(trainer, {"loss": first} if first is not None else None)
    for update, loss in enumerate(later, start=1):
        trainer.get_num_updates = lambda update=update: update
        if update != stops_at:
            stops.check_loss_growth(trainer, {"loss": loss})
            continue
        with pytest.raises(stops.DivergedTraining) as stopped:
            stops.check_loss_growth(trainer, {"loss": loss})
        assert str(stopped.value).startswith(
            f"fairseq_hybrid: error: training stopped at update {update}: its loss ({loss:.4g}) is "
            f"more than 10000 times the first update's of this run ({first:.4g}), so the training "
            "has diverged; this update was not saved and no checkpoint_last.pt had been written "
            "yet. Lower --lr (it is 1e+30)")
        assert isinstance(stopped.value, FloatingPointError)
        assert isinstance(stopped.value, HybridRuntimeError) and not isinstance(stopped.value, HybridConfigError)
        break
    else:
        assert stops_at is None


def test_the_ctrl_c_line_says_what_a_rerun_does(tmp_path, monkeypatch):
    def cfg(no_save=False, rank=0):
        return SimpleNamespace(distributed_training=SimpleNamespace(distributed_rank=rank),
                               checkpoint=SimpleNamespace(save_dir=str(tmp_path), no_save=no_save))

    monkeypatch.setattr(stops, "updates_reached", lambda: 7)
    assert stops.interrupted(cfg()) == ("fairseq_hybrid: training interrupted (Ctrl-C) at update 7; no "
                                        f"checkpoint was written in {tmp_path} yet: the same command starts again")
    assert stops.interrupted(cfg(no_save=True)).endswith("; nothing is saved with --no-save: the same "
                                                         "command starts again from the beginning")
    assert stops.interrupted(cfg(rank=1)) == ""  # one line per training: rank 0's
    monkeypatch.setattr(stops, "saved_updates", lambda path: 7)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    assert stops.interrupted(cfg()).endswith(f"resume from {tmp_path}/checkpoint_last.pt (update 7)")
    monkeypatch.setattr(stops, "updates_reached", lambda: None)  # before the trainer existed
    assert stops.interrupted(cfg()).startswith("fairseq_hybrid: training interrupted (Ctrl-C); rerun")


# ------------------------------------------------------------------ end to end
def start_training(args, cwd) -> subprocess.Popen:
    """fairseq-train in the background, its output line by line, Ctrl-C not ignored."""
    return subprocess.Popen(
        [str(BIN / "fairseq-train"), *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def read_until(proc, done, timeout: float = 240) -> str:
    seen, deadline = [], time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        if done("".join(seen)):
            return "".join(seen)
        assert time.time() < deadline, "".join(seen)[-3000:]
    raise AssertionError(f"ended before expected: {''.join(seen)[-3000:]}")


def args(data, save, *extra):
    return train_args(data / "bin", model_args(16, 2), "--no-epoch-checkpoints", "--seed", "2",
                      "--log-format", "json", "--log-interval", "1", "--disable-validation",
                      *extra, save_dir=save, max_tokens=300)


def only_line(proc, prefix="fairseq_hybrid: error: ") -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_second_training_on_a_save_dir_is_refused_and_a_killed_holders_lock_is_free(sample_data, tmp_path):
    save = tmp_path / "save"
    first = start_training(args(sample_data, save, "--max-update", "100000", "--save-interval-updates",
                                "2"), sample_data)
    try:
        read_until(first, lambda log: '"num_updates": "3"' in log)  # update 2 was saved
        second = run_tool("fairseq-train", args(sample_data, save, "--max-update", "3"),
                          cwd=sample_data, check=False)
        assert second.returncode == 1 and "train_inner" not in second.stdout
        assert only_line(second).startswith(f"fairseq_hybrid: error: --save-dir '{save}' is in use by "
                                             f"another training: pid {first.pid} (fairseq-train ")
        assert first.poll() is None  # the first trains on
    finally:
        first.kill()
        first.wait(60)
    # SIGKILL may land inside a save: its temporary file then stays (nothing can remove it),
    # while checkpoint_last.pt is the last whole one, which the third run resumes from
    saved = stops.saved_updates(str(save / "checkpoint_last.pt"))
    assert saved is not None and saved >= 2  # the first's, whole
    assert (save / save_dir_lock.LOCK_NAME).read_text().split()[0] == str(first.pid)

    third = run_tool("fairseq-train", args(sample_data, save, "--max-update", str(saved + 2)),
                     cwd=sample_data)
    assert sorted(train_losses(third.stdout)) == [saved + 1, saved + 2]  # resumed, trained
    assert not (save / save_dir_lock.LOCK_NAME).exists()


@pytest.mark.slow
@pytest.mark.parametrize("model", [["--hybrid-devices", "cpu,cpu"], ["--arch", "lstm"]])
def test_ctrl_c_is_one_line_with_the_update_and_how_to_resume(sample_data, tmp_path, model):
    save = tmp_path / "save"
    extra = ["--criterion", "cross_entropy"] if "lstm" in model else []
    proc = start_training(args(sample_data, save, *model, *extra, "--max-update", "100000",
                               "--save-interval-updates", "3"), sample_data)
    read_until(proc, lambda log: '"num_updates": "4"' in log)
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT  # as Python ends on Ctrl-C: a shell sees 130
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    line = rest.strip().splitlines()[-1]
    logged = max(train_losses(rest) or {4: 0})  # the update may end between its log lines
    found = re.fullmatch(r"fairseq_hybrid: training interrupted \(Ctrl-C\) at update (\d+); rerun "
                         rf"the same command to resume from {save}/checkpoint_last\.pt \(update "
                         r"(\d+)(; the (\d+) after it are made again)?\)", line)
    assert found, line
    reached, saved = int(found[1]), int(found[2])
    assert reached in (logged, logged + 1)
    assert saved == stops.saved_updates(str(save / "checkpoint_last.pt")) and saved >= 3
    assert int(found[4] or 0) == reached - saved


@pytest.mark.slow
def test_an_exploding_loss_stops_the_training_in_one_line(sample_data, tmp_path):
    save = tmp_path / "save"
    proc = run_tool("fairseq-train", args(sample_data, save, "--max-update", "50", "--lr", "1e30"),
                    cwd=sample_data, check=False)
    assert proc.returncode == 1
    found = re.match(r"fairseq_hybrid: error: training stopped at update (\d+): its loss \((\S+)\) is "
                     r"more than 10000 times the first update's of this run \((\S+)\)", only_line(proc))
    assert found and "Lower --lr (it is 1e+30)" in only_line(proc)
    losses = train_losses(proc.stdout)  # the updates before it, logged
    assert sorted(losses) == list(range(1, int(found[1])))
    assert float(found[2]) > 1e4 * losses[1] and float(found[3]) == pytest.approx(losses[1], abs=2e-3)
    assert not save.exists() or not [n for n in os.listdir(save) if n.startswith("checkpoint")]
