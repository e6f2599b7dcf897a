"""``--patience`` across a resume (installed by ``checkpoints.apply``, for every model).

fairseq-train keeps ``--patience``'s count (the best validation value and the validations
since it) on its ``should_stop_early`` function only, so a resumed run started counting
again from its first validation, compared with that validation's value instead of the best
one: it trained past the point where the uninterrupted run stops, and could save a
``checkpoint_best.pt`` that run never reaches; a rerun of a run that patience stopped
trained on. Here the count is saved in every checkpoint's ``extra_state`` and restored with
it (as fairseq restores the best value ``checkpoint_best.pt`` is judged by);
``checkpoints.already_done`` reads it to refuse a rerun that patience already stopped. A
checkpoint saved without the count restarts it at 0 from the checkpoint's best value, and
says so.
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Dict, Optional

from fairseq.trainer import Trainer

logger = logging.getLogger(__name__)

PATIENCE_STATE = "should_stop_early"  # extra_state key: {"best": value, "num_runs": count}


def early_stopping() -> Optional[Any]:
    """fairseq-train's ``should_stop_early`` (which keeps ``--patience``'s count as its own
    attributes), when fairseq-train (or fairseq-hydra-train, which runs it) is running."""
    return getattr(sys.modules.get("fairseq_cli.train"), "should_stop_early", None)


def patience_of(cfg: Any) -> int:
    """The run's ``--patience`` (0 when it has none: fairseq's default is -1, off)."""
    return max(0, getattr(cfg, "patience", 0) or 0)


def patience_state() -> Optional[Dict[str, Any]]:
    """``--patience``'s count now: the best validation value and the validations since."""
    counter = early_stopping()
    if counter is None or getattr(counter, "best", None) is None:
        return None
    return {"best": counter.best, "num_runs": int(getattr(counter, "num_runs", 0))}


def restore_patience(cfg: Any, extra_state: Optional[Dict[str, Any]]) -> None:
    """Set ``should_stop_early``'s count from a loaded checkpoint, under the condition
    fairseq restores the best value with (neither optimizer nor meters reset), when this run
    counts (``--patience`` > 0: without it fairseq keeps no count, and none is saved)."""
    counter = early_stopping()
    if counter is None or not extra_state or not patience_of(cfg) or cfg.reset_optimizer or cfg.reset_meters:
        return
    state = extra_state.get(PATIENCE_STATE)
    if state is None and extra_state.get("best") is not None:
        state = {"best": extra_state["best"], "num_runs": 0}
        if extra_state.get("val_loss") != state["best"]:
            logger.warning(
                "fairseq_hybrid: the checkpoint does not hold --patience's count (saved without "
                "the plugin or without --patience): counting restarts at 0 validations since its "
                "best value %s",
                state["best"])
    if state is not None:
        counter.best, counter.num_runs = state["best"], int(state["num_runs"])


def saving_patience() -> None:
    """Every checkpoint fairseq's trainer saves carries ``--patience``'s count."""
    original = Trainer.save_checkpoint
    if getattr(original, "_hybrid_patience", False):
        return

    @functools.wraps(original)
    def save_checkpoint(self: Any, filename: str, extra_state: Any) -> Any:
        state = patience_state()
        if state is not None and isinstance(extra_state, dict):
            extra_state = {**extra_state, PATIENCE_STATE: state}
        return original(self, filename, extra_state)

    save_checkpoint._hybrid_patience = True
    Trainer.save_checkpoint = save_checkpoint
