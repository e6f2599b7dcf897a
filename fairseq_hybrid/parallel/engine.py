"""The hybrid engine: runs ``hybrid_lstm`` for training over a placement plan.

- the model is placed before (``runtime.HybridRuntime``, ``placement.place``: each LSTM
  layer on its device, embeddings and bridges on device 0, the master head with the top
  layers), and the
  plan's chunk count is an integer (``AUTO`` is resolved before, by ``runtime``).
- ``features`` runs the model-parallel part: embeddings, then the wavefront pipeline.
- ``head_loss`` runs the data-parallel part: sentences split into one shard per device,
  each shard's forward and backward on its device's worker with its own head replica
  (``head_shards.py``), shard losses summed on device 0; the head gradients are reduced to
  the master copy and dH, dS go back into the pipeline.
- the head's two collectives (the replicas' parameters broadcast at the step's start,
  their gradients reduced after the head's backward) run on the engine's collective worker
  (``collective_worker.py``) while the pipeline's cells run, each waited on where its result
  is used (``head_collectives.py``).

Every device kind runs the same code: the only device-specific lines are tensor placement
and copies, and each CUDA worker thread setting its current device (``worker.py``).

Generation never uses the engine: it runs the plain model on one device.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..model.dropout import MaskQueue
from ..model.encoder import EncoderOut
from .interface import HybridModel
from .collective_worker import CollectiveWorker
from .head_collectives import HeadGradients, HeadReplicas
from .head_shards import ShardInputs, plan_shards, sentence_shards, sharded_head_loss
from ..model.loss import HeadLoss, TokenLoss
from .pipeline import WavefrontPipeline, pipeline_inputs
from .placement import PlacementPlan
from .transfer import TransferLedger, Transfers
from .worker import DeviceWorkers



class HybridEngine:
    """One training step's model-parallel and data-parallel parts over ``plan``, run by
    ``workers`` (one per device of the plan)."""

    def __init__(self, model: HybridModel, plan: PlacementPlan, workers: DeviceWorkers) -> None:
        self.model = model
        self.plan = plan
        self.workers = workers
        self.transfers = Transfers(plan.devices)
        self.collectives = CollectiveWorker(plan.devices)
        workers.on_close.append(self.collectives.close)
        self.head_replicas = HeadReplicas(self.transfers, plan.head_device, self.collectives)
        self._gradients: Optional[HeadGradients] = None  # the gate of the step's features
        self.pipeline = WavefrontPipeline.for_model(model, plan, workers, self.transfers)

    @property
    def ledger(self) -> TransferLedger:
        """Bytes copied between devices per route and phase, since the last ``clear``."""
        return self.transfers.ledger

    @property
    def head_input_devices(self) -> Tuple[int, int]:
        """Device indices of H and of S as ``features`` returns them: the top layers'
        device (device 0 on one device), except H of input feeding's step-by-step decoder,
        which attends and combines on device 0."""
        top = self.plan.layer_device[-1]
        return (0 if self.model.decoder.input_feeding else top), top

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
        self._gradients = None
        if self.plan.head_devices > 1:  # the head's replicas, while the pipeline starts
            head = self.model.decoder.head
            shards = sentence_shards(src_tokens.size(0), self.plan.num_devices)
            self.head_replicas.refresh(head, [worker for worker, _ in shards])
            self._gradients = HeadGradients.for_head(head)
        # the masks are queued, then drawn (in the same order) while the pipeline runs
        queue = MaskQueue()
        draws = self.model.draw_step(src_tokens, prev_output_tokens, queue=queue,
                                     top_device=self.plan.devices[self.plan.layer_device[-1]])
        source, target, masks = pipeline_inputs(draws)
        if self._gradients is not None:  # the head's reduced gradients arrive behind the pipeline
            source = self._gradients.gate(source)
        out = self.pipeline.run(source, src_lengths, target, masks, draw_ahead=queue.draw_next)
        queue.draw_all()  # what no cycle needed (the top mask) before anything else draws
        if draws.decoder is None:
            # HybridNMT-IF: H_c of step t-1 feeds step t, so the decoder cannot be chunked
            # in time: it runs step by step across its layers' devices (the model's own
            # copies, not in the ledger), attention and combine on device 0; only the output
            # layer and loss are split by sentences.
            encoder_out = self.model.encoder.output(
                out.encoder_top, out.encoder_finals, src_tokens, draws.encoder
            )
            features, _ = self.model.decoder.extract_features(prev_output_tokens, encoder_out)
            return features, encoder_out
        encoder_out = self.model.encoder.attention_inputs(out.encoder_top, draws.encoder)
        return out.decoder_top.transpose(0, 1), encoder_out

    # ------------------------------------------------------- data parallel
    def head_loss(
        self, features: Tensor, encoder_out: EncoderOut, target: Tensor, loss_fn: TokenLoss
    ) -> HeadLoss:
        """The head's summed loss: on the master head's device alone (one device, or
        a plan without ``split_head``), else split by sentences over every device
        (``head_shards``), the same way for every device kind."""
        head = self.model.decoder.head
        master = self.plan.master
        from_h, from_s = self.head_input_devices
        padding_mask = encoder_out["encoder_padding_mask"].to(master)  # made on device 0
        sources, target = encoder_out["encoder_out"], target.to(master)
        if self.plan.head_devices == 1:  # H and S gathered on the head's device, grads back
            root, move = self.plan.head_device, self.transfers
            features = move.differentiable(features, from_h, root, "head_forward", "head_backward")
            sources = move.differentiable(sources, from_s, root, "head_forward", "head_backward")
            encoder_out = {"encoder_out": sources, "encoder_padding_mask":
                           move.to(padding_mask, 0, root, "head_forward")}
            return loss_fn(head, features, encoder_out, move.to(target, 0, root, "head_forward"))
        tokens_per_sentence = loss_fn.selection(target).sum(dim=1).tolist()
        mask = None
        if not loss_fn.features_are_combined:  # drawn here, once, in the plain order
            like = torch.empty(0, dtype=features.dtype, device=master)
            mask = head.combine_mask((sum(tokens_per_sentence), head.combined_dim), like)
        # each shard takes its slices of H and S straight from the top layers' devices
        inputs = ShardInputs(features, sources, padding_mask, target, mask, from_h, from_s)
        gradients, self._gradients = self._gradients, None
        return sharded_head_loss(
            head, loss_fn, self.head_replicas, self.workers,
            plan_shards(tokens_per_sentence, self.plan.num_devices), inputs, gradients,
        )
