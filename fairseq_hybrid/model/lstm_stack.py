"""Stacked unidirectional LSTMs, one ``nn.LSTM`` per layer, and the per-layer step that
runs one layer over a span of time steps.

One module per layer (instead of one multi-layer ``nn.LSTM``) is what lets the placement
plan put layer ``l`` on device ``l`` and the pipeline run layer ``l`` on time chunk ``k``:
``run_layer`` is exactly the unit of work of one (layer, chunk) cell of the wavefront.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.modules import FairseqDropout
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .dropout import Mask, MaskQueue, apply_mask, dropout_mask, queued_or_drawn
from .initialized_layers import lstm_layer

State = Tuple[Tensor, Tensor]  # (h, c), each batch x hidden


def device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def to_device(state: Optional[State], device: torch.device) -> Optional[State]:
    if state is None:
        return None
    return state[0].to(device), state[1].to(device)


def zero_state(batch_size: int, hidden_size: int, like: Tensor) -> State:
    zeros = like.new_zeros(batch_size, hidden_size)
    return zeros, zeros


def run_layer(
    layer: nn.LSTM, x: Tensor, steps: Optional[Tensor], state: Optional[State]
) -> Tuple[Tensor, State]:
    """Run ``layer`` over time-major ``x`` (T x B x C) starting from ``state``.

    ``steps`` (B, CPU or device, may be None = all T) says how many leading steps of ``x``
    are real for each sentence (right padding). A sentence's state stops at its last real
    step, so the returned state is exact for every sentence whatever the padding; outputs
    at padded steps are zero. Sentences with 0 real steps keep their state unchanged.
    """
    seq_len, batch_size, _ = x.shape
    if state is None:
        state = zero_state(batch_size, layer.hidden_size, x)
    h0, c0 = state
    if steps is None or int(steps.min()) >= seq_len:
        out, (h, c) = layer(x, (h0.unsqueeze(0), c0.unsqueeze(0)))
        return out, (h[0], c[0])

    steps = steps.cpu().clamp(max=seq_len)
    active_cpu = steps.gt(0).nonzero().squeeze(1)
    if active_cpu.numel() == 0:
        return x.new_zeros(seq_len, batch_size, layer.hidden_size), state
    everyone = active_cpu.numel() == batch_size
    active = active_cpu.to(x.device)
    sub_x = x if everyone else x.index_select(1, active)
    sub_h0 = h0 if everyone else h0.index_select(0, active)
    sub_c0 = c0 if everyone else c0.index_select(0, active)
    packed = pack_padded_sequence(
        sub_x, steps.index_select(0, active_cpu), enforce_sorted=False
    )
    packed_out, (h, c) = layer(packed, (sub_h0.unsqueeze(0), sub_c0.unsqueeze(0)))
    out, _ = pad_packed_sequence(packed_out, total_length=seq_len)
    if everyone:
        return out, (h[0], c[0])
    full_out = x.new_zeros(seq_len, batch_size, layer.hidden_size)
    full_out = full_out.index_copy(1, active, out)
    return full_out, (h0.index_copy(0, active, h[0]), c0.index_copy(0, active, c[0]))


class LSTMStack(nn.Module):
    """``num_layers`` LSTM layers with dropout between them.

    ``forward`` runs the whole stack over whole sequences on the module's own device; the
    pipeline (``fairseq_hybrid.parallel.pipeline``) runs the same ``layers`` chunk by chunk across
    devices and must give the same numbers.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        dropout_between: float,
        module_name: str,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.layers = nn.ModuleList(
            [
                lstm_layer(input_size if i == 0 else hidden_size, hidden_size)
                for i in range(num_layers)
            ]
        )
        self.dropout_between = FairseqDropout(dropout_between, module_name=module_name)

    def draw_masks(
        self, seq_len: int, batch_size: int, like: Tensor,
        input_dropout: Optional[FairseqDropout] = None, queue: Optional[MaskQueue] = None,
    ) -> List[Mask]:
        """Dropout masks of each layer's input for a whole (seq_len x batch) input, each on
        its layer's device: layer 0's is ``input_dropout``'s (the embeddings' dropout;
        None without one), the others are the between-layer dropout. Queued in ``queue``
        if given (``dropout.MaskQueue``), else drawn now."""
        masks: List[Mask] = []
        for index, layer in enumerate(self.layers):
            dropout = self.dropout_between if index > 0 else input_dropout
            if dropout is None:
                masks.append(None)
                continue
            shape, device = (seq_len, batch_size, layer.input_size), device_of(layer)
            masks.append(queued_or_drawn(
                queue, lambda dropout=dropout, shape=shape, device=device:
                dropout_mask(dropout, shape, like, device)))
        return masks

    def forward(
        self,
        x: Tensor,
        steps: Optional[Tensor],
        initial: Optional[List[State]],
        masks: List[Mask],
    ) -> Tuple[Tensor, List[State]]:
        """``masks``: each layer's input mask (``draw_masks``: the caller draws them, with
        the embeddings' dropout as layer 0's, in the step's one draw order)."""
        finals: List[State] = []
        for index, layer in enumerate(self.layers):
            device = device_of(layer)
            x, state = run_layer(
                layer,
                apply_mask(x.to(device), masks[index]),
                steps,
                to_device(initial[index], device) if initial is not None else None,
            )
            finals.append(state)
        return x, finals
