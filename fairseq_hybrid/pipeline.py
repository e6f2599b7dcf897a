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
    side: str
    layer: int
    chunk: int


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
        self.bridge = bridge
        self.plan = plan
        self.workers = workers

    def run(
        self, source: Tensor, source_lengths: Tensor, target: Optional[Tensor]
    ) -> PipelineOutput:
        """source: src_len x B x E embedded (right-padded) source; target: tgt_len x B x E
        embedded decoder input, or None to run the encoder only (input feeding).
        Returns the top outputs and the encoder's final states."""
        num_layers = len(self.stacks[ENCODER].layers)
        spans = {
            ENCODER: chunk_bounds(source.size(0), self.plan.chunks),
            DECODER: [] if target is None else chunk_bounds(target.size(0), self.plan.chunks),
        }
        inputs = {ENCODER: source, DECODER: target}
        lengths = source_lengths.cpu()
        outputs: Dict[Tuple[str, int, int], Tensor] = {}
        states: Dict[Tuple[str, int, int], State] = {}

        def cell_task(cell: Cell) -> Callable[[], Tuple[Tensor, State]]:
            stack = self.stacks[cell.side]
            device = self.plan.device_of_layer(cell.layer)
            start, end = spans[cell.side][cell.chunk]

            def run() -> Tuple[Tensor, State]:
                if cell.layer == 0:
                    x = inputs[cell.side][start:end].to(device)
                else:
                    x = outputs[(cell.side, cell.layer - 1, cell.chunk)].to(device)
                x = stack.layer_input(cell.layer, x)
                state = self._initial_state(cell, states, spans, device)
                steps = None
                if cell.side == ENCODER:
                    steps = (lengths - start).clamp(min=0, max=end - start)
                return run_layer(stack.layers[cell.layer], x, steps, state)

            return run

        for cycle in clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), num_layers):
            results = self.workers.run_all(
                [
                    (
                        self.plan.layer_device[cell.layer],
                        f"{cell.side} layer {cell.layer} chunk {cell.chunk}",
                        cell_task(cell),
                    )
                    for cell in cycle
                ]
            )
            for cell, (out, state) in zip(cycle, results):
                outputs[(cell.side, cell.layer, cell.chunk)] = out
                states[(cell.side, cell.layer, cell.chunk)] = state

        top = num_layers - 1
        last_source_chunk = len(spans[ENCODER]) - 1
        return PipelineOutput(
            encoder_top=torch.cat(
                [outputs[(ENCODER, top, k)] for k in range(len(spans[ENCODER]))], dim=0
            ),
            encoder_finals=[
                states[(ENCODER, layer, last_source_chunk)] for layer in range(num_layers)
            ],
            decoder_top=None if target is None else torch.cat(
                [outputs[(DECODER, top, k)] for k in range(len(spans[DECODER]))], dim=0
            ),
        )

    def _initial_state(
        self,
        cell: Cell,
        states: Dict[Tuple[str, int, int], State],
        spans: Dict[str, Sequence[Span]],
        device: torch.device,
    ) -> Optional[State]:
        if cell.chunk > 0:
            return states[(cell.side, cell.layer, cell.chunk - 1)]
        if cell.side == ENCODER:
            return None  # zeros
        hidden, cell_state = states[(ENCODER, cell.layer, len(spans[ENCODER]) - 1)]
        master = self.plan.master
        hidden, cell_state = self.bridge(hidden.to(master), cell_state.to(master))
        return hidden.to(device), cell_state.to(device)
