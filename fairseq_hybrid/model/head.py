"""The attention head: Luong "general" attention, the ``tanh(W_c [H; C])`` combine layer,
dropout, and the output projection.

This is the only place the head's math exists. The decoder uses it for
``output_layer``/generation, the criterion uses it (token-chunked, and later sharded over
devices) for training. Everything here is per-sentence independent, which is what lets the
hybrid scheme split it by sentences.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import FairseqDropout
from torch import Tensor

from .dropout import apply_mask, dropout_mask
from .initialized_layers import linear


class AttentionHead(nn.Module):
    def __init__(
        self,
        query_dim: int,
        source_dim: int,
        combined_dim: int,
        vocab_size: int,
        dropout: float,
        tied_embedding: Optional[nn.Embedding] = None,
    ) -> None:
        super().__init__()
        self.score_proj = linear(query_dim, source_dim, bias=False)  # W_a
        self.combine_proj = linear(query_dim + source_dim, combined_dim, bias=False)  # W_c
        self.dropout = FairseqDropout(dropout, module_name=self.__class__.__name__)
        if tied_embedding is not None:
            if tied_embedding.embedding_dim != combined_dim:
                raise ValueError(
                    f"a tied output embedding needs --decoder-out-embed-dim "
                    f"({combined_dim}) == --decoder-embed-dim "
                    f"({tied_embedding.embedding_dim})"
                )
            self.output_proj = nn.Linear(combined_dim, vocab_size, bias=False)
            self.output_proj.weight = tied_embedding.weight
        else:
            self.output_proj = linear(combined_dim, vocab_size)  # W_o, b_o

    def attend(
        self, queries: Tensor, sources: Tensor, source_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """Context vectors and attention weights.

        queries: B x T x Dq (decoder states H); sources: B x S x Ds (encoder states S);
        source_padding_mask: B x S, True at padding. Returns (B x T x Ds, B x T x S).
        """
        scores = torch.bmm(self.score_proj(queries), sources.transpose(1, 2))
        if source_padding_mask is not None:
            scores = scores.masked_fill(source_padding_mask.unsqueeze(1), float("-inf"))
        weights = F.softmax(scores if scores.dtype == torch.float64 else scores.float(), dim=-1).type_as(scores)
        return torch.bmm(weights, sources), weights

    def combine(self, queries: Tensor, context: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """H_c = dropout(tanh(W_c [H; C])), on any leading shape. ``mask``: a dropout mask
        drawn in advance (``combine_mask``); without one it is drawn here."""
        combined = torch.tanh(self.combine_proj(torch.cat([queries, context], dim=-1)))
        if mask is None:
            mask = self.combine_mask(combined.shape, combined)
        return apply_mask(combined, mask)

    def combine_mask(self, shape, like: Tensor) -> Optional[Tensor]:
        return dropout_mask(self.dropout, shape, like)

    @property
    def combined_dim(self) -> int:
        return self.combine_proj.out_features

    def project(self, combined: Tensor) -> Tensor:
        """Unnormalised vocabulary scores."""
        return self.output_proj(combined)

    def forward(
        self, queries: Tensor, sources: Tensor, source_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """Logits (B x T x V) and attention weights (B x T x S)."""
        context, weights = self.attend(queries, sources, source_padding_mask)
        return self.project(self.combine(queries, context)), weights
