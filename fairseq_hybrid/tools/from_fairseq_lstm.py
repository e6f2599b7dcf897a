"""Weights between fairseq's own ``--arch lstm`` and ``hybrid_lstm --input-feeding``: the two
are one network (tests/test_from_fairseq_lstm.py), laid out under other names.

``lstm_to_hybrid`` maps a fairseq ``lstm`` state dict onto ``hybrid_lstm --input-feeding``
(``hybrid_options`` gives that model's options), ``hybrid_to_lstm`` maps back. Parameters
are renamed, except one: the attention's output projection W_c, whose input fairseq
concatenates as [context; h] and hybrid_lstm as [h; context], so its two column blocks
swap. A shared output layer (``--share-decoder-input-output-embed``/``--share-all-
embeddings``) is the decoder embedding in both.

fairseq ``lstm`` configurations that are another network, refused with one line:
``--encoder-bidirectional``, ``--decoder-attention 0``, ``--decoder-out-embed-dim`` other
than ``--decoder-hidden-size`` (fairseq then adds a projection after the attention and
feeds back the hidden-size vector) and the adaptive softmax (``--criterion adaptive_loss``).
Back to fairseq: hybrid_lstm without ``--input-feeding`` (its first decoder layer never sees
the attention), or with ``--decoder-out-embed-dim`` other than ``--decoder-hidden-size``.

``python -m fairseq_hybrid.tools.from_fairseq_lstm IN.pt OUT.pt`` converts a checkpoint
file: OUT.pt holds the mapped weights and hybrid_lstm's options (fairseq-generate and
-interactive load it with ``--user-dir fairseq_hybrid``), no optimizer state (train on
with ``--finetune-from-model OUT.pt``) and no EMA copy; it is written to a temporary name
and renamed into place.
"""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, utils
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.lstm import (
    DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS, LSTMModel, base_architecture,
)
from omegaconf import OmegaConf
from torch import Tensor

from ..errors import HybridConfigError
from ..plugin.checkpoints import atomic_save
from ..plugin.config import effective

StateDict = Dict[str, Tensor]
GATES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
COMBINE = ("decoder.attention.output_proj.weight", "decoder.head.combine_proj.weight")
TIED_OUTPUT = "decoder.head.output_proj.weight"
# the options of fairseq's lstm that hybrid_lstm has under the same name and meaning
NETWORK_OPTIONS = (
    "dropout", "encoder_embed_dim", "encoder_hidden_size", "encoder_layers", "encoder_dropout_in",
    "encoder_dropout_out", "decoder_embed_dim", "decoder_hidden_size", "decoder_layers",
    "decoder_out_embed_dim", "decoder_dropout_in", "decoder_dropout_out", "share_all_embeddings",
)


def _namespace(options: Any) -> argparse.Namespace:
    """A copy of ``options`` (a Namespace, an omegaconf or plain dict, a dataclass)."""
    if isinstance(options, Mapping):
        return argparse.Namespace(**dict(options))
    return argparse.Namespace(**{k: v for k, v in vars(options).items() if not k.startswith("__")})


def _mappable(condition: bool, model: str, option: str, value: Any, reason: str) -> None:
    if not condition:
        raise HybridConfigError(f"{model} {option} {value!r} cannot be mapped: {reason}")


def lstm_options(args: Any) -> argparse.Namespace:
    """A fairseq ``lstm`` model's options (``cfg.model`` of its checkpoint), completed with
    fairseq's own defaults (``base_architecture``) and checked to be hybrid_lstm's network."""
    args = _namespace(args)
    base_architecture(args)
    lstm = "fairseq lstm"
    _mappable(not args.encoder_bidirectional, lstm, "--encoder-bidirectional", True,
              "hybrid_lstm's encoder is unidirectional")
    _mappable(utils.eval_bool(args.decoder_attention), lstm, "--decoder-attention",
              args.decoder_attention, "hybrid_lstm always attends")
    _mappable(args.decoder_out_embed_dim == args.decoder_hidden_size, lstm,
              "--decoder-out-embed-dim", args.decoder_out_embed_dim,
              f"only --decoder-hidden-size ({args.decoder_hidden_size}) is; fairseq adds a "
              "projection after the attention otherwise, hybrid_lstm has none")
    _mappable(getattr(args, "criterion", None) != "adaptive_loss", lstm, "--criterion",
              "adaptive_loss", "hybrid_lstm has no adaptive softmax")
    _mappable(args.encoder_layers == args.decoder_layers, lstm, "--decoder-layers",
              args.decoder_layers, f"only --encoder-layers ({args.encoder_layers}) is")
    return args


def hybrid_options(args: Any) -> Dict[str, Any]:
    """hybrid_lstm's options (``HybridLSTMConfig`` fields) for the network of the fairseq
    ``lstm`` with options ``args``: the same sizes and dropouts, with input feeding."""
    args = lstm_options(args)
    options = {name: getattr(args, name) for name in NETWORK_OPTIONS}
    options["max_source_positions"] = int(getattr(args, "max_source_positions",
                                              DEFAULT_MAX_SOURCE_POSITIONS))
    options["max_target_positions"] = int(getattr(args, "max_target_positions",
                                              DEFAULT_MAX_TARGET_POSITIONS))
    options["share_decoder_input_output_embed"] = bool(
        args.share_decoder_input_output_embed or args.share_all_embeddings)
    options["input_feeding"] = True
    return options


def _pairs(layers: int, bridge: bool, shared: bool) -> List[Tuple[str, str]]:
    """(fairseq lstm name, hybrid_lstm name) of every parameter but W_c and a tied output."""
    pairs = [("encoder.embed_tokens.weight",) * 2, ("decoder.embed_tokens.weight",) * 2,
             ("decoder.attention.input_proj.weight", "decoder.head.score_proj.weight")]
    for layer in range(layers):
        for gate in GATES:
            pairs.append((f"encoder.lstm.{gate}_l{layer}", f"encoder.stack.layers.{layer}.{gate}_l0"))
            pairs.append((f"decoder.layers.{layer}.{gate}", f"decoder.stack.layers.{layer}.{gate}_l0"))
    if bridge:
        for lstm_name, hybrid_name in (("encoder_hidden_proj", "bridge_hidden"),
                                       ("encoder_cell_proj", "bridge_cell")):
            pairs += [(f"decoder.{lstm_name}.{p}", f"decoder.{hybrid_name}.{p}") for p in ("weight", "bias")]
    if not shared:
        pairs += [(f"decoder.fc_out.{p}", f"decoder.head.output_proj.{p}") for p in ("weight", "bias")]
    return pairs


def _check_keys(state_dict: Mapping[str, Tensor], expected: Sequence[str], what: str) -> None:
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise HybridConfigError(
            f"the state dict is not {what} with these options: missing {missing[:3]}"
            f"{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
            f"{' ...' if len(unexpected) > 3 else ''}")


def _swap_columns(weight: Tensor, first: int) -> Tensor:
    """``weight`` with its first ``first`` columns moved behind the others."""
    return torch.cat([weight[:, first:], weight[:, :first]], dim=1)


def lstm_to_hybrid(state_dict: Mapping[str, Tensor], args: Any) -> StateDict:
    """A fairseq ``lstm`` state dict (options ``args``) as the state dict of
    ``hybrid_lstm`` with ``hybrid_options(args)``; tensors are shared, not copied, but W_c."""
    args = lstm_options(args)
    shared = bool(args.share_decoder_input_output_embed or args.share_all_embeddings)
    pairs = _pairs(args.encoder_layers, args.encoder_hidden_size != args.decoder_hidden_size,
                   shared)
    _check_keys(state_dict, [lstm for lstm, _ in pairs] + [COMBINE[0]], "a fairseq lstm's")
    mapped = {hybrid: state_dict[lstm] for lstm, hybrid in pairs}
    mapped[COMBINE[1]] = _swap_columns(state_dict[COMBINE[0]], args.encoder_hidden_size)
    if shared:
        mapped[TIED_OUTPUT] = state_dict["decoder.embed_tokens.weight"]
    return mapped


def hybrid_to_lstm(state_dict: Mapping[str, Tensor], cfg: Any) -> StateDict:
    """A ``hybrid_lstm --input-feeding`` state dict (options ``cfg``) as the state dict of
    fairseq's ``lstm`` with the same sizes; also maps its gradients (the inverse of
    ``lstm_to_hybrid``)."""
    cfg = SimpleNamespace(**dict(cfg)) if isinstance(cfg, Mapping) else cfg
    _mappable(bool(effective(cfg, "input_feeding")), "hybrid_lstm", "--input-feeding", False,
              "without input feeding its decoder is another network than fairseq lstm's")
    hidden, out = effective(cfg, "decoder_hidden_size"), effective(cfg, "decoder_out_embed_dim")
    _mappable(out == hidden, "hybrid_lstm", "--decoder-out-embed-dim", out,
              f"only --decoder-hidden-size ({hidden}) is: fairseq lstm's attention output has "
              "that size")
    shared = bool(effective(cfg, "share_decoder_input_output_embed")
                  or effective(cfg, "share_all_embeddings"))
    pairs = _pairs(effective(cfg, "encoder_layers"),
                   effective(cfg, "encoder_hidden_size") != hidden, shared)
    expected = [hybrid for _, hybrid in pairs] + [COMBINE[1]] + ([TIED_OUTPUT] if shared else [])
    _check_keys(state_dict, expected, "hybrid_lstm's")
    mapped = {lstm: state_dict[hybrid] for lstm, hybrid in pairs}
    mapped[COMBINE[0]] = _swap_columns(state_dict[COMBINE[1]], hidden)
    return mapped


# ------------------------------------------------------------------ checkpoint files
def convert_checkpoint(source: str, destination: str) -> None:
    """Write ``destination``: the fairseq ``lstm`` checkpoint ``source`` as a hybrid_lstm
    ``--input-feeding`` checkpoint (module docstring). fairseq's loading, with the checks
    and the weights-only allowances the package's import installed (``plugin``)."""
    if not os.path.isfile(source):
        raise HybridConfigError(f"IN {source!r} is not a file: give a fairseq lstm checkpoint")
    if os.path.abspath(source) == os.path.abspath(destination):
        raise HybridConfigError(f"OUT {destination!r} is IN: give another file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(destination))):
        raise HybridConfigError(f"OUT {destination!r} is not in an existing folder")
    state = checkpoint_utils.load_checkpoint_to_cpu(source)
    cfg = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    model_cfg = cfg["model"]
    arch = (model_cfg.get("_name") if isinstance(model_cfg, Mapping)
            else getattr(model_cfg, "arch", None))
    if ARCH_MODEL_REGISTRY.get(arch) is not LSTMModel:
        raise HybridConfigError(f"IN {source!r} is a checkpoint of --arch {arch}, not of "
                                "fairseq's lstm")
    state["model"] = lstm_to_hybrid(state["model"], model_cfg)
    cfg["model"] = {"_name": "hybrid_lstm", **hybrid_options(model_cfg)}
    state["cfg"] = cfg
    state["args"] = None
    state["last_optimizer_state"] = None  # for lstm's parameters, in lstm's order
    state.get("extra_state", {}).pop("ema", None)  # lstm's names
    atomic_save(state, destination)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_hybrid.tools.from_fairseq_lstm",
        description="Convert a fairseq --arch lstm checkpoint into a hybrid_lstm "
                    "--input-feeding checkpoint (the same network).")
    parser.add_argument("source", metavar="IN.pt", help="checkpoint of fairseq's lstm")
    parser.add_argument("destination", metavar="OUT.pt", help="hybrid_lstm checkpoint to write")
    args = parser.parse_args(argv)
    convert_checkpoint(args.source, args.destination)
    print(f"wrote {args.destination}: hybrid_lstm --input-feeding "
          f"(load with --user-dir fairseq_hybrid)", file=sys.stderr)


if __name__ == "__main__":
    main()
