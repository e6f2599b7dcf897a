"""The placement plan: which device runs each encoder and decoder layer, where the
embeddings and the master copy of the head live, and where head replicas run.

Built from typed values (devices, layers per device, a chunk count): the options a user
gives are parsed and checked before they reach this layer (``plugin/placement_options.py``);
what is refused here is a caller's mistake, not bad input. The plan is never saved:
parameter names and shapes do not depend on it, so a checkpoint loads on any number of
devices.

Layout (the paper's, for 4 GPUs and 4+4 layers): encoder layer i and decoder layer i on
device i; embeddings and bridges on device 0, the master head with the top layers; a head
replica on every other device.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Literal, Optional, Protocol, Sequence, Tuple, Union

import torch

from .interface import HybridModel
from .split import even_sizes, spans


class Auto(enum.Enum):
    """The chunk count left to the chooser (``runtime.HybridRuntime``): 1 on one device,
    else measured on the first batch and chosen by the performance model."""

    AUTO = "auto"

    def __repr__(self) -> str:
        return "AUTO"


AUTO = Auto.AUTO
Chunks = Union[int, Literal[Auto.AUTO]]  # an integer >= 1, or AUTO
Devices = Tuple[torch.device, ...]


class Placement(Protocol):
    """The typed placement options a runtime plans from
    (``plugin.placement_options.PlacementOptions`` is the one the plugin parses)."""

    @property
    def devices(self) -> Optional[Devices]: ...  # None: this process's device

    @property
    def balance(self) -> Optional[Tuple[int, ...]]: ...  # None: as even as possible

    @property
    def chunks(self) -> Chunks: ...

    @property
    def split_head(self) -> bool: ...  # False: the head on its master's device only


def default_device() -> torch.device:
    """This process's GPU (fairseq sets it per process), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def devices_of(devices: Optional[Sequence[torch.device]]) -> Devices:
    """The devices a plan uses: ``devices``, or this process's device for None."""
    return (default_device(),) if devices is None else tuple(devices)


def resolved_chunks(placement: Placement) -> Optional[int]:
    """The chunk count to plan with, before anything is measured: the one given; for AUTO 1
    on one device (chunking only adds work there) and None on several (the chooser
    decides on the first batch)."""
    if placement.chunks is not AUTO:
        return placement.chunks
    return 1 if len(devices_of(placement.devices)) == 1 else None


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
    devices: Optional[Sequence[torch.device]],
    balance: Optional[Sequence[int]],
    chunks: int,
    encoder_layers: int,
    decoder_layers: int,
    split_head: bool = True,
    head_with_top_layers: bool = True,
) -> PlacementPlan:
    """The plan for ``devices`` (None: this process's device) with ``balance`` layers per
    device (None: contiguous and as even as possible) and ``chunks`` time chunks.

    The master head goes with the top layers (``head_with_top_layers``), where H and S
    are made, rather than onto device 0, which the embeddings already load with the
    largest share of the optimizer step; with input feeding it stays on device 0, where
    the step-by-step decoder attends."""
    placed = devices_of(devices)
    if not all(isinstance(device, torch.device) for device in placed):
        raise TypeError(f"devices must be torch.device values, not {placed!r}")
    num_layers = min(encoder_layers, decoder_layers)
    counts = even_sizes(num_layers, len(placed)) if balance is None else list(balance)
    if len(counts) != len(placed) or sum(counts) != num_layers or min(counts) < 1:
        raise ValueError(f"{len(placed)} device(s) with layers per device {counts} for "
                         f"{num_layers} layers: every device needs a layer and every layer a device")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"a plan needs an integer chunk count >= 1, not {chunks!r}")
    layer_device = tuple(index for index, count in enumerate(counts) for _ in range(count))
    head_device = layer_device[-1] if head_with_top_layers else 0
    return PlacementPlan(placed, layer_device, chunks, split_head, head_device)


def plan_for(placement: Placement, encoder_layers: int, decoder_layers: int, chunks: int,
             head_with_top_layers: bool = True) -> PlacementPlan:
    """``build_plan`` from typed options, with ``chunks`` time chunks (the options' own
    count, or the one chosen for AUTO: ``resolved_chunks``)."""
    return build_plan(placement.devices, placement.balance, chunks, encoder_layers,
                      decoder_layers, placement.split_head, head_with_top_layers)


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
