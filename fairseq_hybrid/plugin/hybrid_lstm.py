"""``hybrid_lstm``: fairseq registration, construction and presets of the HybridNMT model
(Luong-style stacked LSTM encoder-decoder, global "general" attention, no input feeding).

``forward(..., features_only=True)`` returns the top decoder states H and the encoder
output, which is all the ``hybrid_cross_entropy`` criterion needs to run the head itself.
"""
from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    FairseqEncoderDecoderModel,
    register_model,
    register_model_architecture,
)
from .checks import check_data_dir, check_precision, check_state_dict, check_training_sizes
from .config import (
    BASE_PRESET,
    HybridLSTMConfig,
    apply_preset,
    dropout_or_default,
    validate_model_config,
)
from ..model.decoder import DecoderDraws, HybridLSTMDecoder
from ..model.encoder import EncoderDraws, HybridLSTMEncoder
from ..parallel.engine import HybridEngine
from ..errors import HybridConfigError
from .integration import adapt_fairseq_defaults, skip_overlong_interactive_input
from ..model.initialized_layers import embedding
from ..parallel.placement import PlacementPlan, build_plan, check_plan_options

MODEL_NAME = "hybrid_lstm"
logger = logging.getLogger(__name__)


@dataclass
class StepDraws:
    """``HybridLSTMModel.draw_step``'s draws: the encoder's, and the decoder's (None with
    input feeding)."""

    encoder: EncoderDraws
    decoder: Optional[DecoderDraws]


@register_model(MODEL_NAME, dataclass=HybridLSTMConfig)
class HybridLSTMModel(FairseqEncoderDecoderModel):
    def __init__(
        self,
        encoder: HybridLSTMEncoder,
        decoder: HybridLSTMDecoder,
        placement_options: Optional[dict] = None,
    ) -> None:
        super().__init__(encoder, decoder)
        self.placement_options = placement_options or {}
        self._hybrid_engine: Optional[HybridEngine] = None

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        features_only: bool = False,
        hybrid: bool = False,
        **kwargs: Any,
    ):
        """``hybrid=True`` (the criterion's call, so a data-parallel wrapper sees it) runs
        the model-parallel part through the engine and returns (H, {"encoder_out": ...})."""
        if hybrid:
            features, encoder_out = self.hybrid_engine().features(
                src_tokens, src_lengths, prev_output_tokens
            )
            return features, {"encoder_out": encoder_out, "attn": None}
        draws = self.draw_step(src_tokens, prev_output_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, draws=draws.encoder, **kwargs)
        return self.decoder(
            prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
            draws=draws.decoder, **kwargs,
        )

    def draw_step(
        self, src_tokens: Tensor, prev_output_tokens: Tensor,
        top_device: Optional[torch.device] = None,
    ) -> StepDraws:
        """Every random number of a training forward pass before the head, in the one order
        the plain model, the hybrid engine and the benchmarks share: the encoder's
        (embeddings, between-layer masks, top mask), then the decoder's (embeddings,
        between-layer masks; with input feeding the decoder draws step by step as it runs).
        The head draws its combine mask last. Drawing on the calling thread, over whole
        tensors, is what makes a run's numbers independent of devices and chunks
        (``dropout.py``)."""
        encoder = self.encoder.draw_inputs(src_tokens, top_device)
        decoder = None
        if not self.decoder.input_feeding:
            decoder = self.decoder.draw_inputs(prev_output_tokens)
        return StepDraws(encoder, decoder)

    def load_state_dict(self, state_dict, strict: bool = True, model_cfg=None, args=None):
        """fairseq's loading, after checking keys and shapes so a checkpoint of another
        architecture or dictionary is reported in one line."""
        if strict:
            check_state_dict(self.state_dict(), state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def plan_from(self, options: dict) -> PlacementPlan:
        return build_plan(
            options.get("hybrid_devices"),
            options.get("hybrid_balance"),
            options.get("pipeline_chunks"),
            self.encoder.num_layers,
            self.decoder.num_layers,
            not options.get("hybrid_head_on_master", False),
            bool(options.get("hybrid_allow_repeated_devices", False)),
        )

    def place(self, plan: PlacementPlan) -> None:
        """Put each LSTM layer on its device; embeddings, bridges and the master head on
        device 0. Parameter names and shapes do not change (checkpoints stay portable)."""
        self.__dict__["_plan"] = plan
        encoder, decoder, master = self.encoder, self.decoder, plan.master
        for module in (encoder.embed_tokens, decoder.embed_tokens, decoder.head):
            module.to(master)
        if decoder.bridge_hidden is not None:
            decoder.bridge_hidden.to(master)
            decoder.bridge_cell.to(master)
        for stack in (encoder.stack, decoder.stack):
            for index, layer in enumerate(stack.layers):
                layer.to(plan.device_of_layer(index))

    def hybrid_engine(self, cpu_threads: Optional[int] = None) -> HybridEngine:
        """The training engine for ``--hybrid-devices``/``--pipeline-chunks``, built (and
        the model placed) on first use by the criterion. Generation does not use it.
        ``cpu_threads``: torch threads per CPU device worker (default: cores split)."""
        if self._hybrid_engine is None:
            self._hybrid_engine = self.build_engine(cpu_threads)
            logger.info("\n" + self._hybrid_engine.plan.table())
        return self._hybrid_engine

    def build_engine(self, cpu_threads: Optional[int] = None, **options: Any) -> HybridEngine:
        """A new engine for the placement options updated by ``options``, the model placed
        for it; the model keeps training through its current engine until ``use_engine``."""
        plan = self.plan_from({**self.placement_options, **options})
        self.place(plan)
        return HybridEngine(self, plan, cpu_threads)

    def use_engine(self, engine: HybridEngine) -> None:
        """Train through ``engine`` (from ``build_engine``) from now on. The previous engine
        is left running: a benchmark keeps several placements warm and closes them itself."""
        self.place(engine.plan)
        self._hybrid_engine = engine

    def configure_parallel(self, cpu_threads: Optional[int] = None, **options: Any) -> HybridEngine:
        """Train on another placement from now on: ``options`` update the placement options
        (``hybrid_devices``, ``pipeline_chunks``, ``hybrid_balance``,
        ``hybrid_head_on_master``, ``hybrid_allow_repeated_devices``); the old engine's
        workers are closed and a new engine is built and returned."""
        self.close_engine()
        self.placement_options = {**self.placement_options, **options}
        return self.hybrid_engine(cpu_threads)

    def close_engine(self) -> None:
        """Stop the training engine's worker threads (a new one is built on next use)."""
        if self._hybrid_engine is not None:
            self._hybrid_engine.close()
            self._hybrid_engine = None

    def prepare_for_inference_(self, cfg: Any) -> None:
        """fairseq-generate/-interactive: one device (fairseq's) unless the user asks for
        several with ``--model-overrides "{'hybrid_devices': 'cuda:0,cuda:1'}"``; the
        devices a checkpoint was trained on are ignored."""
        super().prepare_for_inference_(cfg)
        skip_overlong_interactive_input(cfg)
        overrides = getattr(getattr(cfg, "common_eval", None), "model_overrides", None) or "{}"
        requested = ast.literal_eval(overrides) if isinstance(overrides, str) else dict(overrides)
        if requested.get("hybrid_devices"):
            plan = self.plan_from({**requested, "pipeline_chunks": 1})
            self.place(plan)
            logger.info("generation placement:\n" + plan.table())

    def __getstate__(self) -> dict:
        """Copies (``copy.deepcopy`` for fairseq's --ema, pickling) leave the training
        engine and its worker threads behind; a copy builds its own when it trains."""
        state = dict(super().__getstate__())
        state["_hybrid_engine"] = None
        return state

    def _apply(self, fn, *args, **kwargs) -> nn.Module:
        """Keep the placement through ``model.to(device)``/``.half()`` (fairseq's Trainer)."""
        result = super()._apply(fn, *args, **kwargs)
        plan = self.__dict__.get("_plan")
        if plan is not None:
            self.place(plan)
        return result

    @classmethod
    def build_model(cls, cfg: HybridLSTMConfig, task: Any) -> "HybridLSTMModel":
        # fairseq calls no architecture function for the model's own name
        # (``_name: hybrid_lstm`` under Hydra): its preset-owned sizes are still None
        apply_preset(cfg, BASE_PRESET)
        validate_model_config(cfg)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        encoder_embed = embedding(len(src_dict), cfg.encoder_embed_dim, src_dict.pad())
        share_output = cfg.share_decoder_input_output_embed
        if cfg.share_all_embeddings:
            if src_dict != tgt_dict:
                raise HybridConfigError(
                    "--share-all-embeddings needs a joined dictionary "
                    "(fairseq-preprocess --joined-dictionary)"
                )
            decoder_embed, share_output = encoder_embed, True
        else:
            decoder_embed = embedding(len(tgt_dict), cfg.decoder_embed_dim, tgt_dict.pad())
        encoder = HybridLSTMEncoder(
            src_dict,
            encoder_embed,
            hidden_size=cfg.encoder_hidden_size,
            num_layers=cfg.encoder_layers,
            dropout_in=dropout_or_default(cfg.encoder_dropout_in, cfg.dropout),
            dropout_out=dropout_or_default(cfg.encoder_dropout_out, cfg.dropout),
            max_source_positions=cfg.max_source_positions,
        )
        decoder = HybridLSTMDecoder(
            tgt_dict,
            decoder_embed,
            hidden_size=cfg.decoder_hidden_size,
            num_layers=cfg.decoder_layers,
            out_embed_dim=cfg.decoder_out_embed_dim,
            encoder_hidden_size=cfg.encoder_hidden_size,
            dropout_in=dropout_or_default(cfg.decoder_dropout_in, cfg.dropout),
            dropout_out=dropout_or_default(cfg.decoder_dropout_out, cfg.dropout),
            share_input_output_embed=share_output,
            input_feeding=cfg.input_feeding,
            max_target_positions=cfg.max_target_positions,
        )
        placement_options = {
            name: getattr(cfg, name, None)
            for name in ("hybrid_devices", "hybrid_balance", "pipeline_chunks",
                         "hybrid_head_on_master", "hybrid_allow_repeated_devices")
        }
        return cls(encoder, decoder, placement_options)


def parse_time_checks(args: Any) -> None:
    """Runs while fairseq-train parses the command line (fairseq calls the --arch function
    there), so bad values stop the run before any file is touched. fairseq also calls an
    architecture function from ``build_model`` with the model's config alone (a preset
    named under fairseq-hydra-train): there are no run options to adapt then
    (``hydra_callback`` adapted them before fairseq started)."""
    validate_model_config(args)
    check_precision(args)
    check_data_dir(args)
    check_training_sizes(args)
    plan = check_plan_options(args)
    if hasattr(args, "distributed_world_size"):
        adapt_fairseq_defaults(args, sum(1 for d in set(plan.devices) if d.type == "cuda"))
    from .criterion import validate_criterion_args

    validate_criterion_args(args)


def preset_architecture(preset: str) -> Callable[[Any], None]:
    def architecture(args: Any) -> None:
        apply_preset(args, preset)
        parse_time_checks(args)

    architecture.__name__ = architecture.__qualname__ = preset
    architecture.__doc__ = f"The {preset} preset (config.PRESETS), then the parse-time checks."
    return architecture


# register_model(..., dataclass=...) registers a no-op architecture under the model's own
# name; swap in the preset and the parse-time checks.
ARCH_CONFIG_REGISTRY[MODEL_NAME] = preset_architecture(MODEL_NAME)

# fairseq's lstm_luong_wmt_en_de sizes (4+4 layers x 1000) without input feeding.
hybrid_lstm_wmt_en_de = register_model_architecture(MODEL_NAME, "hybrid_lstm_wmt_en_de")(
    preset_architecture("hybrid_lstm_wmt_en_de")
)
