"""The one line a training ends with when it stops before its end, for every model
(installed by ``fairseq_patches``): what happened, at which update, what is saved and how to
go on.

- ``interrupted``: Ctrl-C (fairseq printed a ``KeyboardInterrupt`` traceback of some 60
  lines). The line says the update reached and the checkpoint a rerun of the same command
  resumes from; the process still ends by SIGINT, as Python ends on Ctrl-C (a shell sees
  status 130 and stops its script).
- ``non_finite_training``: fairseq's ``FloatingPointError`` (NaN/inf loss or gradients).
- ``check_loss_growth``: a loss that grew by orders of magnitude while staying finite
  (``--lr 1e30``: losses of 1e32, and fairseq trained on and ended with status 0). An update
  whose training loss is more than ``LOSS_GROWTH`` times the first update's of the process
  (and above ``LOSS_GROWTH`` itself) stops the run before it saves anything more: fairseq's
  logged loss is the criterion's per-token loss (bits for cross entropy), which starts near
  log2 of the vocabulary size and falls; a spike of a healthy run is a few times its value,
  while 10^4 times it (10^5 bits per token for a 32K vocabulary) means weights that no
  longer make a usable model and every further update is wasted. A negative or zero first
  loss (a criterion whose loss is not like that) turns the check off.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

import torch
from fairseq.logging import metrics

from ..errors import HybridRuntimeError

LOSS_GROWTH = 1e4
FIRST_LOSS = "_hybrid_first_loss"  # attribute on fairseq's Trainer


def saved_updates(path: str) -> Optional[int]:
    """The updates a checkpoint file holds (its pickled part only: tensors are mapped)."""
    try:
        state = torch.load(path, map_location="cpu", mmap=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # noqa: BLE001 - only for the message
        return None


def last_checkpoint(save_dir: str) -> str:
    """``DIR/checkpoint_last.pt (update 8)``, or None's wording when there is none."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return ""
    updates = saved_updates(last)
    return f"{last}{f' (update {updates})' if updates is not None else ''}"


def unchanged(save_dir: str) -> str:
    last = last_checkpoint(save_dir)
    return f"{last} is unchanged" if last else "no checkpoint_last.pt had been written yet"


# ------------------------------------------------------------------ Ctrl-C
def updates_reached() -> Optional[int]:
    """The update count fairseq's trainer reached in this process (it logs each one to
    the always-active "default" metrics); None before the trainer exists."""
    meter = metrics.get_meter("default", "num_updates")
    value = getattr(meter, "val", None)
    return None if value is None else int(value)


def interrupted(cfg: Any) -> str:
    """The line for a training stopped by Ctrl-C; empty on ranks other than 0 (one line
    per training)."""
    rank = getattr(cfg.distributed_training, "distributed_rank", 0) or 0
    if rank > 0:
        return ""
    reached = updates_reached()
    at = f" at update {reached}" if reached is not None else ""
    save_dir = cfg.checkpoint.save_dir
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if cfg.checkpoint.no_save:
        then = "nothing is saved with --no-save: the same command starts again from the beginning"
    elif os.path.isfile(last):
        saved = saved_updates(last)
        then = f"rerun the same command to resume from {last}"
        if saved is not None:
            again = reached - saved if reached is not None and reached > saved else 0
            then += f" (update {saved}" + (f"; the {again} after it are made again)" if again else ")")
    else:
        then = f"no checkpoint was written in {save_dir} yet: the same command starts again"
    return f"fairseq_hybrid: training interrupted (Ctrl-C){at}; {then}"


# ------------------------------------------------------------------ NaN, inf, divergence
def with_lr_hint(trainer: Any) -> str:
    return f". Lower --lr (it is {trainer.get_lr():g}) or clip the gradients (--clip-norm)"


def non_finite_training(trainer: Any, error: BaseException, started: float) -> str:
    """The line for a training that fairseq stopped with a ``FloatingPointError``."""
    save_dir = trainer.cfg.checkpoint.save_dir
    crash = os.path.join(save_dir, "crash.pt")
    if os.path.isfile(crash) and os.path.getmtime(crash) >= started - 2:
        saved = (f"fairseq saved the state before it as {crash} (a dump for debugging: do not "
                 "translate with it)")
    else:
        saved = "no crash.pt was written"
    saved += f"; {unchanged(save_dir)}"
    hint = with_lr_hint(trainer) if "Nan/Inf" in str(error) or "loss scale" in str(error) else ""
    return (f"training stopped at update {trainer.get_num_updates() + 1}: the loss or its "
            f"gradients became NaN or inf ({type(error).__name__}: {str(error).strip()[:120]}), "
            f"so that update was not applied; {saved}{hint}")


class DivergedTraining(HybridRuntimeError, FloatingPointError):
    """A loss grown by orders of magnitude (a caller catching fairseq's
    ``FloatingPointError`` for a non-finite one catches this too)."""


def check_loss_growth(trainer: Any, logging_output: Any) -> None:
    """Raise ``DivergedTraining`` when this update's loss grew past the limit (see the
    module); the first update's loss is kept on the trainer."""
    loss = logging_output.get("loss") if isinstance(logging_output, dict) else None
    if loss is None:  # a skipped batch (out of memory, dummy)
        return
    loss = float(loss)
    first = getattr(trainer, FIRST_LOSS, None)
    if first is None:
        if math.isfinite(loss):
            setattr(trainer, FIRST_LOSS, loss)
        return
    if first <= 0 or loss <= LOSS_GROWTH * max(first, 1.0):
        return
    raise DivergedTraining(
        f"training stopped at update {trainer.get_num_updates()}: its loss ({loss:.4g}) is more "
        f"than {LOSS_GROWTH:g} times the first update's of this run ({first:.4g}), so the "
        f"training has diverged; this update was not saved and "
        f"{unchanged(trainer.cfg.checkpoint.save_dir)}{with_lr_hint(trainer)} and train again"
    )
