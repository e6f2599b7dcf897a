"""fairseq-hydra-train support: the Hydra callback that ``recipes/config/*.yaml`` name under
``hydra.callbacks``.

fairseq-hydra-train composes its config, fills it with the dataclass defaults and starts
its processes before it imports the ``--user-dir``; what fairseq-train does while it parses
the command line (the ``--arch`` function) would come too late. Hydra runs this callback
after composing the config and before the job starts (before ``.hydra/``, the log file or
any process exists), so there the plugin

- is imported (the callback lives in it), and ``common.user_dir`` defaults to it;
- fills the model config as fairseq will (fairseq's ``add_defaults``) and then with the
  preset named in ``model._name`` (``model/presets.py``), so the saved ``.hydra/config.yaml``
  and the checkpoints hold the sizes that were trained;
- checks the options as fairseq-train's parse-time checks do (one line, nothing written),
  and refuses a save directory another training holds (``save_dir_lock``);
- adapts fairseq's defaults as ``integration`` does for fairseq-train: one process driving
  several GPUs, ``legacy_ddp``, ``fp16_no_flatten_grads``, bf16 on the CPU.

The config Hydra passes to ``on_run_start`` is the one the job runs with (Hydra copies it
into the job after the callback), so changes made here reach fairseq.
"""
from __future__ import annotations

import contextlib
import difflib
import os
from dataclasses import fields
from argparse import Namespace
from typing import Any, Iterator, List, Sequence

from fairseq.dataclass.configs import FairseqConfig
from fairseq.dataclass.initialize import add_defaults
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from . import save_dir_lock
from .checks import run_checks
from .config import HybridLSTMConfig, apply_preset
from ..errors import HybridConfigError
from .hybrid_lstm import MODEL_NAME
from .integration import adapt_fairseq_config
from .placement_options import chunks_of, stored_chunks

# the groups whose options the parse-time checks read, in fairseq-train's flat namespace
# (later groups win a shared name: the model's pipeline_chunks over fairseq's own)
CHECKED_GROUPS = ("common", "distributed_training", "dataset", "checkpoint", "lr_scheduler",
                  "optimization", "task", "criterion", "model")

# fairseq options the adaptations leave alone when the user set them
ADAPTED = {
    "distributed_training.distributed_world_size": "--distributed-world-size",
    "distributed_training.ddp_backend": "--ddp-backend",
}


class HybridRunSetup(Callback):
    """Prepares a ``fairseq-hydra-train`` run of a hybrid_lstm model (see the module)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with one_line():
            prepare_run_config(config, list(OmegaConf.select(config, "hydra.overrides.task") or []))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with one_line():
            refuse_multirun(config)


@contextlib.contextmanager
def one_line() -> Iterator[None]:
    """Hydra reports a callback's exception with a traceback; the plugin's errors leave as
    their one line and exit status 1 instead (``SystemExit`` passes through Hydra)."""
    try:
        yield
    except HybridConfigError as error:
        raise SystemExit(str(error)) from None


def refuse_multirun(config: DictConfig) -> None:
    if is_hybrid_model(config):
        raise HybridConfigError(
            "fairseq-hydra-train --multirun is not supported with hybrid_lstm: Hydra "
            "composes each job's config anew after its callbacks run, so the plugin "
            "could not prepare it; run one job per command"
        )


def model_name(config: DictConfig) -> Any:
    model = config.get("model")
    return model.get("_name") if isinstance(model, DictConfig) else model


def is_hybrid_model(config: DictConfig) -> bool:


    name = model_name(config)
    return isinstance(name, str) and ARCH_MODEL_NAME_REGISTRY.get(name) == MODEL_NAME


def prepare_run_config(config: DictConfig, overrides: Sequence[str]) -> None:
    """Fill, check and adapt the composed fairseq config ``config`` in place (a no-op
    for other models). ``overrides``: Hydra's command-line overrides (``key=value``)."""
    if not is_hybrid_model(config):
        return

    struct = OmegaConf.is_struct(config)
    try:
        with open_dict(config):
            default_user_dir(config.common)
        with open_dict(config):
            normalise_pipeline_chunks(config)
        check_model_types(config)
        add_defaults(config)  # merges the model's (and task's, criterion's ...) dataclasses
        apply_preset(config.model, model_name(config))
        check_run_config(config, overrides)
    finally:
        OmegaConf.set_struct(config, struct)


def check_model_types(config: DictConfig) -> None:
    """Each ``model.*`` value has its option's type (fairseq found ``model.encoder_layers=
    abc`` only inside the job, after Hydra wrote ``.hydra/`` and its log)."""


    try:
        values = OmegaConf.to_container(config.model, resolve=True)
        OmegaConf.merge(OmegaConf.structured(HybridLSTMConfig), values)
    except ConfigKeyError as error:  # a key the model does not have (+model.foo=1)
        key = (getattr(error, "key", None) or getattr(error, "full_key", None) or "?").split(".")[-1]
        known = [f.name for f in fields(HybridLSTMConfig) if not f.name.startswith("_")]
        close = difflib.get_close_matches(key, known, n=1)
        raise HybridConfigError(
            f"model.{key} is not an option of {model_name(config)}"
            + (f": did you mean model.{close[0]}?" if close else
               f"; its options: {', '.join(known)}")
        ) from None
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "model"
        value = getattr(error, "value", None)
        reason = str(error).strip().splitlines()[0]
        raise HybridConfigError(
            f"model.{key.split('.')[-1]} {value!r} is not allowed: {reason}"
        ) from None


def default_user_dir(common: DictConfig) -> None:
    """This package, unless the user named it; another copy of it cannot be imported
    next to this one (fairseq would stop with an ImportError in the job)."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the package
    given = common.get("user_dir")
    if given is None:
        common.user_dir = here
    elif os.path.basename(os.path.normpath(given)) == os.path.basename(here) and \
            os.path.realpath(given) != here:
        raise HybridConfigError(
            f"common.user_dir {given!r} is another copy of fairseq_hybrid than the one this "
            f"config's Hydra callback runs from ({here}): give that one, or leave "
            "common.user_dir out"
        )


def check_run_config(config: DictConfig, overrides: Sequence[str]) -> None:
    """fairseq-train's parse-time checks (``checks.run_checks``, the same list) and
    adaptations on the groups of a composed config."""

    flat = Namespace()
    for group in CHECKED_GROUPS:
        node = config.get(group)
        if isinstance(node, DictConfig):
            vars(flat).update(OmegaConf.to_container(node, resolve=True))
    if not getattr(flat, "data", None):
        raise HybridConfigError(
            "task.data is not set: give the data directory fairseq-preprocess wrote "
            "(task.data=DIR)"
        )
    check_pipeline_chunks(config)
    devices = run_checks(flat).all_devices()
    if not flat.no_save and first_process():  # before Hydra writes .hydra/ into it
        save_dir_lock.refuse_if_held(flat.save_dir)
    cuda_devices = sum(1 for device in set(devices) if device.type == "cuda")
    adapt_fairseq_config(config, cuda_devices, len(devices), explicit_options(config, overrides))


def first_process() -> bool:
    """Not a rank > 0 of a launcher (torchrun, Slurm): those never hold the lock."""
    return all(int(os.environ.get(name, "0") or 0) == 0 for name in ("RANK", "SLURM_PROCID"))


def normalise_pipeline_chunks(config: DictConfig) -> None:
    """``model.pipeline_chunks`` (``auto``, a number, or a number Hydra read as text) is
    checked and becomes the integer the model's option holds (auto: 0, fairseq's default,
    as for fairseq-train's ``--pipeline-chunks auto``; ``placement_options.chunks_of``)."""

    model = config.get("model")
    if isinstance(model, DictConfig) and "pipeline_chunks" in model:
        model.pipeline_chunks = stored_chunks(chunks_of(model.pipeline_chunks, "model.pipeline_chunks"))


def check_pipeline_chunks(config: DictConfig) -> None:
    """fairseq-train's --pipeline-chunks sets fairseq's option and the model's at once;
    here they are two keys, and the model reads only model.pipeline_chunks."""
    theirs = OmegaConf.select(config, "distributed_training.pipeline_chunks")
    ours = OmegaConf.select(config, "model.pipeline_chunks")
    if theirs not in (None, 0) and theirs != ours:
        raise HybridConfigError(
            f"distributed_training.pipeline_chunks {theirs!r} is not allowed: hybrid_lstm "
            f"reads model.pipeline_chunks (now {ours!r}); set model.pipeline_chunks={theirs} instead"
        )


def explicit_options(config: DictConfig, overrides: Sequence[str]) -> List[str]:
    """The adapted options the user chose, as ``--name=value``: given on the command line,
    or set in the YAML to something other than fairseq's default."""

    given = {override.lstrip("+~").split("=", 1)[0] for override in overrides}
    argv = []
    for key, option in ADAPTED.items():
        group, name = key.split(".")
        default = FairseqConfig.__dataclass_fields__[group].default.__dataclass_fields__[name].default
        value = OmegaConf.select(config, key)
        if key in given or str(value) != str(default):
            argv.append(f"{option}={value}")
    return argv
