"""The bytes one training step moves between devices, per (source index, destination
index, phase) — the routes ``parallel/transfer.py``'s ledger records — for a plan and the
step's shapes, without running it (``step_traffic``), as the engine schedules it (each head
shard's slices of H and S straight from the top layers' device and their gradients
straight back; targets and masks from device 0; the head's parameters broadcast from the
master head's device — the top layers' — to each replica and the replicas' gradients
summed back there; the bridge on device 0).
``tests/test_traffic.py`` holds this, route by route, to the ledger of real steps on 2 and
4 CPU devices and K = 1..4; the simulator charges these bytes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..parallel.placement import shard_bounds
from ..parallel.transfer import Route

INDEX_BYTES = 8  # int64 targets
MASK_BYTES = 1  # bool padding masks


@dataclass(frozen=True)
class StepShapes:
    """What decides the bytes: the batch, the layer widths, the head, the element sizes."""

    sentences: int
    source_len: int
    target_len: int
    encoder_hidden: int
    decoder_hidden: int
    combined_dim: int  # --decoder-out-embed-dim: the combine layer's output
    head_param_bytes: int  # the head's parameters (W_a, W_c, W_o, b_o), at their precision
    activation_bytes: int = 4  # element size of H, S, states and their gradients
    loss_bytes: int = 4  # element size of the shard losses
    combine_dropout: bool = True  # a combine mask is drawn (training, dropout > 0)
    count_correct: bool = False  # --report-accuracy adds one int64 per shard
    bridge: bool = False  # encoder and decoder hidden sizes differ
    # selected target tokens of each sentence (default: all target_len, no padding)
    tokens_per_sentence: Optional[Tuple[int, ...]] = None

    def tokens(self) -> List[int]:
        return list(self.tokens_per_sentence or (self.target_len,) * self.sentences)


def step_traffic(layer_device: Sequence[int], num_devices: int, shapes: StepShapes,
                 split_head: bool = True) -> Dict[Route, int]:
    """Bytes per route of one training step as the engine runs it (no input feeding: the
    master head with the top layers, as the plan puts it)."""
    routes: Dict[Route, int] = defaultdict(int)

    def add(source: int, destination: int, phase: str, nbytes: int) -> None:
        if source != destination and nbytes:
            routes[(source, destination, phase)] += nbytes

    s = shapes
    act = s.activation_bytes
    sides = ((s.source_len, s.encoder_hidden), (s.target_len, s.decoder_hidden))
    # the wavefront: each layer's output to the next layer's device, gradients back
    for layer in range(1, len(layer_device)):
        below, here = layer_device[layer - 1], layer_device[layer]
        for length, hidden in sides:
            add(below, here, "pipeline_forward", length * s.sentences * hidden * act)
            add(here, below, "pipeline_backward", length * s.sentences * hidden * act)
    if s.bridge:  # (h, c) of each encoder layer to device 0, the bridged state back
        for here in layer_device:
            encoder_state = 2 * s.sentences * s.encoder_hidden * act
            decoder_state = 2 * s.sentences * s.decoder_hidden * act
            add(here, 0, "pipeline_forward", encoder_state)
            add(0, here, "pipeline_forward", decoder_state)
            add(here, 0, "pipeline_backward", decoder_state)
            add(0, here, "pipeline_backward", encoder_state)
    top = root = layer_device[-1]  # the top layers' device, and the master head's
    h_row = s.target_len * s.decoder_hidden * act  # one sentence of H
    s_row = s.source_len * s.encoder_hidden * act  # one sentence of S
    if not split_head or num_devices == 1:  # H and S gathered on the head's device
        add(top, root, "head_forward", s.sentences * (h_row + s_row))
        add(root, top, "head_backward", s.sentences * (h_row + s_row))
        add(0, root, "head_forward", s.sentences * (s.source_len * MASK_BYTES
                                                    + s.target_len * INDEX_BYTES))
        return dict(routes)
    tokens = s.tokens()
    for worker, (start, end) in enumerate(shard_bounds(s.sentences, num_devices)):
        rows = end - start
        if rows == 0:
            continue
        selected = sum(tokens[start:end])
        # H and S slices straight from the top layers' device, their gradients straight back
        add(top, worker, "head_forward", rows * (h_row + s_row))
        add(worker, top, "head_backward", rows * (h_row + s_row))
        sent = rows * (s.source_len * MASK_BYTES + s.target_len * INDEX_BYTES)
        if s.combine_dropout:
            sent += selected * s.combined_dim * act
        results = (2 * s.loss_bytes + (INDEX_BYTES if s.count_correct else 0))
        add(0, worker, "head_forward", sent)
        add(worker, 0, "head_forward", results)
        add(root, worker, "head_params", s.head_param_bytes)
        add(0, worker, "head_backward", s.loss_bytes)  # the loss gradient
        add(worker, root, "head_backward", s.head_param_bytes)
    return dict(routes)
