"""The hybrid engine: runs ``hybrid_lstm`` for training over a placement plan.

- the model is placed first (``HybridLSTMModel.place``: each LSTM layer on its device,
  embeddings, bridges and the master head on device 0, kept through ``model.to()``).
- ``features`` runs the model-parallel part: embeddings, then the wavefront pipeline.
- ``head_loss`` runs the data-parallel part: sentences split into one shard per device,
  the head's parameters replicated (``torch.nn.parallel.replicate`` when every device is a
  GPU; otherwise each shard runs forward and backward on its worker with its own head
  replica, see ``head_shards.py``), shard losses
  summed on device 0; the head gradients are reduced to the master copy and dH, dS go
  back into the pipeline.

Generation never uses the engine: it runs the plain model on one device.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.parallel import parallel_apply, replicate

from .encoder import EncoderOut
from .head import AttentionHead
from .head_shards import HeadReplicas, ShardLoss, staged_shard_losses
from .loss import HeadLoss, TokenLoss
from .pipeline import DECODER, ENCODER, WavefrontPipeline
from .placement import PlacementPlan, shard_bounds
from .worker import DeviceWorkers

logger = logging.getLogger(__name__)


class HybridEngine:
    def __init__(self, model: nn.Module, plan: PlacementPlan) -> None:
        self.model = model
        self.plan = plan
        self.workers = DeviceWorkers(plan.devices)
        self.head_replicas = HeadReplicas()
        self.pipeline = WavefrontPipeline(
            model.encoder.stack, model.decoder.stack, model.decoder.bridge, plan, self.workers
        )
        if any(d.type == "cpu" for d in plan.devices) and plan.num_devices > 1:
            logger.info(
                f"hybrid: {self.workers.cpu_threads} torch thread(s) per CPU device worker"
            )

    @property
    def plain(self) -> bool:
        """One device, one chunk: the plain model on the calling thread."""
        return self.plan.is_single_device and self.plan.chunks == 1

    # ------------------------------------------------------ model parallel
    def features(
        self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor
    ) -> Tuple[Tensor, EncoderOut]:
        """Top decoder states H (B x T x D) and the encoder output, as the model's
        ``forward(..., features_only=True)`` gives them."""
        master = self.plan.master
        src_tokens, prev_output_tokens = src_tokens.to(master), prev_output_tokens.to(master)
        if self.plain:
            features, extra = self.model(
                src_tokens, src_lengths, prev_output_tokens, features_only=True
            )
            return features, extra["encoder_out"]
        encoder, decoder = self.model.encoder, self.model.decoder
        tokens = encoder.right_pad(src_tokens)
        input_feeding = decoder.input_feeding
        # random draws in the plain model's order (see dropout.py)
        source = encoder.embed(tokens)
        masks = {ENCODER: encoder.stack.draw_masks(source.size(0), source.size(1), source)}
        top_device = self.plan.device_of_layer(encoder.num_layers - 1)
        top_mask = encoder.top_mask(
            (source.size(0), source.size(1), encoder.hidden_size), source, top_device
        )
        target = None
        if not input_feeding:
            target = decoder.embed(prev_output_tokens)
            masks[DECODER] = decoder.stack.draw_masks(target.size(0), target.size(1), target)
        out = self.pipeline.run(source, src_lengths, target, masks)
        encoder_out = encoder.package(
            out.encoder_top, out.encoder_finals, tokens,
            encoder.source_shift(src_tokens, tokens), top_mask,
        )
        if input_feeding:
            # HybridNMT-IF: H_c of step t-1 feeds step t, so the decoder cannot be chunked
            # in time: it runs step by step across its layers' devices, attention and
            # combine on device 0; only the output layer and loss are split by sentences.
            features, _ = decoder.extract_features(prev_output_tokens, encoder_out)
            return features, encoder_out
        return out.decoder_top.transpose(0, 1), encoder_out

    # ------------------------------------------------------- data parallel
    def head_loss(
        self, features: Tensor, encoder_out: EncoderOut, target: Tensor, loss_fn: TokenLoss
    ) -> HeadLoss:
        head = self.model.decoder.head
        if self.plan.head_devices == 1:
            device = self.plan.master
            encoder_out = {k: v.to(device) for k, v in encoder_out.items()
                           if k in ("encoder_out", "encoder_padding_mask")}
            return loss_fn(head, features.to(device), encoder_out, target.to(device))
        bounds = shard_bounds(target.size(0), self.plan.num_devices)
        tokens_per_sentence = loss_fn.selection(target).sum(dim=1).tolist()
        mask = None
        if not loss_fn.features_are_combined:  # drawn here, once, in the plain order
            mask = head.combine_mask((sum(tokens_per_sentence), head.combined_dim), features)
        shards: List[Tuple[int, Tuple[int, int], Tuple[int, int]]] = []
        last = 0
        for index, (start, end) in enumerate(bounds):
            first, last = last, last + sum(tokens_per_sentence[start:end])
            if end > start:
                shards.append((index, (start, end), (first, last)))
        sources, padding = encoder_out["encoder_out"], encoder_out["encoder_padding_mask"]
        if torch.is_grad_enabled() and not self.all_cuda:
            master = self.plan.master
            return staged_shard_losses(
                head, loss_fn, self.head_replicas, self.workers, self.plan.devices, shards,
                features.to(master), sources.to(master), padding, target, mask,
            )
        inputs = [
            (
                *(t[start:end].to(self.plan.devices[index])
                  for t in (features, sources, padding, target)),
                None if mask is None else mask[first:last].to(self.plan.devices[index]),
            )
            for index, (start, end), (first, last) in shards
        ]
        results = self._run_shards(head, loss_fn, [index for index, _, _ in shards], inputs)
        master = self.plan.master
        n_correct = [r.n_correct for r in results if r.n_correct is not None]
        return HeadLoss(
            torch.stack([r.loss.to(master) for r in results]).sum(),
            torch.stack([r.nll_loss.to(master) for r in results]).sum(),
            torch.stack([c.to(master) for c in n_correct]).sum() if n_correct else None,
        )

    @property
    def all_cuda(self) -> bool:
        """Every device a GPU: autograd runs one thread per GPU, so torch's replicate /
        parallel_apply suffice; otherwise the shards run forward and backward on the
        workers (``head_shards``), with head replicas instead of swapping one module's
        parameters from several threads."""
        return all(d.type == "cuda" for d in self.plan.devices)

    def _run_shards(
        self,
        head: AttentionHead,
        loss_fn: TokenLoss,
        shards: List[int],
        inputs: List[Tuple[Optional[Tensor], ...]],
    ) -> List[HeadLoss]:
        """Every GPU: torch's replicate/parallel_apply (differentiable). Otherwise this runs
        only without grad (evaluation): each shard on its worker with its head replica."""
        devices = [self.plan.devices[index] for index in shards]
        if self.all_cuda:
            return parallel_apply(replicate(ShardLoss(head, loss_fn), devices), inputs, devices=devices)

        def shard_task(index: int, shard_inputs: Tuple[Optional[Tensor], ...]) -> Callable[[], HeadLoss]:
            module = ShardLoss(self.head_replicas.for_shard(index, head, self.plan.devices[index]), loss_fn)
            return lambda: module(*shard_inputs)

        return self.workers.run_all(
            [(index, f"head shard {index}", shard_task(index, shard_inputs))
             for index, shard_inputs in zip(shards, inputs)]
        )
