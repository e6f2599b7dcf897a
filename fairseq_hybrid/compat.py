"""Makes fairseq 0.12's checkpoint loading work under torch >= 2.6.

torch.load now defaults to ``weights_only=True`` and fairseq calls it without the
argument, so loading a fairseq checkpoint fails on ``argparse.Namespace`` and friends.
Rather than turning weights-only loading off for the whole process, we allow exactly the
plain-data classes fairseq checkpoints hold (see ../shared/ENVIRONMENT.md): the
weights-only unpickler still refuses anything else.
"""
from __future__ import annotations

import argparse
import collections
import typing

import torch


def _safe_classes() -> list:
    classes: list = [
        argparse.Namespace,
        collections.defaultdict,
        collections.OrderedDict,
        typing.Any,
        list, dict, int, float, str, bool, tuple, set,
    ]
    try:  # --eval-bleu and some optimizers keep numpy scalars/arrays in the state
        import numpy as np
        from numpy._core.multiarray import _reconstruct, scalar

        classes += [np.ndarray, np.dtype, _reconstruct, scalar]
        classes += [type(np.dtype(t)) for t in ("float32", "float64", "int64", "int32", "bool")]
    except ImportError:  # pragma: no cover - numpy < 2
        pass
    try:  # multi-process resume re-broadcasts the state with omegaconf containers
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        classes += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover
        pass
    try:
        from fairseq.distributed.utils import _TensorPlaceholder

        classes.append(_TensorPlaceholder)
    except ImportError:  # pragma: no cover
        pass
    return classes


def allow_fairseq_checkpoints() -> None:
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(_safe_classes())
