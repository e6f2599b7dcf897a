"""``hybrid_lstm``'s options (a fairseq dataclass config), its presets and their validation.

Option names reuse those of fairseq's ``lstm`` model where the two overlap. The sizes a
preset owns (``model/presets.py``) default to None in the dataclass, meaning "the preset's value":
fairseq fills a config with the dataclass defaults before a preset function runs under
``fairseq-hydra-train`` (and the preset fills only what is unset), so a concrete default
would silently win over the preset. ``apply_preset`` fills the Nones; a value the user
gave (command line, YAML key, Hydra override) is never None and always wins.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from ..errors import require
from ..model.presets import BASE_PRESET, PRESETS


@dataclass
class HybridLSTMConfig(FairseqDataclass):
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    encoder_embed_dim: Optional[int] = field(
        default=None, metadata={"help": "encoder embedding dimension (default: the preset's)"}
    )
    encoder_hidden_size: Optional[int] = field(
        default=None, metadata={"help": "encoder hidden size (default: the preset's)"}
    )
    encoder_layers: Optional[int] = field(
        default=None, metadata={"help": "number of encoder layers (default: the preset's)"}
    )
    encoder_dropout_in: Optional[float] = field(
        default=None,
        metadata={"help": "dropout on the encoder input embedding (default: --dropout)"},
    )
    encoder_dropout_out: Optional[float] = field(
        default=None,
        metadata={
            "help": "dropout between encoder layers and on S (default: the preset's, else --dropout)"
        },
    )
    decoder_embed_dim: Optional[int] = field(
        default=None, metadata={"help": "decoder embedding dimension (default: the preset's)"}
    )
    decoder_hidden_size: Optional[int] = field(
        default=None, metadata={"help": "decoder hidden size (default: the preset's)"}
    )
    decoder_layers: Optional[int] = field(
        default=None,
        metadata={"help": "number of decoder layers (must equal --encoder-layers; default: the preset's)"},
    )
    decoder_out_embed_dim: Optional[int] = field(
        default=None,
        metadata={"help": "size of the combined state H_c fed to the output layer (default: the preset's)"},
    )
    decoder_dropout_in: Optional[float] = field(
        default=None,
        metadata={"help": "dropout on the decoder input embedding (default: --dropout)"},
    )
    decoder_dropout_out: Optional[float] = field(
        default=None,
        metadata={
            "help": "dropout between decoder layers and on H_c (default: the preset's, else --dropout)"
        },
    )
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "share decoder input and output embeddings"}
    )
    share_all_embeddings: bool = field(
        default=False,
        metadata={
            "help": "share encoder, decoder and output embeddings "
            "(needs a joined dictionary and equal embed dims)"
        },
    )
    input_feeding: bool = field(
        default=False,
        metadata={
            "help": "feed H_c of step t-1 into step t (HybridNMT-IF ablation; the decoder "
            "then runs step by step)"
        },
    )
    hybrid_devices: Optional[str] = field(
        default=None,
        metadata={
            "help": "training only: the devices this process drives, comma-separated: "
            "cuda:0,cuda:1,... or GPU indices 0,1,... or cpu,cpu,... (CPU devices, one "
            "worker thread each). Encoder and decoder layer i go to device i in contiguous "
            "blocks; the head is split by sentences over all of them. Default: this "
            "process's GPU, else cpu. Generation always uses one device."
        },
    )
    # fairseq already defines --pipeline-chunks (default 0, for --pipeline-model-parallel);
    # this field shares its value: 0 is "not given", and ``auto`` is stored as 0 too. The
    # gate (``placement_options``) reads it as AUTO: 1 on one device, else the K the
    # performance model predicts fastest, measured on the first batch (chunking/auto_chunks.py).
    pipeline_chunks: Optional[int] = field(
        default=0,
        metadata={
            "help": "training only: time chunks per batch for the layer pipeline, or auto "
            "(0 = auto: 1 on one device, else measured and chosen before the first update)"
        },
    )
    hybrid_balance: Optional[str] = field(
        default=None,
        metadata={
            "help": "training only: layers per device, e.g. 2,1,1 (default: contiguous and "
            "as even as possible)"
        },
    )
    hybrid_head_on_master: bool = field(
        default=False,
        metadata={
            "help": "training only: run attention, combine, output layer and loss for all "
            "sentences on the master head's device (the top layers') instead of splitting "
            "them over the devices (model parallelism only; the benchmark's configuration (d))"
        },
    )
    hybrid_allow_repeated_devices: bool = field(
        default=False,
        metadata={
            "help": "training only: accept a GPU listed more than once in --hybrid-devices "
            "(e.g. cuda:0,cuda:0: two workers on one GPU), to run the multi-device code on "
            "one GPU for checks; it is not faster"
        },
    )
    max_source_positions: int = II("task.max_source_positions")
    max_target_positions: int = II("task.max_target_positions")


def apply_preset(cfg: Any, preset: str) -> None:
    """Give every option ``preset`` owns that is unset (missing or None) the preset's
    value, then the same for hybrid_lstm's. ``cfg``: an argparse namespace, a dataclass
    or an omegaconf config (which must accept the keys: struct configs hold them all)."""
    for name in (preset, BASE_PRESET):
        for key, value in PRESETS[name].items():
            if getattr(cfg, key, None) is None:
                setattr(cfg, key, value)


def dropout_or_default(value: Optional[float], default: float) -> float:
    return default if value is None else value


def effective(cfg: Any, name: str) -> Any:
    """The option's value, or hybrid_lstm's default when it is unset (while fairseq
    parses, unset dataclass options are missing or None)."""
    value = getattr(cfg, name, None)
    if value is None:
        value = PRESETS[BASE_PRESET].get(name, HybridLSTMConfig.__dataclass_fields__[name].default)
    return value


def validate_model_config(cfg: Any) -> None:
    """Reject bad model options with one clear line. ``cfg`` is an argparse namespace or
    an omegaconf/dataclass config."""
    for name in (
        "encoder_layers", "decoder_layers", "encoder_embed_dim", "encoder_hidden_size",
        "decoder_embed_dim", "decoder_hidden_size", "decoder_out_embed_dim",
    ):
        value = getattr(cfg, name, None)
        if value is not None:
            require(
                isinstance(value, int) and value >= 1,
                "--" + name.replace("_", "-"), value, "an integer >= 1",
            )
    for name in (
        "dropout", "encoder_dropout_in", "encoder_dropout_out",
        "decoder_dropout_in", "decoder_dropout_out",
    ):
        value = getattr(cfg, name, None)
        if value is not None:
            require(0.0 <= value < 1.0, "--" + name.replace("_", "-"), value, "a value in [0, 1)")
    enc, dec = effective(cfg, "encoder_layers"), effective(cfg, "decoder_layers")
    require(
        enc == dec, "--decoder-layers", dec,
        f"must equal --encoder-layers ({enc}): decoder layer l starts from encoder "
        "layer l's final state",
    )
    enc_embed, dec_embed = effective(cfg, "encoder_embed_dim"), effective(cfg, "decoder_embed_dim")
    out_embed = effective(cfg, "decoder_out_embed_dim")
    if effective(cfg, "share_all_embeddings"):
        require(
            enc_embed == dec_embed, "--share-all-embeddings with --decoder-embed-dim",
            dec_embed, f"must equal --encoder-embed-dim ({enc_embed})",
        )
    if effective(cfg, "share_all_embeddings") or effective(cfg, "share_decoder_input_output_embed"):
        require(
            out_embed == dec_embed, "--decoder-out-embed-dim", out_embed,
            f"with shared output embeddings it must equal --decoder-embed-dim ({dec_embed})",
        )
