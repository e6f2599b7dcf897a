"""The stacked LSTM encoder: token embedding and ``LSTMStack``, exact under padding.

The encoder output is a dict (fairseq's convention for reorderable encoder outputs):

- ``encoder_out``: top states S, batch x src_len x hidden, right-padded;
- ``encoder_padding_mask``: batch x src_len, True at padding (right-padded);
- ``final_hiddens`` / ``final_cells``: layers x batch x hidden, each sentence's state after
  its own last token (padding never leaks into them);
- ``source_shift``: batch, how far each sentence was moved left from fairseq's
  left-padded layout (used to report attention in the caller's source positions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models import FairseqEncoder
from fairseq.modules import FairseqDropout
from torch import Tensor

from .dropout import Mask, MaskQueue, apply_mask, dropout_mask, queued_or_drawn
from .lstm_stack import LSTMStack

EncoderOut = Dict[str, Tensor]


@dataclass
class EncoderDraws:
    """What ``HybridLSTMEncoder.draw_inputs`` draws for one pass."""

    tokens: Tensor  # the source tokens, right-padded (B x src_len)
    source: Tensor  # their embeddings, time-major (src_len x B x E), not yet dropped out
    masks: List[Mask]  # each layer's input dropout, the embeddings' first (``LSTMStack.draw_masks``)
    top_mask: Mask  # dropout mask of the top states S (src_len x B x hidden)


class HybridLSTMEncoder(FairseqEncoder):
    def __init__(
        self,
        dictionary,
        embed_tokens: torch.nn.Embedding,
        hidden_size: int,
        num_layers: int,
        dropout_in: float,
        dropout_out: float,
        max_source_positions: int,
    ) -> None:
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.embed_tokens = embed_tokens
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.max_source_positions = max_source_positions
        name = self.__class__.__name__
        self.dropout_in = FairseqDropout(dropout_in, module_name=name)
        self.dropout_out = FairseqDropout(dropout_out, module_name=name)
        self.stack = LSTMStack(
            embed_tokens.embedding_dim, hidden_size, num_layers, dropout_out, name
        )

    def right_pad(self, src_tokens: Tensor) -> Tensor:
        return utils.convert_padding_direction(
            src_tokens, self.padding_idx, left_to_right=True
        )

    def draw_inputs(
        self, src_tokens: Tensor, top_device: Optional[torch.device] = None,
        queue: Optional[MaskQueue] = None,
    ) -> "EncoderDraws":
        """The embedded source and the encoder's random draws for one forward pass, in
        order: the embeddings' dropout (layer 0's input mask), the between-layer masks,
        the mask of the top states S (on ``top_device``, default the embeddings' device,
        where the plain model applies it). Queued in ``queue`` if given."""
        tokens = self.right_pad(src_tokens)
        source = self.embed_tokens(tokens).transpose(0, 1)
        masks = self.stack.draw_masks(source.size(0), source.size(1), source, self.dropout_in, queue)
        shape = (source.size(0), source.size(1), self.hidden_size)
        device = top_device or self.embed_tokens.weight.device
        top_mask = queued_or_drawn(queue, lambda: dropout_mask(self.dropout_out, shape, source, device))
        return EncoderDraws(tokens, source, masks, top_mask)

    def output(
        self, top: Tensor, finals: List, src_tokens: Tensor, draws: "EncoderDraws"
    ) -> EncoderOut:
        """The encoder-out dict from the stack's top output (time-major) and per-layer
        final states, on ``top``'s device."""
        device = top.device
        attended = self.attention_inputs(top, draws)
        return {
            "encoder_out": attended["encoder_out"],
            "encoder_padding_mask": attended["encoder_padding_mask"].to(device),
            "final_hiddens": torch.stack([h.to(device) for h, _ in finals]),
            "final_cells": torch.stack([c.to(device) for _, c in finals]),
            "source_shift": self.source_shift(src_tokens, draws.tokens).to(device),
        }

    def attention_inputs(self, top: Tensor, draws: "EncoderDraws") -> EncoderOut:
        """What the head attends over: S (B x S x H, the top states dropped out, on
        ``top``'s device) and the source padding mask (on the tokens' device)."""
        return {"encoder_out": apply_mask(top, draws.top_mask).transpose(0, 1),
                "encoder_padding_mask": draws.tokens.eq(self.padding_idx)}

    def forward(
        self, src_tokens: Tensor, src_lengths: Tensor,
        draws: Optional["EncoderDraws"] = None, **unused,
    ) -> EncoderOut:
        """``draws``: drawn by the caller (``HybridLSTMModel.draw_step``) or here."""
        draws = draws if draws is not None else self.draw_inputs(src_tokens)
        top, finals = self.stack(draws.source, src_lengths, None, draws.masks)
        # the head attends over S on the embeddings' (master) device
        return self.output(top.to(self.embed_tokens.weight.device), finals, src_tokens, draws)

    def source_shift(self, src_tokens: Tensor, right_padded: Tensor) -> Tensor:
        """Per sentence, how many positions it moved left when it was right-padded."""
        if right_padded is src_tokens:
            return src_tokens.new_zeros(src_tokens.size(0))
        return src_tokens.eq(self.padding_idx).long().sum(dim=1)

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        return {
            "encoder_out": encoder_out["encoder_out"].index_select(0, new_order),
            "encoder_padding_mask": encoder_out["encoder_padding_mask"].index_select(
                0, new_order
            ),
            "final_hiddens": encoder_out["final_hiddens"].index_select(1, new_order),
            "final_cells": encoder_out["final_cells"].index_select(1, new_order),
            "source_shift": encoder_out["source_shift"].index_select(0, new_order),
        }

    def max_positions(self) -> int:
        return self.max_source_positions


def attention_in_source_order(weights: Tensor, encoder_out: EncoderOut) -> Tensor:
    """Move attention weights (B x T x S, right-padded source positions) back to the
    positions of the caller's (left-padded) ``src_tokens``, as fairseq's alignment
    printing expects."""
    src_len = weights.size(-1)
    positions = torch.arange(src_len, device=weights.device)
    shift = encoder_out["source_shift"].to(weights.device)
    index = torch.remainder(positions.unsqueeze(0) - shift.unsqueeze(1), src_len)
    return weights.gather(2, index.unsqueeze(1).expand_as(weights))
