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

from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models import FairseqEncoder
from fairseq.modules import FairseqDropout
from torch import Tensor

from .dropout import apply_mask, dropout_mask
from .lstm_stack import LSTMStack

EncoderOut = Dict[str, Tensor]


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

    def embed(self, src_tokens: Tensor) -> Tensor:
        """Right-padded tokens -> time-major, dropped-out embeddings (src_len x B x E)."""
        return self.dropout_in(self.embed_tokens(src_tokens)).transpose(0, 1)

    def right_pad(self, src_tokens: Tensor) -> Tensor:
        return utils.convert_padding_direction(
            src_tokens, self.padding_idx, left_to_right=True
        )

    def package(
        self,
        top: Tensor,
        finals: List,
        right_padded_tokens: Tensor,
        source_shift: Tensor,
        top_mask: Optional[Tensor],
    ) -> EncoderOut:
        """Build the encoder-out dict from the stack's top output (time-major) and
        per-layer final states."""
        device = top.device
        padding_mask = right_padded_tokens.to(device).eq(self.padding_idx)
        return {
            "encoder_out": apply_mask(top, top_mask).transpose(0, 1),
            "encoder_padding_mask": padding_mask,
            "final_hiddens": torch.stack([h.to(device) for h, _ in finals]),
            "final_cells": torch.stack([c.to(device) for _, c in finals]),
            "source_shift": source_shift.to(device),
        }

    def forward(self, src_tokens: Tensor, src_lengths: Tensor, **unused) -> EncoderOut:
        tokens = self.right_pad(src_tokens)
        top, finals = self.stack(self.embed(tokens), src_lengths)
        # the head attends over S on the embeddings' (master) device
        top = top.to(self.embed_tokens.weight.device)
        return self.package(
            top, finals, tokens, self.source_shift(src_tokens, tokens),
            self.top_mask(top.shape, top),
        )

    def top_mask(self, shape, like: Tensor, device: Optional[torch.device] = None) -> Optional[Tensor]:
        """The dropout mask of the top states S (src_len x B x hidden)."""
        return dropout_mask(self.dropout_out, shape, like, device)

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
