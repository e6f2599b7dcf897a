"""The placement plan: which device runs each encoder and decoder layer, where the
embeddings and the master copy of the head live, and where head replicas run.

Parsed from ``--hybrid-devices``, ``--hybrid-balance`` and ``--pipeline-chunks`` and
validated before any work; logged once as a table. The plan is never saved: parameter
names and shapes do not depend on it, so a checkpoint loads on any number of devices.

Layout (the paper's, for 4 GPUs and 4+4 layers): encoder layer i and decoder layer i on
device i; embeddings, bridges and the master head on device 0; a head replica per device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import HybridConfigError

DEVICES_OPTION = "--hybrid-devices"
REPEAT_OPTION = "--hybrid-allow-repeated-devices"
BALANCE_OPTION = "--hybrid-balance"
CHUNKS_OPTION = "--pipeline-chunks"
AUTO = "auto"  # --pipeline-chunks auto: chosen by the performance model (auto_chunks.py)


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


def parse_balance(spec: Optional[str], num_devices: int, num_layers: int) -> List[int]:
    """Layers per device: explicit (``2,1,1``) or contiguous and as even as possible."""
    if spec is None or not spec.strip():
        base, extra = divmod(num_layers, num_devices)
        return [base + (1 if i < extra else 0) for i in range(num_devices)]
    try:
        counts = [int(item) for item in spec.split(",")]
    except ValueError:
        raise HybridConfigError(
            f"{BALANCE_OPTION} {spec!r} is not a comma-separated list of integers"
        ) from None
    if len(counts) != num_devices or sum(counts) != num_layers or min(counts) < 1:
        raise HybridConfigError(
            f"{BALANCE_OPTION} {spec!r} is not allowed: give {num_devices} integers >= 1 "
            f"(one per device) that sum to the {num_layers} layers"
        )
    return counts


@dataclass(frozen=True)
class PlacementPlan:
    devices: Tuple[torch.device, ...]
    layer_device: Tuple[int, ...]  # device index (into ``devices``) of layer l, enc and dec
    chunks: int
    split_head: bool = True  # False: the head runs on device 0 for every sentence
    # --pipeline-chunks auto on several devices: ``chunks`` is provisional until the engine
    # has measured the first batch (``auto_chunks``) and set ``chunk_choice``
    auto_chunks: bool = False
    chunk_choice: Optional[Any] = field(default=None, compare=False)  # perfmodel.chunk_choice.ChunkChoice

    @property
    def head_devices(self) -> int:
        """How many devices the head's sentences are split over."""
        return self.num_devices if self.split_head else 1

    @property
    def master(self) -> torch.device:
        """Where embeddings, bridges and the master head live (device 0)."""
        return self.devices[0]

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def is_single_device(self) -> bool:
        return self.num_devices == 1

    def device_of_layer(self, layer: int) -> torch.device:
        return self.devices[self.layer_device[layer]]

    def table(self) -> str:
        chunks = f"{self.chunks} pipeline chunk(s)"
        if self.auto_chunks:
            chunks = ("pipeline chunks: auto (measured before the first update)"
                      if self.chunk_choice is None else chunks + " (auto)")
        lines = [
            f"hybrid placement: {self.num_devices} device(s), {chunks}",
            f"  {'#':>2}  {'device':<8} {'encoder layers':<15} {'decoder layers':<15} other",
        ]
        for index, device in enumerate(self.devices):
            layers = [layer for layer, d in enumerate(self.layer_device) if d == index]
            names = ",".join(str(layer) for layer in layers) or "-"
            other = ["head replica"] if self.split_head else []
            if index == 0:
                head = "master head" if self.split_head else "head (all sentences)"
                other = ["embeddings", "bridges", head]
            lines.append(
                f"  {index:>2}  {str(device):<8} {names:<15} {names:<15} {', '.join(other) or '-'}"
            )
        if self.chunk_choice is not None:
            lines += ["  " + line for line in self.chunk_choice.lines()]
        return "\n".join(lines)


def default_chunks(num_devices: int) -> int:
    """1 on one device (chunking only adds work there); else 2 per device, which keeps
    the wavefront's fill-and-drain idle time at most (N-1)/(5N-1) < 20% of the cycles
    while each (layer, chunk) call stays long enough to keep a device busy. With several
    devices this is only the provisional K of ``--pipeline-chunks auto`` (the engine
    replaces it with the measured choice before the first update)."""
    return 1 if num_devices == 1 else 2 * num_devices


def build_plan(
    devices_spec: Optional[str],
    balance_spec: Optional[str],
    chunks: Union[None, int, str],
    encoder_layers: int,
    decoder_layers: int,
    split_head: bool = True,
    allow_repeated: bool = False,
) -> PlacementPlan:
    devices = parse_devices(devices_spec, allow_repeated)
    num_layers = min(encoder_layers, decoder_layers)
    if len(devices) > num_layers:
        raise HybridConfigError(
            f"{DEVICES_OPTION} {devices_spec!r} lists {len(devices)} devices for "
            f"{encoder_layers} encoder / {decoder_layers} decoder layers: every device needs "
            f"a layer, so use at most {num_layers}"
        )
    # unset (None, or 0: fairseq's default for its --pipeline-chunks) or "auto": 1 on one
    # device (chunking only adds work there), else chosen by the model on the first batch
    auto = chunks is None or chunks == 0 or chunks == AUTO
    if auto:
        chunks = default_chunks(len(devices))
    if not isinstance(chunks, int) or chunks < 1:
        raise HybridConfigError(
            f"{CHUNKS_OPTION} {chunks!r} is not allowed: an integer >= 1 (1 = no time chunking) "
            f"or {AUTO}"
        )
    counts = parse_balance(balance_spec, len(devices), num_layers)
    layer_device = tuple(index for index, count in enumerate(counts) for _ in range(count))
    return PlacementPlan(tuple(devices), layer_device, chunks, split_head,
                         auto_chunks=auto and len(devices) > 1)


def check_plan_options(cfg, argv: Optional[Sequence[str]] = None) -> PlacementPlan:
    """Parse-time check of the placement options (nothing is placed)."""
    from ..plugin.config import effective
    from ..plugin.integration import explicit_option

    # --pipeline-chunks is fairseq's own option; its default, 0, means "not set" to us,
    # so only the command line tells an explicit 0 apart
    given = explicit_option(CHUNKS_OPTION, argv)
    if given is not None and given.strip() in ("0", "-0"):
        raise HybridConfigError(
            f"{CHUNKS_OPTION} {given.strip()} is not allowed: an integer >= 1 "
            "(1 = no time chunking; leave it out for the default)"
        )
    return build_plan(
        getattr(cfg, "hybrid_devices", None),
        getattr(cfg, "hybrid_balance", None),
        getattr(cfg, "pipeline_chunks", None),
        effective(cfg, "encoder_layers"),
        effective(cfg, "decoder_layers"),
        allow_repeated=bool(getattr(cfg, "hybrid_allow_repeated_devices", False)),
    )


def shard_bounds(batch_size: int, num_shards: int) -> Sequence[Tuple[int, int]]:
    """Contiguous sentence ranges, one per device; uneven and empty shards allowed."""
    base, extra = divmod(batch_size, num_shards)
    bounds, start = [], 0
    for index in range(num_shards):
        size = base + (1 if index < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds
