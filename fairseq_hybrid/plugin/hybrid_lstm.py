"""``hybrid_lstm``: fairseq registration, construction and presets of the HybridNMT model
(Luong-style stacked LSTM encoder-decoder, global "general" attention, no input feeding).

``forward(..., features_only=True)`` returns the top decoder states H and the encoder
output, which is all the ``hybrid_cross_entropy`` criterion needs to run the head itself.
"""
from __future__ import annotations

import ast
import logging
from types import SimpleNamespace
from typing import Any, Callable, Optional

from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    register_model,
    register_model_architecture,
)
from ..model.decoder import HybridLSTMDecoder
from ..model.encoder import HybridLSTMEncoder
from ..model.initialized_layers import embedding
from ..model.network import HybridLSTMNetwork
from ..parallel.runtime import HybridRuntime
from ..chunking.auto_chunks import choose_for_batch
from .checks import check_state_dict, run_checks
from .config import (
    BASE_PRESET,
    HybridLSTMConfig,
    apply_preset,
    dropout_or_default,
    validate_model_config,
)
from ..errors import HybridConfigError
from .integration import adapt_fairseq_defaults
from .placement_options import PlacementOptions, placement_options

MODEL_NAME = "hybrid_lstm"
logger = logging.getLogger(__name__)


@register_model(MODEL_NAME, dataclass=HybridLSTMConfig)
class HybridLSTMModel(HybridLSTMNetwork):
    """The network (``model.network``) as fairseq builds, loads and trains it: its
    ``runtime`` (``parallel.runtime.HybridRuntime``) trains it over ``--hybrid-devices``,
    with ``--pipeline-chunks auto`` chosen by the performance model."""

    def __init__(self, encoder: HybridLSTMEncoder, decoder: HybridLSTMDecoder,
                 placement: Optional[PlacementOptions] = None) -> None:
        super().__init__(encoder, decoder)
        self.runtime: HybridRuntime = HybridRuntime(
            self, placement or PlacementOptions(), choose_chunks=choose_for_batch,
        )

    def load_state_dict(self, state_dict, strict: bool = True, model_cfg=None, args=None):
        """fairseq's loading, after checking keys and shapes so a checkpoint of another
        architecture or dictionary is reported in one line."""
        if strict:
            check_state_dict(self.state_dict(), state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def prepare_for_inference_(self, cfg: Any) -> None:
        """fairseq-generate/-interactive: one device (fairseq's) unless the user asks for
        several with ``--model-overrides "{'hybrid_devices': 'cuda:0,cuda:1'}"``; the
        devices a checkpoint was trained on are ignored."""
        super().prepare_for_inference_(cfg)
        overrides = getattr(getattr(cfg, "common_eval", None), "model_overrides", None) or "{}"
        requested = ast.literal_eval(overrides) if isinstance(overrides, str) else dict(overrides)
        if requested.get("hybrid_devices"):
            layers = (self.encoder.num_layers, self.decoder.num_layers)
            self.runtime.options = placement_options(SimpleNamespace(**requested), layers)
            plan = self.runtime.plan(chunks=1)
            self.runtime.place(plan)
            logger.info("generation placement:\n" + plan.table())

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
        # the devices of a checkpoint's config are the ones it trained on: generation ignores
        # them (``prepare_for_inference_``), so they need not exist on this machine
        return cls(encoder, decoder, placement_options(cfg, on_this_machine=False))


def parse_time_checks(args: Any) -> None:
    """Runs while fairseq-train parses the command line (fairseq calls the --arch function
    there), so bad values stop the run before any file is touched. fairseq also calls an
    architecture function from ``build_model`` with the model's config alone (a preset
    named under fairseq-hydra-train, or read back from a checkpoint): there is no run to
    check or adapt then (``hydra_callback`` did both before fairseq started; ``build_model``
    reads the model's options)."""
    if not hasattr(args, "distributed_world_size"):
        return
    devices = run_checks(args).all_devices()  # the one list, shared with fairseq-hydra-train
    adapt_fairseq_defaults(args, sum(1 for d in set(devices) if d.type == "cuda"), len(devices))


def preset_architecture(preset: str) -> Callable[[Any], None]:
    def architecture(args: Any) -> None:
        apply_preset(args, preset)
        parse_time_checks(args)

    architecture.__name__ = architecture.__qualname__ = preset
    architecture.__doc__ = f"The {preset} preset (model/presets.py), then the parse-time checks."
    return architecture


# register_model(..., dataclass=...) registers a no-op architecture under the model's own
# name; swap in the preset and the parse-time checks.
ARCH_CONFIG_REGISTRY[MODEL_NAME] = preset_architecture(MODEL_NAME)

# fairseq's lstm_luong_wmt_en_de sizes (4+4 layers x 1000) without input feeding.
hybrid_lstm_wmt_en_de = register_model_architecture(MODEL_NAME, "hybrid_lstm_wmt_en_de")(
    preset_architecture("hybrid_lstm_wmt_en_de")
)
