"""``hybrid_lstm``'s options (a fairseq dataclass config) and their validation.

Option names reuse those of fairseq's ``lstm`` model where the two overlap. The field
defaults are the ``hybrid_lstm`` preset (2+2 layers x 256 units); other presets live in
``model.py`` as fairseq architectures.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from .errors import require


@dataclass
class HybridLSTMConfig(FairseqDataclass):
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    encoder_embed_dim: int = field(default=256, metadata={"help": "encoder embedding dimension"})
    encoder_hidden_size: int = field(default=256, metadata={"help": "encoder hidden size"})
    encoder_layers: int = field(default=2, metadata={"help": "number of encoder layers"})
    encoder_dropout_in: Optional[float] = field(
        default=None,
        metadata={"help": "dropout on the encoder input embedding (default: --dropout)"},
    )
    encoder_dropout_out: Optional[float] = field(
        default=None,
        metadata={"help": "dropout between encoder layers and on S (default: --dropout)"},
    )
    decoder_embed_dim: int = field(default=256, metadata={"help": "decoder embedding dimension"})
    decoder_hidden_size: int = field(default=256, metadata={"help": "decoder hidden size"})
    decoder_layers: int = field(
        default=2, metadata={"help": "number of decoder layers (must equal --encoder-layers)"}
    )
    decoder_out_embed_dim: int = field(
        default=256, metadata={"help": "size of the combined state H_c fed to the output layer"}
    )
    decoder_dropout_in: Optional[float] = field(
        default=None,
        metadata={"help": "dropout on the decoder input embedding (default: --dropout)"},
    )
    decoder_dropout_out: Optional[float] = field(
        default=None,
        metadata={"help": "dropout between decoder layers and on H_c (default: --dropout)"},
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
    # this field shares its value. 0 = automatic: 1 on one device, else 2 x devices.
    pipeline_chunks: Optional[int] = field(
        default=0,
        metadata={
            "help": "training only: time chunks per batch for the layer pipeline "
            "(0 = 1 on one device, else 2 x devices)"
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
            "sentences on device 0 instead of splitting them over the devices (model "
            "parallelism only; the benchmark's configuration (d))"
        },
    )
    max_source_positions: int = II("task.max_source_positions")
    max_target_positions: int = II("task.max_target_positions")


def dropout_or_default(value: Optional[float], default: float) -> float:
    return default if value is None else value


def effective(cfg: Any, name: str) -> Any:
    """The option's value, or the preset default when the command line left it unset
    (while fairseq parses, unset dataclass options are None)."""
    value = getattr(cfg, name, None)
    if value is None:
        value = HybridLSTMConfig.__dataclass_fields__[name].default
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
