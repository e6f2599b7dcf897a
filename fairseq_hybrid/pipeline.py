"""The time-chunked wavefront pipeline over the stacked LSTM layers.

The batch is split along time into chunks (encoder and decoder separately). Cell
(layer l, chunk k) runs one fused ``nn.LSTM`` call (``lstm_stack.run_layer``) on its
layer's device, starting from the state that cell (l, k-1) left, on the output of cell
(l-1, k). Work is issued in clock cycles — encoder cell (l, k) in cycle l + k, decoder
cell (l, k) in cycle K_src + l + k — so device l computes chunk k while device l+1
computes chunk k-1; decoder layer l starts from encoder layer l's final state. Each
cycle's cells run on their devices' workers; tensors are copied only where a cell's input
lives on another device. With one chunk and one device this is the plain model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .dropout import apply_mask
from .lstm_stack import LSTMStack, State, run_layer
from .placement import PlacementPlan
from .worker import DeviceWorkers

ENCODER, DECODER = "encoder", "decoder"
Span = Tuple[int, int]


def chunk_bounds(length: int, chunks: int) -> List[Span]:
    """At most ``chunks`` contiguous, non-empty, near-equal time spans covering
    [0, length)."""
    count = min(chunks, length)
    if count == 0:
        return []
    base, extra = divmod(length, count)
    spans, start = [], 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        spans.append((start, end))
        start = end
    return spans


@dataclass(frozen=True)
class Cell:
    """One unit of the wavefront's schedule: layer ``layer`` of the encoder or decoder
    (``side``) over time chunk ``chunk``."""

    side: str
    layer: int
    chunk: int

    @property
    def key(self) -> "Key":
        return (self.side, self.layer, self.chunk)


def input_cell(cell: Cell) -> Optional["Key"]:
    """The cell whose output this cell reads: the layer below on the same chunk (none for
    layer 0, which reads the embeddings)."""
    return None if cell.layer == 0 else (cell.side, cell.layer - 1, cell.chunk)


def state_cell(cell: Cell, source_chunks: int) -> Optional["Key"]:
    """The cell whose final state this cell continues from: its layer's previous chunk;
    for decoder chunk 0, the encoder layer's last chunk (through the bridge); for encoder
    chunk 0, none (zeros). With ``input_cell``, the wavefront's whole dependency rule:
    forward, backward and the performance model all use these two."""
    if cell.chunk > 0:
        return (cell.side, cell.layer, cell.chunk - 1)
    if cell.side == ENCODER:
        return None
    return (ENCODER, cell.layer, source_chunks - 1)


def clock_cycles(source_chunks: int, target_chunks: int, layers: int) -> List[List[Cell]]:
    """The cells of each clock cycle, in order."""
    cycles: Dict[int, List[Cell]] = {}
    for layer in range(layers):
        for chunk in range(source_chunks):
            cycles.setdefault(layer + chunk, []).append(Cell(ENCODER, layer, chunk))
        for chunk in range(target_chunks):
            cycles.setdefault(source_chunks + layer + chunk, []).append(
                Cell(DECODER, layer, chunk)
            )
    return [cycles[c] for c in sorted(cycles)]


@dataclass
class PipelineOutput:
    encoder_top: Tensor  # src_len x B x H, on the last encoder layer's device
    encoder_finals: List[State]  # per layer, on that layer's device
    decoder_top: Optional[Tensor]  # tgt_len x B x H on the last decoder layer's device


@dataclass
class CellRecord:
    """What a cell's own backward needs when the pipeline runs backward stage by stage:
    its detached inputs (leaves whose .grad it fills) and its outputs."""
    input_leaf: Optional[Tensor]
    state_leaves: Optional[State]
    output: Tensor
    state: State


Key = Tuple[str, int, int]
Masks = Dict[str, List[Optional[Tensor]]]  # side -> per-layer dropout mask (or None)


class WavefrontPipeline:
    def __init__(
        self,
        encoder_stack: LSTMStack,
        decoder_stack: LSTMStack,
        bridge: Callable[[Tensor, Tensor], State],
        plan: PlacementPlan,
        workers: DeviceWorkers,
    ) -> None:
        self.stacks = {ENCODER: encoder_stack, DECODER: decoder_stack}
        self.num_layers = len(encoder_stack.layers)
        self.bridge = bridge
        self.plan = plan
        self.workers = workers

    def run(
        self, source: Tensor, source_lengths: Tensor, target: Optional[Tensor],
        masks: Masks,
    ) -> PipelineOutput:
        """source: src_len x B x E embedded (right-padded) source; target: tgt_len x B x E
        embedded decoder input, or None to run the encoder only (input feeding); masks:
        per side, each layer's between-layer dropout mask over the whole sequence
        (``LSTMStack.draw_masks``). Returns the top outputs and the encoder's finals."""
        spans = {
            ENCODER: chunk_bounds(source.size(0), self.plan.chunks),
            DECODER: [] if target is None else chunk_bounds(target.size(0), self.plan.chunks),
        }
        results = _StagedPipeline.apply(
            self, torch.is_grad_enabled(), source_lengths.cpu(), spans, masks, source,
            source.new_zeros(0) if target is None else target,
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
    ) -> Tuple[Dict[Key, Tensor], Dict[Key, State], Dict[Key, CellRecord]]:
        """Run every cell in clock-cycle order, each on its layer's worker. Each cell starts
        from detached copies of its inputs (leaves), so its backward can run on its own."""
        inputs = {ENCODER: source, DECODER: target}
        outputs: Dict[Key, Tensor] = {}
        states: Dict[Key, State] = {}
        records: Dict[Key, CellRecord] = {}

        def leaf(tensor: Tensor) -> Tensor:
            return tensor.detach().requires_grad_(tensor.requires_grad)

        def cell_task(cell: Cell) -> Callable[[], CellRecord]:
            stack = self.stacks[cell.side]
            device = self.plan.device_of_layer(cell.layer)
            start, end = spans[cell.side][cell.chunk]

            def run() -> CellRecord:
                input_leaf = None
                below = input_cell(cell)
                if below is None:
                    x = inputs[cell.side][start:end]
                else:
                    x = input_leaf = leaf(outputs[below])
                mask = masks[cell.side][cell.layer]
                x = apply_mask(x.to(device), None if mask is None else mask[start:end])
                state_leaves = previous = None
                before = state_cell(cell, len(spans[ENCODER]))
                if before is not None:
                    state_leaves = previous = (leaf(states[before][0]), leaf(states[before][1]))
                state = self._initial_state(cell, previous, device)
                steps = None
                if cell.side == ENCODER:
                    steps = (lengths - start).clamp(min=0, max=end - start)
                out, final = run_layer(stack.layers[cell.layer], x, steps, state)
                return CellRecord(input_leaf, state_leaves, out, final)

            return run

        for cycle in clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), self.num_layers):
            results = self.workers.run_all(
                [
                    (self.plan.layer_device[cell.layer], describe(cell), cell_task(cell))
                    for cell in cycle
                ]
            )
            for cell, record in zip(cycle, results):
                key = (cell.side, cell.layer, cell.chunk)
                outputs[key], states[key], records[key] = record.output, record.state, record
        return outputs, states, records

    def _initial_state(
        self, cell: Cell, previous: Optional[State], device: torch.device
    ) -> Optional[State]:
        if previous is None:
            return None  # zeros
        if cell.side == DECODER and cell.chunk == 0:  # bridge encoder -> decoder sizes
            master = self.plan.master
            previous = self.bridge(previous[0].to(master), previous[1].to(master))
        return previous[0].to(device), previous[1].to(device)

    def backward_cells(
        self,
        records: Dict[Key, CellRecord],
        spans: Dict[str, Sequence[Span]],
        top_grads: Dict[str, Optional[Tensor]],
        final_grads: Sequence[Tuple[Optional[Tensor], Optional[Tensor]]],
    ) -> None:
        """Each cell's backward on its own worker, in reverse clock order; fills the
        input leaves' (and the parameters') ``.grad``. ``final_grads``: gradients that
        reached the encoder's final states from outside (input feeding uses them)."""
        output_grads: Dict[Key, Optional[Tensor]] = {}
        state_grads: Dict[Key, Tuple[Optional[Tensor], Optional[Tensor]]] = {}
        last_source_chunk = len(spans[ENCODER]) - 1
        for layer, grads in enumerate(final_grads):
            state_grads[(ENCODER, layer, last_source_chunk)] = grads
        top = self.num_layers - 1
        for side, grad in top_grads.items():
            for chunk, (start, end) in enumerate(spans[side]):
                output_grads[(side, top, chunk)] = None if grad is None else grad[start:end]

        def backward_task(key: Key) -> Callable[[], None]:
            record = records[key]

            def run() -> None:
                tensors, grads = [], []
                state_grad = state_grads.get(key, (None, None))
                for tensor, grad in (
                    (record.output, output_grads.get(key)),
                    (record.state[0], state_grad[0]),
                    (record.state[1], state_grad[1]),
                ):
                    if grad is not None and tensor.requires_grad:
                        tensors.append(tensor)
                        grads.append(grad.to(tensor.device))
                if tensors:
                    torch.autograd.backward(tensors, grads)

            return run

        cycles = clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), self.num_layers)
        for cycle in reversed(cycles):
            self.workers.run_all(
                [
                    (self.plan.layer_device[cell.layer], "backward of " + describe(cell),
                     backward_task((cell.side, cell.layer, cell.chunk)))
                    for cell in cycle
                ]
            )
            for cell in cycle:
                record = records[cell.key]
                below = input_cell(cell)
                if below is not None:
                    output_grads[below] = record.input_leaf.grad
                previous = state_cell(cell, len(spans[ENCODER]))
                if previous is not None:
                    state_grads[previous] = tuple(
                        add_grads(state_grads.get(previous, (None, None))[i],
                                  record.state_leaves[i].grad)
                        for i in range(2)
                    )


def add_grads(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    if a is None:
        return b
    if b is None:
        return a
    return a + b.to(a.device)


def describe(cell: Cell) -> str:
    return f"{cell.side} layer {cell.layer} chunk {cell.chunk}"


class _StagedPipeline(torch.autograd.Function):
    """The whole pipeline as one autograd node whose backward is the pipeline's own
    reverse-clock-order schedule of per-cell backward calls on the device workers (CPU
    autograd would run one ``.backward()`` on a single thread; on GPUs each worker's call
    only waits for its kernels to be queued). ``grad_enabled``: the caller's grad mode
    (without grad, as in validation, the cells record no graph)."""

    @staticmethod
    def forward(ctx, pipeline: WavefrontPipeline, grad_enabled: bool, lengths: Tensor, spans,
                masks: Masks, source: Tensor, target: Tensor):
        ctx.set_materialize_grads(False)  # unused outputs get None, not zeros
        has_target = target.numel() > 0
        source_leaf = source.detach().requires_grad_(grad_enabled and source.requires_grad)
        target_leaf = target.detach().requires_grad_(grad_enabled and target.requires_grad)
        with torch.set_grad_enabled(grad_enabled):
            outputs, states, records = pipeline.forward_cells(
                source_leaf, lengths, target_leaf if has_target else None, spans, masks,
            )
        result = pipeline.collect(outputs, states, spans, has_target)
        ctx.pipeline, ctx.records, ctx.spans = pipeline, records, spans
        ctx.leaves = (source_leaf, target_leaf)
        finals = [t.detach() for pair in result.encoder_finals for t in pair]
        hiddens, cells = finals[0::2], finals[1::2]
        decoder_top = result.decoder_top.detach() if has_target else target.new_zeros(0)
        return (result.encoder_top.detach(), decoder_top, *hiddens, *cells)

    @staticmethod
    def backward(ctx, encoder_top_grad, decoder_top_grad, *final_grads):
        source_leaf, target_leaf = ctx.leaves
        layers = len(final_grads) // 2
        ctx.pipeline.backward_cells(
            ctx.records, ctx.spans,
            {ENCODER: encoder_top_grad, DECODER: decoder_top_grad if ctx.spans[DECODER] else None},
            list(zip(final_grads[:layers], final_grads[layers:])),
        )
        ctx.records = None  # free the cells' graphs
        return None, None, None, None, None, source_leaf.grad, target_leaf.grad
