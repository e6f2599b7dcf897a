"""The placement plan: which device runs each encoder and decoder layer, where the
embeddings and the master copy of the head live, and where head replicas run.

Parsed from ``--hybrid-devices``, ``--hybrid-balance`` and ``--pipeline-chunks`` and
validated before any work; logged once as a table. The plan is never saved: parameter
names and shapes do not depend on it, so a checkpoint loads on any number of devices.

Layout (the paper's, for 4 GPUs and 4+4 layers): encoder layer i and decoder layer i on
device i; embeddings and bridges on device 0, the master head with the top layers; a head
replica on every other device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal, Optional, Tuple, Union

import torch

from ..errors import HybridConfigError
from .interface import HybridModel
from .split import even_sizes, spans

DEVICES_OPTION = "--hybrid-devices"
REPEAT_OPTION = "--hybrid-allow-repeated-devices"
BALANCE_OPTION = "--hybrid-balance"
CHUNKS_OPTION = "--pipeline-chunks"
AUTO = "auto"  # --pipeline-chunks auto: chosen by the performance model (chunking/auto_chunks.py)
ChunkSetting = Union[int, Literal["auto"]]  # --pipeline-chunks, parsed once (parse_chunks)


def default_device() -> torch.device:
    """This process's GPU (fairseq sets it per process), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def parse_device(item: str, spec: str) -> torch.device:
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
        if index >= available:
            allowed = (
                f"use indices below {available}" if available
                else "use cpu devices (e.g. cpu,cpu)"
            )
            raise HybridConfigError(
                f"{DEVICES_OPTION} {spec!r}: {text} is not available (this machine has "
                f"{available} CUDA device{'s' if available != 1 else ''}; {allowed})"
            )
        return torch.device("cuda", index)
    raise HybridConfigError(
        f"{DEVICES_OPTION} {spec!r}: unknown device {item.strip()!r}: use a comma-separated "
        "list of cuda:N, GPU indices N, or cpu (e.g. cuda:0,cuda:1 or 0,1 or cpu,cpu)"
    )


def parse_devices(spec: Optional[str], allow_repeated: bool = False) -> List[torch.device]:
    """The devices of ``spec``; a GPU may be listed twice only with ``allow_repeated`` (two
    workers sharing one GPU: how one GPU runs the multi-device code for checks)."""
    if spec is None:
        return [default_device()]
    items = spec.split(",")
    if not spec.strip() or any(not item.strip() for item in items):
        raise HybridConfigError(
            f"{DEVICES_OPTION} {spec!r} has an empty entry: use a comma-separated list of "
            "cuda:N, GPU indices N, or cpu"
        )
    devices = [parse_device(item, spec) for item in items]
    gpus = [d for d in devices if d.type == "cuda"]
    if len(set(gpus)) != len(gpus) and not allow_repeated:
        repeated = sorted({str(d) for d in gpus if gpus.count(d) > 1})
        raise HybridConfigError(
            f"{DEVICES_OPTION} {spec!r} lists {', '.join(repeated)} more than once: each GPU "
            f"can be given once (cpu may repeat: CPU devices are worker threads; to check "
            f"the multi-device code on one GPU, add {REPEAT_OPTION})"
        )
    return devices


def parse_balance(spec: Optional[str], num_devices: int, num_layers: int,
                  devices_spec: Optional[str] = None) -> List[int]:
    """Layers per device: explicit (``2,1,1``) or contiguous and as even as possible.
    ``devices_spec``: the ``--hybrid-devices`` given (None: the default device), for the
    message."""
    if spec is None or not spec.strip():
        return even_sizes(num_layers, num_devices)
    try:
        counts = [int(item) for item in spec.split(",")]
    except ValueError:
        raise HybridConfigError(
            f"{BALANCE_OPTION} {spec!r} is not a comma-separated list of integers"
        ) from None
    if len(counts) != num_devices:
        devices = (f"{DEVICES_OPTION} {devices_spec!r} has {num_devices}" if devices_spec else
                   f"{DEVICES_OPTION} is not given (one device: {default_device()})")
        raise HybridConfigError(
            f"{BALANCE_OPTION} {spec!r} gives layer counts for {len(counts)} device(s), but {devices}: "
            f"give one count per device of {DEVICES_OPTION} (e.g. {DEVICES_OPTION} "
            f"{','.join(['cpu'] * len(counts))}), or leave {BALANCE_OPTION} out"
        )
    if sum(counts) != num_layers or min(counts) < 1:
        raise HybridConfigError(
            f"{BALANCE_OPTION} {spec!r} is not allowed: give {num_devices} integers >= 1 "
            f"(one per device) that sum to the {num_layers} layers"
        )
    return counts


def parse_chunks(value: Union[None, int, str]) -> ChunkSetting:
    """``--pipeline-chunks`` as the one type the rest reads: an integer >= 1, or ``AUTO``.
    Unset (None, or fairseq's own default 0 for this option) is ``AUTO``; an explicit 0
    on the command line is refused before this (``plugin/placement_options.py``)."""
    if value is None or value == 0:
        return AUTO
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HybridConfigError(
            f"{CHUNKS_OPTION} {value!r} is not allowed: an integer >= 1 (1 = no time chunking) "
            f"or {AUTO}"
        )
    return value


@dataclass(frozen=True)
class PlacementOptions:
    """The placement options of a run, each parsed into its type."""

    devices: Optional[str] = None  # --hybrid-devices (None: the default device)
    balance: Optional[str] = None  # --hybrid-balance (None: as even as possible)
    chunks: ChunkSetting = AUTO  # --pipeline-chunks
    split_head: bool = True  # False: --hybrid-head-on-master
    allow_repeated: bool = False  # --hybrid-allow-repeated-devices

    @classmethod
    def from_config(cls, cfg: object) -> "PlacementOptions":
        """From a model config or argparse namespace with the options' attribute names."""
        return cls(
            getattr(cfg, "hybrid_devices", None),
            getattr(cfg, "hybrid_balance", None),
            parse_chunks(getattr(cfg, "pipeline_chunks", None)),
            not getattr(cfg, "hybrid_head_on_master", False),
            bool(getattr(cfg, "hybrid_allow_repeated_devices", False)),
        )


@dataclass(frozen=True)
class PlacementPlan:
    devices: Tuple[torch.device, ...]
    layer_device: Tuple[int, ...]  # device index (into ``devices``) of layer l, enc and dec
    chunks: int
    split_head: bool = True  # False: the head runs on its master's device for every sentence
    head_device: int = 0  # index of the device holding the master head

    @property
    def head_devices(self) -> int:
        """How many devices the head's sentences are split over."""
        return self.num_devices if self.split_head else 1

    @property
    def master(self) -> torch.device:
        """Where embeddings and bridges live (device 0)."""
        return self.devices[0]

    @property
    def head_master(self) -> torch.device:
        """Where the master head lives: the top layers' device (``build_plan``)."""
        return self.devices[self.head_device]

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def is_single_device(self) -> bool:
        return self.num_devices == 1

    def device_of_layer(self, layer: int) -> torch.device:
        return self.devices[self.layer_device[layer]]

    def table(self, chunks_note: str = "") -> str:
        lines = [
            f"hybrid placement: {self.num_devices} device(s), {self.chunks} pipeline "
            f"chunk(s){chunks_note}",
            f"  {'#':>2}  {'device':<8} {'encoder layers':<15} {'decoder layers':<15} other",
        ]
        for index, device in enumerate(self.devices):
            layers = [layer for layer, d in enumerate(self.layer_device) if d == index]
            names = ",".join(str(layer) for layer in layers) or "-"
            other = ["embeddings", "bridges"] if index == 0 else []
            if index == self.head_device:
                other.append("master head" if self.split_head else "head (all sentences)")
            elif self.split_head:
                other.append("head replica")
            lines.append(
                f"  {index:>2}  {str(device):<8} {names:<15} {names:<15} {', '.join(other) or '-'}"
            )
        return "\n".join(lines)


def build_plan(
    devices_spec: Optional[str],
    balance_spec: Optional[str],
    chunks: int,
    encoder_layers: int,
    decoder_layers: int,
    split_head: bool = True,
    allow_repeated: bool = False,
    head_with_top_layers: bool = True,
) -> PlacementPlan:
    """The plan for these options with ``chunks`` time chunks (``--pipeline-chunks auto``
    is resolved before this, by whoever owns the performance model: ``runtime.py``).

    The master head goes with the top layers (``head_with_top_layers``), where H and S
    are made, rather than onto device 0, which the embeddings already load with the
    largest share of the optimizer step; with input feeding it stays on device 0, where
    the step-by-step decoder attends."""
    devices = parse_devices(devices_spec, allow_repeated)
    num_layers = min(encoder_layers, decoder_layers)
    if len(devices) > num_layers:
        raise HybridConfigError(
            f"{DEVICES_OPTION} {devices_spec!r} lists {len(devices)} devices for "
            f"{encoder_layers} encoder / {decoder_layers} decoder layers: every device needs "
            f"a layer, so use at most {num_layers}"
        )
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise HybridConfigError(
            f"{CHUNKS_OPTION} {chunks!r} is not allowed: an integer >= 1 (1 = no time chunking) "
            f"or {AUTO}"
        )
    counts = parse_balance(balance_spec, len(devices), num_layers, devices_spec)
    layer_device = tuple(index for index, count in enumerate(counts) for _ in range(count))
    head_device = layer_device[-1] if head_with_top_layers else 0
    return PlacementPlan(tuple(devices), layer_device, chunks, split_head, head_device)


def plan_for(options: PlacementOptions, encoder_layers: int, decoder_layers: int,
             chunks: Optional[int] = None, head_with_top_layers: bool = True) -> PlacementPlan:
    """``build_plan`` from parsed options; ``chunks`` overrides them (auto's choice; until
    then an automatic setting plans 1 chunk)."""
    if chunks is None:
        chunks = 1 if options.chunks == AUTO else options.chunks
    return build_plan(options.devices, options.balance, chunks, encoder_layers,
                      decoder_layers, options.split_head, options.allow_repeated,
                      head_with_top_layers)


def chunks_to_choose(options: PlacementOptions, plan: PlacementPlan) -> bool:
    """Whether the performance model must choose the chunk count before the first update:
    ``auto`` on several devices (one device runs unchunked, chunking only adds work)."""
    return options.chunks == AUTO and plan.num_devices > 1


def place(model: HybridModel, plan: PlacementPlan) -> None:
    """Put each LSTM layer on its device; embeddings and bridges on device 0, the master
    head where the plan says. Parameter names and shapes do not change (checkpoints stay
    portable)."""
    encoder, decoder, master = model.encoder, model.decoder, plan.master
    for module in (encoder.embed_tokens, decoder.embed_tokens):
        module.to(master)
    decoder.head.to(plan.head_master)
    if decoder.bridge_hidden is not None:
        decoder.bridge_hidden.to(master)
        decoder.bridge_cell.to(master)
    for stack in (encoder.stack, decoder.stack):
        for index, layer in enumerate(stack.layers):
            layer.to(plan.device_of_layer(index))


def shard_bounds(batch_size: int, num_shards: int) -> List[Tuple[int, int]]:
    """Contiguous sentence ranges, one per device; uneven and empty shards allowed."""
    return spans(even_sizes(batch_size, num_shards))
