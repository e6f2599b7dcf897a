"""The placement options, parsed and checked in one place: ``--hybrid-devices``,
``--hybrid-balance``, ``--pipeline-chunks``, ``--hybrid-head-on-master`` and
``--hybrid-allow-repeated-devices`` become one typed ``PlacementOptions`` (devices as
``torch.device``s, layers per device as integers, chunks as an integer or ``AUTO``), or one
line naming the bad value and what is allowed. Nothing is placed here.

``placement_options`` is the gate. It runs where fairseq hands the plugin the options:
while fairseq-train and the advisor parse the command line (``checks.run_checks`` from the
``--arch`` function), on fairseq-hydra-train's composed config (``hydra_callback``), when a
model is built from its config (``hybrid_lstm.build_model``) and for fairseq-generate's
``--model-overrides`` (``prepare_for_inference_``). Below it, ``parallel/`` takes the typed
value only.

``--pipeline-chunks`` is fairseq's own integer option, which the model shares: a config
holds fairseq's default 0 where it was not given, and ``auto`` is stored as that 0
(``stored_chunks``); the gate reads both as ``AUTO``. An explicit 0 is refused while
argparse still tells it from the default (``chunks_argument``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

import torch

from ..errors import HybridConfigError
from ..parallel.placement import AUTO, Chunks, Devices, devices_of
from .config import effective

DEVICES = "--hybrid-devices"
BALANCE = "--hybrid-balance"
CHUNKS = "--pipeline-chunks"
REPEATED = "--hybrid-allow-repeated-devices"
NOT_GIVEN = 0  # fairseq's default of its --pipeline-chunks: a config's "not given"
DEVICE_SPELLINGS = "a comma-separated list of cuda:N, GPU indices N, or cpu"


@dataclass(frozen=True)
class PlacementOptions:
    """The placement options of a run, each parsed into its type (``placement_options``)."""

    devices: Optional[Devices] = None  # None: this process's device (fairseq sets it per process)
    balance: Optional[Tuple[int, ...]] = None  # layers per device; None: as even as possible
    chunks: Chunks = AUTO  # time chunks per batch; AUTO: chosen on the first batch
    split_head: bool = True  # False: --hybrid-head-on-master

    def all_devices(self) -> Devices:
        """The devices this process drives (its own device when none were given)."""
        return devices_of(self.devices)


def placement_options(values: Any, layers: Optional[Tuple[int, int]] = None,
                      on_this_machine: bool = True) -> PlacementOptions:
    """The gate: the placement options of ``values`` (a namespace or config with the
    options' attribute names, as given or as a config holds them) parsed and checked.
    ``layers``: (encoder, decoder) layer counts (default: the options' own, or the
    preset's). ``on_this_machine``: refuse GPUs this machine lacks (a model's config read
    back for generation names the devices it trained on, which are ignored there)."""
    encoder, decoder = layers or (effective(values, "encoder_layers"), effective(values, "decoder_layers"))
    given = getattr(values, "hybrid_devices", None)
    spec = None if given is None else str(given)  # a Python literal of --model-overrides may be 0
    allow_repeated = bool(getattr(values, "hybrid_allow_repeated_devices", False))
    devices = parse_devices(spec, allow_repeated, on_this_machine)
    count, num_layers = len(devices_of(devices)), min(encoder, decoder)
    if count > num_layers:
        raise HybridConfigError(
            f"{DEVICES} {spec!r} lists {count} devices for {encoder} encoder / {decoder} decoder "
            f"layers: every device needs a layer, so use at most {num_layers}"
        )
    balance = parse_balance(getattr(values, "hybrid_balance", None), count, num_layers, spec)
    return PlacementOptions(devices, balance, chunks_of(getattr(values, "pipeline_chunks", None)),
                            not getattr(values, "hybrid_head_on_master", False))


def parse_device(item: str, spec: str, on_this_machine: bool = True) -> torch.device:
    """One entry of ``--hybrid-devices``: ``cpu``, ``cuda``, ``cuda:N`` or ``N``."""
    text = item.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text.isdigit():
        text = f"cuda:{text}"
    if text == "cuda":
        text = f"cuda:{torch.cuda.current_device() if torch.cuda.is_available() else 0}"
    if text.startswith("cuda:") and text[5:].isdigit():
        index = int(text[5:])
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if on_this_machine and index >= available:
            allowed = (
                f"use indices below {available}" if available
                else "use cpu devices (e.g. cpu,cpu)"
            )
            raise HybridConfigError(
                f"{DEVICES} {spec!r}: {text} is not available (this machine has "
                f"{available} CUDA device{'s' if available != 1 else ''}; {allowed})"
            )
        return torch.device("cuda", index)
    raise HybridConfigError(
        f"{DEVICES} {spec!r}: unknown device {item.strip()!r}: use {DEVICE_SPELLINGS} "
        "(e.g. cuda:0,cuda:1 or 0,1 or cpu,cpu)"
    )


def parse_devices(spec: Optional[str], allow_repeated: bool = False,
                  on_this_machine: bool = True) -> Optional[Devices]:
    """The devices of ``spec`` (None: this process's device, resolved when planning); a GPU
    may be listed twice only with ``allow_repeated`` (two workers sharing one GPU: how one
    GPU runs the multi-device code for checks)."""
    if spec is None:
        return None
    items = spec.split(",")
    if not spec.strip() or any(not item.strip() for item in items):
        raise HybridConfigError(f"{DEVICES} {spec!r} has an empty entry: use {DEVICE_SPELLINGS}")
    devices = tuple(parse_device(item, spec, on_this_machine) for item in items)
    gpus = [d for d in devices if d.type == "cuda"]
    if len(set(gpus)) != len(gpus) and not allow_repeated:
        repeated = sorted({str(d) for d in gpus if gpus.count(d) > 1})
        raise HybridConfigError(
            f"{DEVICES} {spec!r} lists {', '.join(repeated)} more than once: each GPU "
            f"can be given once (cpu may repeat: CPU devices are worker threads; to check "
            f"the multi-device code on one GPU, add {REPEATED})"
        )
    return devices


def parse_balance(spec: Optional[str], num_devices: int, num_layers: int,
                  devices_spec: Optional[str] = None) -> Optional[Tuple[int, ...]]:
    """Layers per device (``2,1,1``); None or empty: contiguous and as even as possible.
    ``devices_spec``: the ``--hybrid-devices`` given (None: the default device), for the
    message."""
    if spec is None or not str(spec).strip():
        return None
    try:
        counts = tuple(int(item) for item in str(spec).split(","))
    except ValueError:
        raise HybridConfigError(
            f"{BALANCE} {spec!r} is not a comma-separated list of integers"
        ) from None
    if len(counts) != num_devices:
        devices = (f"{DEVICES} {devices_spec!r} has {num_devices}" if devices_spec else
                   f"{DEVICES} is not given (one device: {devices_of(None)[0]})")
        raise HybridConfigError(
            f"{BALANCE} {spec!r} gives layer counts for {len(counts)} device(s), but {devices}: "
            f"give one count per device of {DEVICES} (e.g. {DEVICES} "
            f"{','.join(['cpu'] * len(counts))}), or leave {BALANCE} out"
        )
    if sum(counts) != num_layers or min(counts) < 1:
        raise HybridConfigError(
            f"{BALANCE} {spec!r} is not allowed: give {num_devices} integers >= 1 "
            f"(one per device) that sum to the {num_layers} layers"
        )
    return counts


def parse_chunks(value: Union[str, int], option: str = CHUNKS) -> Chunks:
    """A given ``--pipeline-chunks`` (``option``: its name where it was given, e.g. Hydra's
    ``model.pipeline_chunks``): ``auto``, or an integer >= 1; anything else, 0 included, is
    the one line."""
    shown, number = repr(value), value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO.value:
            return AUTO
        try:
            number = int(text)
            shown = str(number)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise HybridConfigError(
            f"{option} {shown} is not allowed: an integer >= 1 (1 = no time chunking) or auto"
        )
    return number


def chunks_of(value: Union[None, str, int], option: str = CHUNKS) -> Chunks:
    """``--pipeline-chunks`` as a config holds it: fairseq's default 0 (or None) was not
    given and is ``AUTO``; anything else is ``parse_chunks``'."""
    if value is None or (type(value) is int and value == NOT_GIVEN):
        return AUTO
    return parse_chunks(value, option)


def stored_chunks(chunks: Chunks) -> int:
    """``chunks`` as fairseq's integer option holds it (``AUTO``: its default 0)."""
    return NOT_GIVEN if chunks is AUTO else chunks


def chunks_argument(parser: argparse.ArgumentParser) -> Callable[[str], int]:
    """The type of fairseq's ``--pipeline-chunks`` in ``parser`` (``fairseq_patches``
    installs it): the value as fairseq stores it, ``auto`` as its default 0. argparse calls
    a type only for a value given on the command line, so there an explicit 0 is still
    told from the default: in the parser of a hybrid_lstm run (it holds ``--hybrid-devices``
    once fairseq has added the model's options) the value is ``parse_chunks``', which
    refuses it; other models keep fairseq's integer, and ``auto`` as its default."""

    def pipeline_chunks(text: str) -> int:
        if DEVICES not in parser._option_string_actions:
            try:
                return int(text)
            except ValueError:
                pass
        return stored_chunks(parse_chunks(text))

    return pipeline_chunks

