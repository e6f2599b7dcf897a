"""A checkpoint that does not fit the model a training resumes, named by the options it
was trained with (installed by ``fairseq_patches.apply`` around fairseq's
``Trainer.load_checkpoint``, for every model).

fairseq stops with ``Exception: Cannot load model parameters from checkpoint ...; please
ensure that the architectures match`` under torch's list of mismatched tensors (fairseq's
``--arch lstm`` resumed with another ``--encoder-embed-dim``, say). The line names the first
mismatch and the model options whose values differ between the checkpoint's saved config
and this run's (dropout-like options change no tensor and are left out). hybrid_lstm
names its own cause when it loads the weights (``checks.check_state_dict``), which stands.
"""
from __future__ import annotations

import argparse
import functools
import re
from typing import Any, Dict, Optional

from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.trainer import Trainer

from ..errors import HybridConfigError, hybrid_error_in

CANNOT_LOAD = "Cannot load model parameters from checkpoint"


def model_options(cfg: Any) -> Dict[str, Any]:
    """The model's own options of a saved or current ``cfg.model``: a dataclass model's
    config holds only them; an ``--arch`` registered with ``add_args`` keeps every
    fairseq-train option in one namespace, of which its ``add_args`` names the model's."""
    try:
        values = dict(vars(cfg)) if isinstance(cfg, argparse.Namespace) else dict(cfg.items())
    except Exception:  # noqa: BLE001 - not a config (or an interpolation it cannot resolve)
        return {}
    model = ARCH_MODEL_REGISTRY.get(values.get("arch") or values.get("_name"))
    if isinstance(cfg, argparse.Namespace) and model is not None and hasattr(model, "add_args"):
        parser = argparse.ArgumentParser(add_help=False)
        try:
            model.add_args(parser)
            names = {action.dest for action in parser._actions}
            values = {k: v for k, v in values.items() if k in names or k == "arch"}
        except Exception:  # noqa: BLE001 - an add_args that needs more: compare everything
            pass
    return values


def differing(saved: Any, current: Any) -> str:
    ours, theirs = model_options(current), model_options(saved)
    named = [f"--{key.replace('_', '-')} {theirs[key]} (this run: {ours[key]})"
             for key in theirs if key in ours and theirs[key] != ours[key]
             and "dropout" not in key and not key.startswith("_")]
    return ", ".join(named)


def first_mismatch(error: BaseException) -> str:
    """torch's first complaint (``size mismatch for x: ... [3008, 16] ... [3008, 32]``)."""
    cause = error.__context__ or error.__cause__
    text = " ".join(str(cause or "").split())
    found = re.search(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) "
                      r"from checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)", text)
    if found:
        return f"its {found[1]} is [{found[2]}], this model's [{found[3]}]"
    found = re.search(r"(Missing|Unexpected) key\(s\) in state_dict: ((?:\"[^\"]+\"(?:, )?){1,3})", text)
    return f"{found[1].lower()} {found[2].rstrip(', ')}" if found else ""


def misfit_line(path: str, current: Any, error: BaseException) -> Optional[str]:
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        saved = (state.get("cfg") or {}).get("model") or state.get("args")
    except Exception:  # noqa: BLE001 - cannot say more than fairseq
        return None
    if saved is None:
        return None
    options, mismatch = differing(saved, current), first_mismatch(error)
    why = f" ({mismatch})" if mismatch else ""
    if options:
        return (f"the checkpoint {path} does not fit this run's model{why}: it was trained with "
                f"{options}; give the options it was trained with (or another --save-dir to start "
                "a new training)")
    return (f"the checkpoint {path} does not fit this run's model{why}, though its model options "
            "are the same: was it trained on data binarized with another dictionary?")


def named_misfits() -> None:
    """Wrap (once) ``Trainer.load_checkpoint``."""
    original = Trainer.load_checkpoint
    if getattr(original, "_hybrid_checked", False):
        return

    @functools.wraps(original)
    def load_checkpoint(self: Any, filename: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, filename, *args, **kwargs)
        except Exception as error:
            if hybrid_error_in(error) is not None or not str(error).startswith(CANNOT_LOAD):
                raise
            line = misfit_line(filename, self.cfg.model, error)
            if line is None:
                raise
            raise HybridConfigError(line) from error

    load_checkpoint._hybrid_checked = True
    Trainer.load_checkpoint = load_checkpoint
