"""The time-chunked wavefront pipeline over the stacked LSTM layers: it runs the schedule
of ``schedule.py`` (cells, clock cycles, dependencies, time chunks) on the devices.

Each schedule cell (layer l, chunk k) runs one fused ``nn.LSTM`` call
(``lstm_stack.run_layer``) on its layer's device, starting from the state that cell
(l, k-1) left, on the output of cell (l-1, k). Each clock cycle's cells run on their
devices' workers, so device l computes chunk k while device l+1 computes chunk k-1;
tensors are copied only where a cell's input lives on another device. With one chunk and
one device this is the plain model.

Two layers on two devices, three source chunks E0-E2 and three target chunks D0-D2:

    cycle      0    1    2    3    4    5    6
    layer 0   E0   E1   E2   D0   D1   D2          (device 0)
    layer 1        E0   E1   E2   D0   D1   D2     (device 1)

Backward runs the same cycles in reverse order, each cell's ``backward`` on its device's
worker (``input_cell`` and ``state_cell`` say what a cell depends on; its gradients flow
back along the same edges). The pipeline is one autograd node (``_StagedPipeline``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..model.dropout import Mask, apply_mask, resolve
from ..model.lstm_stack import LSTMStack, State, run_layer
from ..model.network import StepDraws
from .interface import HybridModel
from .placement import PlacementPlan
from .schedule import (
    DECODER, ENCODER, Key, ScheduleCell, chunk_bounds, clock_cycles, describe, input_cell, state_cell,
)
from .split import Span
from .transfer import Transfers
from .worker import DeviceWorkers, autograd_device_thread


@dataclass
class PipelineOutput:
    encoder_top: Tensor  # src_len x B x H, on the last encoder layer's device
    encoder_finals: List[State]  # per layer, on that layer's device
    decoder_top: Optional[Tensor]  # tgt_len x B x H on the last decoder layer's device


@dataclass
class BridgeRecord:
    """Decoder chunk 0 with a bridge: the encoder's final state as leaves on device 0 and
    the bridged state computed from them there (a graph of its own, on device 0)."""
    inputs: State
    outputs: State


@dataclass
class CellRecord:
    """What a cell's own backward needs: its detached inputs (leaves on the cell's device,
    whose .grad it fills), its outputs, and its bridge (decoder chunk 0, sizes differ).
    A cell's graph holds only its own leaves and its layer's parameters, all on its
    device: no autograd edge crosses devices, so each cell's backward can run alone."""
    input_leaf: Tensor
    state_leaves: Optional[State]
    output: Tensor
    state: State
    bridge: Optional[BridgeRecord] = None


Masks = Dict[str, List[Mask]]  # side -> each layer's input dropout mask (or None)


def pipeline_inputs(draws: StepDraws) -> Tuple[Tensor, Optional[Tensor], Masks]:
    """A step's draws as the pipeline takes them: the embedded source, the embedded
    decoder input (None with input feeding: the encoder runs alone) and each side's
    between-layer masks."""
    masks: Masks = {ENCODER: draws.encoder.masks}
    target = None
    if draws.decoder is not None:
        target, masks[DECODER] = draws.decoder.target, draws.decoder.masks
    return draws.encoder.source, target, masks


class WavefrontPipeline:
    def __init__(
        self,
        encoder_stack: LSTMStack,
        decoder_stack: LSTMStack,
        bridge: Optional[Callable[[Tensor, Tensor], State]],
        plan: PlacementPlan,
        workers: DeviceWorkers,
        transfers: Optional[Transfers] = None,
    ) -> None:
        self.stacks = {ENCODER: encoder_stack, DECODER: decoder_stack}
        self.num_layers = len(encoder_stack.layers)
        self.bridge = bridge  # on device 0; None when encoder and decoder sizes agree
        self.plan = plan
        self.workers = workers
        self.transfers = transfers or Transfers(plan.devices)

    @classmethod
    def for_model(cls, model: HybridModel, plan: PlacementPlan, workers: DeviceWorkers,
                  transfers: Optional[Transfers] = None) -> "WavefrontPipeline":
        """The pipeline over a ``HybridLSTMModel``'s encoder and decoder stacks."""
        decoder = model.decoder
        return cls(model.encoder.stack, decoder.stack,
                   decoder.bridge if decoder.has_bridge else None, plan, workers, transfers)

    def run(
        self, source: Tensor, source_lengths: Tensor, target: Optional[Tensor],
        masks: Masks, draw_ahead: Optional[Callable[[], Any]] = None,
    ) -> PipelineOutput:
        """source: src_len x B x E embedded (right-padded) source; target: tgt_len x B x E
        embedded decoder input, or None to run the encoder only (input feeding); masks:
        per side, each layer's input dropout mask over the whole sequence
        (``LSTMStack.draw_masks``; queued masks are drawn on this thread before the first
        cycle that needs them). ``draw_ahead``: called on this thread while each forward
        cycle runs (``MaskQueue.draw_next``: the next queued mask, so the masks are
        drawn while the workers compute, not before the pipeline starts). Returns the top
        outputs and the encoder's finals."""
        spans = {
            ENCODER: chunk_bounds(source.size(0), self.plan.chunks),
            DECODER: [] if target is None else chunk_bounds(target.size(0), self.plan.chunks),
        }
        results = _StagedPipeline.apply(
            self, torch.is_grad_enabled(), source_lengths.cpu(), spans,
            masks, draw_ahead, source, source.new_zeros(0) if target is None else target,
        )
        encoder_top, decoder_top = results[0], results[1]
        hiddens = results[2 : 2 + self.num_layers]
        cells = results[2 + self.num_layers :]
        return PipelineOutput(
            encoder_top, list(zip(hiddens, cells)), None if target is None else decoder_top
        )

    def collect(
        self, outputs: Dict[Key, Tensor], states: Dict[Key, State],
        spans: Dict[str, Sequence[Span]], has_target: bool,
    ) -> PipelineOutput:
        top = self.num_layers - 1
        last_source_chunk = len(spans[ENCODER]) - 1
        return PipelineOutput(
            encoder_top=torch.cat(
                [outputs[(ENCODER, top, k)] for k in range(len(spans[ENCODER]))], dim=0
            ),
            encoder_finals=[
                states[(ENCODER, layer, last_source_chunk)] for layer in range(self.num_layers)
            ],
            decoder_top=torch.cat(
                [outputs[(DECODER, top, k)] for k in range(len(spans[DECODER]))], dim=0
            ) if has_target else None,
        )

    def forward_cells(
        self,
        source: Tensor,
        lengths: Tensor,
        target: Optional[Tensor],
        spans: Dict[str, Sequence[Span]],
        masks: Masks,
        draw_ahead: Optional[Callable[[], Any]] = None,
    ) -> Tuple[Dict[Key, Tensor], Dict[Key, State], Dict[Key, CellRecord]]:
        """Run every cell in clock-cycle order, each on its layer's worker. Each cell starts
        from detached copies of its inputs (leaves), so its backward can run on its own.
        A cycle's masks are drawn (if queued) on this thread before it is handed out."""
        inputs = {ENCODER: source, DECODER: target}
        masks = {side: list(side_masks) for side, side_masks in masks.items()}
        outputs: Dict[Key, Tensor] = {}
        states: Dict[Key, State] = {}
        records: Dict[Key, CellRecord] = {}
        source_chunks = len(spans[ENCODER])

        move, phase = self.transfers, "pipeline_forward"
        layer_device = self.plan.layer_device

        def cell_task(cell: ScheduleCell) -> Callable[[], CellRecord]:
            stack = self.stacks[cell.side]
            here = layer_device[cell.layer]
            start, end = spans[cell.side][cell.chunk]

            def run() -> CellRecord:
                below = input_cell(cell)
                if below is None:  # the embeddings, on device 0
                    input_leaf = move.leaf(inputs[cell.side][start:end], 0, here, phase)
                else:
                    input_leaf = move.leaf(outputs[below], layer_device[below[1]], here, phase)
                mask = masks[cell.side][cell.layer]
                x = apply_mask(input_leaf, None if mask is None else mask[start:end])
                state_leaves, bridge = None, None
                before = state_cell(cell, source_chunks)
                if before is not None:
                    previous, there = states[before], layer_device[before[1]]
                    if cell.side == DECODER and cell.chunk == 0 and self.bridge is not None:
                        bridge_inputs = (move.leaf(previous[0], there, 0, phase),
                                         move.leaf(previous[1], there, 0, phase))
                        bridge = BridgeRecord(bridge_inputs, self.bridge(*bridge_inputs))
                        previous, there = bridge.outputs, 0
                    state_leaves = (move.leaf(previous[0], there, here, phase),
                                    move.leaf(previous[1], there, here, phase))
                steps = None
                if cell.side == ENCODER:
                    steps = (lengths - start).clamp(min=0, max=end - start)
                out, final = run_layer(stack.layers[cell.layer], x, steps, state_leaves)
                return CellRecord(input_leaf, state_leaves, out, final, bridge)

            return run

        for cycle in clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), self.num_layers):
            for cell in cycle:
                masks[cell.side][cell.layer] = resolve(masks[cell.side][cell.layer])
            results = self.workers.run_all(
                [
                    (self.plan.layer_device[cell.layer], describe(cell), cell_task(cell))
                    for cell in cycle
                ],
                while_waiting=draw_ahead,
            )
            for cell, record in zip(cycle, results):
                key = (cell.side, cell.layer, cell.chunk)
                outputs[key], states[key], records[key] = record.output, record.state, record
        return outputs, states, records

    def backward_cells(
        self,
        records: Dict[Key, CellRecord],
        spans: Dict[str, Sequence[Span]],
        top_grads: Dict[str, Optional[Tensor]],
        final_grads: Sequence[Tuple[Optional[Tensor], Optional[Tensor]]],
        inline_device: Optional[torch.device] = None,
    ) -> Dict[str, List[Optional[Tensor]]]:
        """Each cell's backward on its own worker, in reverse clock order (and a decoder
        layer's bridge on device 0's worker right after its chunk 0); fills the
        parameters' ``.grad`` and returns, per side, each chunk's input gradient (layer
        0's input: the embeddings). ``final_grads``: gradients that reached the encoder's
        final states from outside (input feeding uses them). ``inline_device``: see
        ``worker.autograd_device_thread``."""
        output_grads: Dict[Key, Optional[Tensor]] = {}
        state_grads: Dict[Key, Tuple[Optional[Tensor], Optional[Tensor]]] = {}
        input_grads: Dict[str, List[Optional[Tensor]]] = {
            side: [None] * len(spans[side]) for side in (ENCODER, DECODER)
        }
        source_chunks = len(spans[ENCODER])
        for layer, grads in enumerate(final_grads):
            state_grads[(ENCODER, layer, source_chunks - 1)] = grads
        top = self.num_layers - 1
        for side, grad in top_grads.items():
            for chunk, (start, end) in enumerate(spans[side]):
                output_grads[(side, top, chunk)] = None if grad is None else grad[start:end]

        layer_device = self.plan.layer_device
        move, phase = self.transfers, "pipeline_backward"

        def to_cell(grad: Optional[Tensor], source: int, destination: int) -> Optional[Tensor]:
            return None if grad is None else move.to(grad, source, destination, phase)

        def backward_task(key: Key) -> Callable[[], None]:
            record = records[key]
            side, layer, chunk = key
            here = layer_device[layer]
            above = layer_device[min(layer + 1, top)]  # dH of layer l comes from layer l+1's leaf
            # the encoder's last state gets its gradient through the bridge on device 0
            bridged = (side == ENCODER and chunk == source_chunks - 1 and self.bridge is not None
                       and bool(spans[DECODER]))
            state_source = 0 if bridged else here

            def run() -> None:
                state_grad = state_grads.get(key, (None, None))
                backward_from(
                    (record.output, record.state[0], record.state[1]),
                    (to_cell(output_grads.get(key), above, here),
                     to_cell(state_grad[0], state_source, here),
                     to_cell(state_grad[1], state_source, here)),
                )

            return run

        def bridge_task(bridge: BridgeRecord, grads: State, layer: int) -> Callable[[], State]:
            def run() -> State:
                backward_from(bridge.outputs, [to_cell(g, layer_device[layer], 0) for g in grads])
                return bridge.inputs[0].grad, bridge.inputs[1].grad
            return run

        cycles = clock_cycles(source_chunks, len(spans[DECODER]), self.num_layers)
        for cycle in reversed(cycles):
            self.workers.run_all(
                [
                    (self.plan.layer_device[cell.layer], "backward of " + describe(cell),
                     backward_task(cell.key))
                    for cell in cycle
                ],
                inline_device,
            )
            bridged: List[Tuple[Key, Callable[[], State]]] = []
            for cell in cycle:
                record = records[cell.key]
                below = input_cell(cell)
                if below is None:
                    input_grads[cell.side][cell.chunk] = record.input_leaf.grad
                else:
                    output_grads[below] = record.input_leaf.grad
                previous = state_cell(cell, source_chunks)
                if previous is None:
                    continue
                grads = (record.state_leaves[0].grad, record.state_leaves[1].grad)
                if record.bridge is not None:
                    bridged.append((previous, bridge_task(record.bridge, grads, cell.layer)))
                else:
                    add_state_grads(state_grads, previous, grads)
            if bridged:
                results = self.workers.run_all(
                    [(0, f"backward of the bridge into decoder layer {key[1]}", task)
                     for key, task in bridged],
                    inline_device,
                )
                for (previous, _), grads in zip(bridged, results):
                    add_state_grads(state_grads, previous, grads)
        return input_grads


def backward_from(tensors: Sequence[Tensor], grads: Sequence[Optional[Tensor]]) -> None:
    """``torch.autograd.backward`` over the pairs that have a gradient (moved to their
    tensor's device) and a graph."""
    pairs = [(t, g.to(t.device)) for t, g in zip(tensors, grads)
             if g is not None and t.requires_grad]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def add_state_grads(
    state_grads: Dict[Key, Tuple[Optional[Tensor], Optional[Tensor]]], key: Key,
    grads: Tuple[Optional[Tensor], Optional[Tensor]],
) -> None:
    before = state_grads.get(key, (None, None))
    state_grads[key] = (add_grads(before[0], grads[0]), add_grads(before[1], grads[1]))


def add_grads(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    return b if a is None else a if b is None else a + b.to(a.device)


class _StagedPipeline(torch.autograd.Function):
    """The whole pipeline as one autograd node whose backward is the pipeline's own
    reverse-clock-order schedule of per-cell backward calls on the device workers (CPU
    autograd would run one ``.backward()`` on a single thread; on GPUs each worker's call
    only waits for its kernels to be queued). ``grad_enabled``: the caller's grad mode
    (without grad, as in validation, the cells record no graph)."""

    @staticmethod
    def forward(ctx, pipeline: WavefrontPipeline, grad_enabled: bool, lengths: Tensor, spans,
                masks: Masks, draw_ahead: Optional[Callable[[], Any]], source: Tensor,
                target: Tensor):
        ctx.set_materialize_grads(False)  # unused outputs get None, not zeros
        has_target = target.numel() > 0
        with torch.set_grad_enabled(grad_enabled):
            outputs, states, records = pipeline.forward_cells(
                source, lengths, target if has_target else None, spans, masks, draw_ahead,
            )
        result = pipeline.collect(outputs, states, spans, has_target)
        ctx.pipeline, ctx.records, ctx.spans = pipeline, records, spans
        ctx.like = (source, target)
        finals = [t.detach() for pair in result.encoder_finals for t in pair]
        hiddens, cells = finals[0::2], finals[1::2]
        decoder_top = result.decoder_top.detach() if has_target else target.new_zeros(0)
        return (result.encoder_top.detach(), decoder_top, *hiddens, *cells)

    @staticmethod
    def backward(ctx, encoder_top_grad, decoder_top_grad, *final_grads):
        layers = len(final_grads) // 2
        input_grads = ctx.pipeline.backward_cells(
            ctx.records, ctx.spans,
            {ENCODER: encoder_top_grad, DECODER: decoder_top_grad if ctx.spans[DECODER] else None},
            list(zip(final_grads[:layers], final_grads[layers:])),
            autograd_device_thread([encoder_top_grad, decoder_top_grad, *final_grads]),
        )
        ctx.records = None  # free the cells' graphs
        source, target = ctx.like
        return (None, None, None, None, None, None,
                join_chunks(input_grads[ENCODER], ctx.spans[ENCODER], source),
                join_chunks(input_grads[DECODER], ctx.spans[DECODER], target))


def join_chunks(grads: Sequence[Optional[Tensor]], spans: Sequence[Span], like: Tensor) -> Optional[Tensor]:
    """The chunks' input gradients as one tensor shaped and placed like ``like`` (None if
    no chunk has one)."""
    if all(g is None for g in grads):
        return None
    joined = torch.zeros_like(like)
    for grad, (start, end) in zip(grads, spans):
        if grad is not None:
            joined[start:end] = grad.to(like.device)
    return joined
