"""What the engine needs of a model, as a ``Protocol``: the encoder and decoder (their LSTM
stacks, embeddings, bridge and head), the one draw order of a step, and the plain forward
for one device. ``model.network.HybridLSTMNetwork`` is one; the engine never imports the
fairseq registration that builds it."""
from __future__ import annotations

from typing import Any, Optional, Protocol

import torch
from torch import Tensor

from ..model.decoder import HybridLSTMDecoder
from ..model.encoder import HybridLSTMEncoder
from ..model.network import StepDraws


class HybridModel(Protocol):
    encoder: HybridLSTMEncoder
    decoder: HybridLSTMDecoder

    def draw_step(self, src_tokens: Tensor, prev_output_tokens: Tensor,
                  top_device: Optional[torch.device] = None) -> StepDraws: ...

    def __call__(self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor,
                 features_only: bool = False, **kwargs: Any) -> Any: ...
