"""The stacked LSTM decoder, without input feeding (default) or with it (HybridNMT-IF).

Without input feeding the decoder LSTM never sees the attention context, so
``extract_features`` returns the top decoder states H for every target step in one pass
and ``output_layer(features, encoder_out)`` applies the shared ``AttentionHead``.
With ``--input-feeding`` each step's H_c feeds the next step, so ``extract_features`` runs
step by step, applies attention and combine itself and returns H_c; ``output_layer`` then
only projects (``features_are_combined`` tells the criterion which case it has).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import FairseqDropout
from torch import Tensor

from .encoder import EncoderOut, attention_in_source_order
from .dropout import Mask, MaskQueue, apply_mask, dropped_out
from .head import AttentionHead
from .initialized_layers import linear
from .lstm_stack import LSTMStack, State, device_of, run_layer, to_device

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


@dataclass
class DecoderDraws:
    """What ``HybridLSTMDecoder.draw_inputs`` draws for one teacher-forced pass."""

    target: Tensor  # embeddings of the decoder input, time-major (T x B x E), not dropped out
    masks: List[Mask]  # each layer's input dropout, the embeddings' first (``LSTMStack.draw_masks``)


class HybridLSTMDecoder(FairseqIncrementalDecoder):
    def __init__(
        self,
        dictionary,
        embed_tokens: nn.Embedding,
        hidden_size: int,
        num_layers: int,
        out_embed_dim: int,
        encoder_hidden_size: int,
        dropout_in: float,
        dropout_out: float,
        share_input_output_embed: bool,
        input_feeding: bool,
        max_target_positions: int,
    ) -> None:
        super().__init__(dictionary)
        self.embed_tokens = embed_tokens
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.input_feeding = input_feeding
        self.max_target_positions = max_target_positions
        self.need_attn = True
        name = self.__class__.__name__
        self.dropout_in = FairseqDropout(dropout_in, module_name=name)
        feed_size = out_embed_dim if input_feeding else 0
        self.stack = LSTMStack(
            embed_tokens.embedding_dim + feed_size, hidden_size, num_layers, dropout_out, name
        )
        if encoder_hidden_size != hidden_size:
            self.bridge_hidden: Optional[nn.Linear] = linear(encoder_hidden_size, hidden_size)
            self.bridge_cell: Optional[nn.Linear] = linear(encoder_hidden_size, hidden_size)
        else:
            self.bridge_hidden = self.bridge_cell = None
        self.head = AttentionHead(
            hidden_size,
            encoder_hidden_size,
            out_embed_dim,
            len(dictionary),
            dropout_out,
            tied_embedding=embed_tokens if share_input_output_embed else None,
        )

    # ----------------------------------------------------------------- states
    def initial_states(self, encoder_out: EncoderOut) -> List[State]:
        """Decoder layer l starts from encoder layer l's final state (bridged if the
        sizes differ)."""
        return [
            self.bridge(hidden, cell)
            for hidden, cell in zip(encoder_out["final_hiddens"], encoder_out["final_cells"])
        ]

    @property
    def has_bridge(self) -> bool:
        """Whether encoder and decoder hidden sizes differ (then ``bridge`` maps them)."""
        return self.bridge_hidden is not None

    def bridge(self, hidden: Tensor, cell: Tensor) -> State:
        """Map an encoder layer's final (h, c) to the decoder's hidden size if needed."""
        if self.bridge_hidden is None:
            return hidden, cell
        device = self.bridge_hidden.weight.device
        return self.bridge_hidden(hidden.to(device)), self.bridge_cell(cell.to(device))

    def embed(self, prev_output_tokens: Tensor) -> Tensor:
        """Target-side input tokens -> time-major, dropped-out embeddings (input feeding's
        and generation's decoder)."""
        return dropped_out(self.dropout_in, self.embed_tokens(prev_output_tokens)).transpose(0, 1)

    def draw_inputs(
        self, prev_output_tokens: Tensor, queue: Optional[MaskQueue] = None
    ) -> DecoderDraws:
        """The embedded decoder input and the decoder's random draws for a whole
        teacher-forced pass without input feeding, in order: the embeddings' dropout
        (layer 0's input mask), the between-layer masks; queued in ``queue`` if given.
        (With input feeding each step draws its own masks as it runs.)"""
        target = self.embed_tokens(prev_output_tokens).transpose(0, 1)
        masks = self.stack.draw_masks(target.size(0), target.size(1), target, self.dropout_in, queue)
        return DecoderDraws(target, masks)

    def cached_state(
        self, incremental_state: Optional[IncrementalState]
    ) -> Optional[Tuple[List[State], Optional[Tensor]]]:
        if incremental_state is None:
            return None
        cache = self.get_incremental_state(incremental_state, "cached_state")
        if cache is None:
            return None
        states = [(cache[f"h{i}"], cache[f"c{i}"]) for i in range(self.num_layers)]
        return states, cache["input_feed"]

    def store_state(
        self,
        incremental_state: Optional[IncrementalState],
        states: List[State],
        input_feed: Optional[Tensor],
    ) -> None:
        """One (h, c) entry per layer: layers may live on different devices."""
        if incremental_state is None:
            return
        cache: Dict[str, Optional[Tensor]] = {"input_feed": input_feed}
        for index, (hidden, cell) in enumerate(states):
            cache[f"h{index}"], cache[f"c{index}"] = hidden, cell
        self.set_incremental_state(incremental_state, "cached_state", cache)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: Tensor
    ) -> None:
        cache = self.get_incremental_state(incremental_state, "cached_state")
        if cache is None:
            return
        reordered = {
            key: None if value is None else value.index_select(0, new_order.to(value.device))
            for key, value in cache.items()
        }
        self.set_incremental_state(incremental_state, "cached_state", reordered)

    # --------------------------------------------------------------- forward
    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[EncoderOut] = None,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        draws: Optional[DecoderDraws] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        features, extra = self.extract_features(
            prev_output_tokens, encoder_out, incremental_state, draws=draws
        )
        if features_only:
            return features, extra
        logits, attn = self.output_layer(features, encoder_out, extra.get("attn"))
        return logits, {"attn": [attn], "encoder_out": encoder_out}

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[EncoderOut] = None,
        incremental_state: Optional[IncrementalState] = None,
        draws: Optional[DecoderDraws] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Top decoder states H (B x T x hidden), or H_c with input feeding. ``draws``:
        drawn by the caller (``HybridLSTMModel.draw_step``) or here."""
        if encoder_out is None:
            raise ValueError("hybrid_lstm's decoder needs the encoder output")
        cached = self.cached_state(incremental_state)
        if cached is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            states, input_feed = cached
        else:
            states, input_feed = self.initial_states(encoder_out), None
        if self.input_feeding:
            x = self.embed(prev_output_tokens)
            return self._input_fed_features(x, states, input_feed, encoder_out, incremental_state)
        draws = draws if draws is not None else self.draw_inputs(prev_output_tokens)
        top, finals = self.stack(draws.target, None, states, draws.masks)
        self.store_state(incremental_state, finals, None)
        return top.transpose(0, 1), {"attn": None, "encoder_out": encoder_out}

    def _input_fed_features(
        self,
        x: Tensor,
        states: List[State],
        input_feed: Optional[Tensor],
        encoder_out: EncoderOut,
        incremental_state: Optional[IncrementalState],
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """HybridNMT-IF: step by step, H_c of step t-1 concatenated to the input of t."""
        sources = encoder_out["encoder_out"]
        mask = encoder_out["encoder_padding_mask"]
        head_device = self.head_device
        sources, mask = sources.to(head_device), mask.to(head_device)
        if input_feed is None:
            input_feed = x.new_zeros(x.size(1), self.head.combined_dim)
        combined_steps, weight_steps = [], []
        for step in range(x.size(0)):
            layer_input = torch.cat([x[step], input_feed.to(x.device)], dim=1).unsqueeze(0)
            masks = self.stack.draw_masks(1, layer_input.size(1), layer_input)
            for index, layer in enumerate(self.stack.layers):
                device = device_of(layer)
                layer_input, states[index] = run_layer(
                    layer,
                    apply_mask(layer_input.to(device), masks[index]),
                    None,
                    to_device(states[index], device),
                )
            query = layer_input.to(head_device).transpose(0, 1)  # B x 1 x hidden
            context, weights = self.head.attend(query, sources, mask)
            input_feed = self.head.combine(query, context).squeeze(1)
            combined_steps.append(input_feed)
            weight_steps.append(weights)
        self.store_state(incremental_state, states, input_feed)
        return torch.stack(combined_steps, dim=1), {
            "attn": torch.cat(weight_steps, dim=1),
            "encoder_out": encoder_out,
        }

    def output_layer(
        self,
        features: Tensor,
        encoder_out: Optional[EncoderOut] = None,
        attn: Optional[Tensor] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits (B x T x V) and attention weights in the caller's source positions
        (None while training, as fairseq's lstm does)."""
        if self.features_are_combined:
            logits = self.head.project(features)
        else:
            if encoder_out is None:
                raise ValueError("output_layer needs encoder_out to attend over")
            device = self.head_device
            logits, attn = self.head(
                features.to(device),
                encoder_out["encoder_out"].to(device),
                encoder_out["encoder_padding_mask"].to(device),
            )
        if self.training or not self.need_attn or attn is None or encoder_out is None:
            return logits, None
        return logits, attention_in_source_order(attn, encoder_out)

    @property
    def features_are_combined(self) -> bool:
        """With input feeding the features are already H_c; otherwise they are H."""
        return self.input_feeding

    @property
    def head_device(self) -> torch.device:
        return self.head.combine_proj.weight.device

    def max_positions(self) -> int:
        return self.max_target_positions

    def make_generation_fast_(self, need_attn: bool = False, **kwargs: Any) -> None:
        self.need_attn = need_attn
