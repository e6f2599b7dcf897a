"""``HybridLSTMNetwork``: the whole network as nn code, the encoder and the decoder with
their one draw order, and the two hooks through which a parallel runtime (``parallel/``)
runs it without this layer knowing the runtime: ``forward(..., hybrid=True)`` asks the
runtime for the features, and ``_apply`` (``model.to()``, ``.half()``) asks it to put the
layers back where its placement wants them. fairseq's registration is ``plugin/``'s job."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Tuple

import torch
from fairseq.models import FairseqEncoderDecoderModel
from torch import Tensor, nn

from .decoder import DecoderDraws, HybridLSTMDecoder
from .dropout import MaskQueue
from .encoder import EncoderDraws, EncoderOut, HybridLSTMEncoder


@dataclass
class StepDraws:
    """``HybridLSTMNetwork.draw_step``'s draws: the encoder's, and the decoder's (None with
    input feeding)."""

    encoder: EncoderDraws
    decoder: Optional[DecoderDraws]


class ParallelRuntime(Protocol):
    """What the network asks of the runtime that trains it over several devices."""

    def features(self, src_tokens: Tensor, src_lengths: Tensor,
                 prev_output_tokens: Tensor) -> Tuple[Tensor, EncoderOut]: ...

    def restore_placement(self) -> None: ...


class HybridLSTMNetwork(FairseqEncoderDecoderModel):
    encoder: HybridLSTMEncoder
    decoder: HybridLSTMDecoder

    def __init__(self, encoder: HybridLSTMEncoder, decoder: HybridLSTMDecoder) -> None:
        super().__init__(encoder, decoder)
        self.runtime: Optional[ParallelRuntime] = None  # set by whoever trains it in parallel

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor,
        prev_output_tokens: Tensor,
        features_only: bool = False,
        hybrid: bool = False,
        **kwargs: Any,
    ):
        """``hybrid=True`` (the criterion's call, so a data-parallel wrapper sees it) runs
        the model-parallel part through the runtime and returns (H, {"encoder_out": ...})."""
        if hybrid:
            if self.runtime is None:
                raise RuntimeError("forward(hybrid=True) needs a parallel runtime (model.runtime)")
            features, encoder_out = self.runtime.features(src_tokens, src_lengths, prev_output_tokens)
            return features, {"encoder_out": encoder_out, "attn": None}
        draws = self.draw_step(src_tokens, prev_output_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, draws=draws.encoder, **kwargs)
        return self.decoder(
            prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
            draws=draws.decoder, **kwargs,
        )

    def draw_step(
        self, src_tokens: Tensor, prev_output_tokens: Tensor,
        top_device: Optional[torch.device] = None, queue: Optional[MaskQueue] = None,
    ) -> StepDraws:
        """Every random number of a training forward pass before the head, in the one order
        the plain model, the hybrid engine and the benchmarks share: the encoder's
        (embeddings, between-layer masks, top mask), then the decoder's (embeddings,
        between-layer masks; with input feeding the decoder draws step by step as it runs).
        The head draws its combine mask last. Drawing on the calling thread, over whole
        tensors, is what makes a run's numbers independent of devices and chunks
        (``dropout.py``). With a ``queue`` the embeddings are looked up now and the masks
        queued in that order, to be drawn while the runtime's workers run."""
        encoder = self.encoder.draw_inputs(src_tokens, top_device, queue)
        decoder = None
        if not self.decoder.input_feeding:
            decoder = self.decoder.draw_inputs(prev_output_tokens, queue)
        return StepDraws(encoder, decoder)

    def _apply(self, fn, *args, **kwargs) -> nn.Module:
        """Keep the runtime's placement through ``model.to(device)``/``.half()`` (fairseq's
        Trainer moves the whole model to one device)."""
        result = super()._apply(fn, *args, **kwargs)
        runtime = self.__dict__.get("runtime")
        if runtime is not None:
            runtime.restore_placement()
        return result
