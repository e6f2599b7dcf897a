"""Checks of what a run is given — its data directory and checkpoint files — that turn
fairseq's tracebacks into one clear line naming the bad value, before any work starts.

``run_checks`` is the one list of parse-time checks: fairseq-train runs it from the
``--arch`` function (``hybrid_lstm.parse_time_checks``), fairseq-hydra-train from the Hydra
callback on the composed config (``hydra_callback.check_run_config``), so both refuse the
same input with the same line before anything is written.

- ``check_data_dir``: at parse time (fairseq-train): the directory exists and holds the
  language pair, the training split and (unless ``--disable-validation``) the validation
  splits asked for.
- ``check_split_sizes``: at parse time: the training split has sentences and at least one
  pair fits ``--max-tokens`` and the positions (fairseq would fail with ``cannot mmap an
  empty file``, an ``IndexError`` in batch_by_size or "The dataset is empty"), and every pair
  of each validation split fits them (fairseq: an ``AssertionError`` or "Size of sample #16
  is invalid" after building the model), with ``batch_limits.unfit_pairs_line``.
- ``check_training_options``: fairseq-train's numbers that fairseq takes without a word and
  then fails on (a ``ZeroDivisionError``, a crash on SIGFPE, a ``ValueError`` from torch or
  numpy) or that make no training (a negative ``--lr``); for every model (also run by
  ``fairseq_patches.checked_parsed_options``).
- ``check_precision``: ``--fp16`` without a CUDA device (fairseq fails deep inside
  torch.cuda); bfloat16 (``--bf16``) works on the CPU.
- ``check_generation_options``: fairseq-generate's options (any model) that fairseq's
  beam search cannot run, and a missing ``--path``; installed around fairseq's
  ``parse_args_and_arch`` (``fairseq_patches.checked_generation_options``).
- ``check_state_dict``: a checkpoint that does not fit is named by its cause: another
  dictionary size, the model options it was trained with that differ from this run's (read
  from its tensors: sizes, layer counts, shared embeddings, input feeding), or another
  architecture.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl
from fairseq.file_io import PathManager
from torch import Tensor

from .batch_limits import unfit_pairs_line
from .checkpoints import check_restore_file
from .config import validate_model_config
from .criterion import validate_criterion_args
from .generation_data import check_generation_data
from .generation_options import check_generation_values
from ..errors import HybridConfigError
from .placement_options import PlacementOptions, placement_options


def run_checks(args: Any) -> PlacementOptions:
    """Every parse-time check on ``args`` (fairseq-train's flat namespace, or the composed
    Hydra config's groups flattened into one); returns the placement options, parsed
    (``placement_options.placement_options``: the gate)."""

    validate_model_config(args)
    check_precision(args)
    check_data_dir(args)
    check_training_options(args)
    check_split_sizes(args)
    check_restore_file(args)
    placement = placement_options(args)
    validate_criterion_args(args)
    return placement


def check_data_dir(args: Any) -> None:
    data = getattr(args, "data", None)
    if not data:
        return
    first = data.split(os.pathsep)[0]
    if not os.path.isdir(first):
        raise HybridConfigError(
            f"data directory {first!r} does not exist: give the --destdir of fairseq-preprocess"
        )
    dictionaries = sorted(os.path.basename(p)[5:-4] for p in glob.glob(os.path.join(first, "dict.*.txt")))
    if not dictionaries:
        raise HybridConfigError(
            f"data directory {first!r} has no dict.*.txt: it is not fairseq-preprocess output"
        )
    for option, lang in (("--source-lang", getattr(args, "source_lang", None)),
                         ("--target-lang", getattr(args, "target_lang", None))):
        if lang and lang not in dictionaries:
            raise HybridConfigError(
                f"{option} {lang!r}: data directory {first!r} has no dict.{lang}.txt "
                f"(it holds: {', '.join(dictionaries)})"
            )
    subset = getattr(args, "train_subset", "train") or "train"
    if not glob.glob(os.path.join(first, f"{subset}.*")):
        raise HybridConfigError(
            f"data directory {first!r} has no '{subset}' split (no {subset}.* files)"
        )
    if getattr(args, "disable_validation", False):
        return
    valids = (getattr(args, "valid_subset", "valid") or "valid").split(",")
    for valid in ["valid"] if getattr(args, "combine_valid_subsets", False) else valids:
        if not glob.glob(os.path.join(first, f"{valid}.*")):  # fairseq: FileNotFoundError
            raise HybridConfigError(
                f"--valid-subset {valid!r}: data directory {first!r} has no '{valid}' split "
                f"(no {valid}.* files): binarize one (fairseq-preprocess --validpref), name "
                "another split, or train without validation (--disable-validation)"
            )


def _index_sizes(index_class: Any, path: str) -> np.ndarray:
    """A copy of an mmap index's sentence lengths, taken while the index (whose ``__del__``
    closes the mmap the lengths live in) is still alive."""
    index = index_class(path + ".idx")
    sizes = np.array(index.sizes, dtype=np.int64)
    del index
    return sizes


def _pair_sizes(first: str, subset: str, args: Any) -> Optional[Tuple[str, np.ndarray, np.ndarray]]:
    """(prefix, source sizes, target sizes) of the ``subset`` split in fairseq's mmap
    format (tokens with end-of-sentence), or None when it cannot be read that way (then
    fairseq decides)."""

    src, tgt = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    # DIR/train.en-de.en.idx -> prefix DIR/train.en-de, language en
    found = [path[: -len(".idx")].rsplit(".", 1)
             for path in glob.glob(os.path.join(first, f"{subset}.*-*.*.idx"))]
    for prefix in sorted({prefix for prefix, _ in found}):
        langs = sorted(lang for p, lang in found if p == prefix)
        pair = prefix.rsplit(".", 1)[-1].split("-")  # train.en-de: en is the source
        source, target = (src, tgt) if src and tgt else (pair[0], pair[-1])
        if sorted([source, target]) != langs:
            continue
        paths = [f"{prefix}.{lang}" for lang in (source, target)]
        if all(infer_dataset_impl(path) == "mmap" for path in paths):
            sizes = [_index_sizes(MMapIndexedDataset.Index, path) for path in paths]
            if len(sizes[0]) == len(sizes[1]):
                return prefix, sizes[0], sizes[1]
    return None


def check_split_sizes(args: Any) -> None:
    """The training split has sentences and some fit the limits; every pair of each
    validation split fits them (``batch_limits.unfit_pairs_line``)."""
    data = getattr(args, "data", None)
    if not data or not os.path.isdir(data.split(os.pathsep)[0]):
        return
    first = data.split(os.pathsep)[0]
    positions = (getattr(args, "max_source_positions", None), getattr(args, "max_target_positions", None))
    subset = getattr(args, "train_subset", "train") or "train"
    found = _pair_sizes(first, subset, args)
    if found is not None and len(found[1]) == 0:
        raise HybridConfigError(
            f"the '{subset}' split in {first!r} has no sentences ({os.path.basename(found[0])}.* "
            "are empty): check the --trainpref files given to fairseq-preprocess"
        )
    splits = [(subset, False)]
    if not getattr(args, "disable_validation", False) and not getattr(args, "combine_valid_subsets", False):
        splits += [(valid, True) for valid in (getattr(args, "valid_subset", "valid") or "valid").split(",")]
    for split, every_pair in splits:
        found = _pair_sizes(first, split, args)
        if found is None:
            continue
        max_tokens, option, hint = getattr(args, "max_tokens", None), "--max-tokens", ""
        valid_tokens = number(getattr(args, "max_tokens_valid", None), "--max-tokens-valid")
        if every_pair and valid_tokens is not None and valid_tokens != max_tokens:
            max_tokens, option = valid_tokens, "--max-tokens-valid"
        elif every_pair:
            hint = " (or --max-tokens-valid {longest} for the validation alone)"
        line = unfit_pairs_line(f"the '{split}' split in {first!r}", found[1], found[2], positions,
                                max_tokens, option, every_pair=every_pair, tokens_hint=hint,
                                skip_long=getattr(args, "skip_invalid_size_inputs_valid_test", False))
        if line is not None:
            raise HybridConfigError(line)


FRACTIONAL = ("lr", "clip_norm", "stop_time_hours", "momentum", "weight_decay", "adam_eps")
# fairseq-train's numbers: (attribute, option, smallest allowed value, what it is)
AT_LEAST = (
    ("max_tokens", "--max-tokens", 1, "tokens per batch, typically thousands"),
    ("max_tokens_valid", "--max-tokens-valid", 1, "tokens per validation batch"),
    ("batch_size", "--batch-size", 1, "sentences per batch; leave it out for no limit"),
    ("batch_size_valid", "--batch-size-valid", 1, "sentences per validation batch"),
    ("required_batch_size_multiple", "--required-batch-size-multiple", 1, "1 = any batch size"),
    ("update_freq", "--update-freq", 1, "batches per update"),
    ("num_workers", "--num-workers", 0, "data-loading processes; 0 = the main process"),
    ("log_interval", "--log-interval", 1, "updates between log lines"),
    ("validate_interval", "--validate-interval", 1, "epochs between validations"),
    ("save_interval", "--save-interval", 1, "epochs between checkpoints"),
    ("max_update", "--max-update", 0, "0 = no limit"),
    ("max_epoch", "--max-epoch", 0, "0 = no limit"),
    ("stop_time_hours", "--stop-time-hours", 0, "0 = no limit"),
    ("warmup_updates", "--warmup-updates", 0, "updates of learning-rate warm-up"),
    ("clip_norm", "--clip-norm", 0, "0 = no clipping"),
    ("lr", "--lr", 0, "the learning rate; a list for schedules that take one"),
    ("momentum", "--momentum", 0, "0 = none"),  # torch's ValueError in the first update
    ("weight_decay", "--weight-decay", 0, "0 = none"),
    ("adam_eps", "--adam-eps", 0, "added to the denominator; typically 1e-8"),
)


def number(value: Any, option: str) -> Any:
    """``value`` as a number: fairseq's parser leaves options whose default refers to
    another option (``--max-tokens-valid``: ``${dataset.max_tokens}``) as the text given."""
    if not isinstance(value, str):
        return value
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise HybridConfigError(f"{option} {value!r} is not allowed: a number") from None


def check_training_options(args: Any) -> None:
    """fairseq-train's numbers (``AT_LEAST``, ``--seed``), for every model: fairseq
    divides by ``--update-freq 0`` and ``--log-interval 0``, is killed by SIGFPE with
    ``--required-batch-size-multiple 0``, fails in torch or numpy with ``--num-workers -1``
    or ``--seed -1``, finds no batch at all with ``--max-tokens 0``, and trains away from the
    data with a negative ``--lr``. Parsers of other tools (no ``--max-update``) are left alone."""
    if not hasattr(args, "max_update") or hasattr(args, "beam"):
        return
    for name, option, low, what in AT_LEAST:
        value = getattr(args, name, None)
        values = [number(v, option) for v in (value if isinstance(value, (list, tuple)) else [value])]
        if any(v is not None and not v >= low for v in values):
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
            kind = "a number" if isinstance(low, float) or name in FRACTIONAL else "an integer"
            raise HybridConfigError(f"{option} {shown} is not allowed: {kind} >= {low} ({what})")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < 2 ** 32:
        raise HybridConfigError(f"--seed {seed} is not allowed: an integer from 0 to {2 ** 32 - 1}")


def check_precision(args: Any) -> None:
    for option in ("fp16", "memory_efficient_fp16"):
        if getattr(args, option, False) and not torch.cuda.is_available():
            raise HybridConfigError(
                f"--{option.replace('_', '-')} needs a CUDA GPU and torch sees none: use --bf16 "
                "(bfloat16, works on the CPU) or drop it (float32)"
            )


def check_generation_options(args: Any) -> None:
    """fairseq-generate/-interactive/-validate, any model: once parsed, refuse what fairseq
    itself cannot run (its failures are a reshape error, an AssertionError, an OSError or an
    AttributeError, after ``--results-path`` was created): ``--beam`` < 1, a longest output
    (``--max-len-a`` x source length + ``--max-len-b``) that can never reach ``--min-len``,
    ``--temperature`` <= 0, ``--sampling`` with ``--nbest`` other than ``--beam``, ``--nbest``
    outside 1 .. ``--beam`` (fairseq prints fewer without a word), fairseq-interactive's
    ``--batch-size`` above its ``--buffer-size``, the values of
    ``generation_options.check_generation_values``, and a
    ``--path`` that is missing or a directory (looked up as fairseq will: ``--checkpoint-
    suffix``, shards); then the data directory (``generation_data.check_generation_data``).
    A negative ``--max-len-b`` with ``--max-len-a`` > 0 depends on the source lengths:
    fairseq's to decide."""
    if hasattr(args, "beam"):
        beam = args.beam
        if beam is not None and beam < 1:
            raise HybridConfigError(f"--beam {beam} is not allowed: an integer >= 1 (hypotheses "
                                    "kept per step; 1 = greedy search)")
        a, b = getattr(args, "max_len_a", 0) or 0, getattr(args, "max_len_b", 200)
        min_len = getattr(args, "min_len", 1)
        if not getattr(args, "match_source_len", False) and a <= 0 and b < min_len:
            raise HybridConfigError(
                f"--max-len-b {b} is not allowed with --max-len-a {a:g} and --min-len {min_len}: "
                "no output could be long enough (outputs end by --max-len-a x source length + "
                f"--max-len-b tokens); use --max-len-b >= {min_len} (the default is 200) or "
                "--max-len-a > 0"
            )
        temperature = getattr(args, "temperature", 1.0)
        if temperature is not None and not temperature > 0:
            raise HybridConfigError(f"--temperature {temperature:g} is not allowed: a number > 0")
        nbest = getattr(args, "nbest", 1)
        if getattr(args, "sampling", False) and nbest != beam:
            raise HybridConfigError(f"--nbest {nbest} is not allowed with --sampling and --beam "
                                    f"{beam}: --sampling needs --nbest equal to --beam")
        if nbest is not None and nbest < 1:
            raise HybridConfigError(f"--nbest {nbest} is not allowed: an integer >= 1 (hypotheses "
                                    "printed per sentence, at most --beam)")
        if nbest is not None and nbest > beam:  # fairseq would print --beam of them, silently
            raise HybridConfigError(
                f"--nbest {nbest} is not allowed with --beam {beam}: the search keeps only --beam "
                f"hypotheses per sentence; use --nbest {beam} or less, or --beam {nbest} or more")
        buffer, batch = getattr(args, "buffer_size", None), getattr(args, "batch_size", None)
        if buffer is not None and batch is not None and batch > max(buffer, 1):  # an AssertionError
            raise HybridConfigError(
                f"--batch-size {batch} is not allowed with --buffer-size {buffer}: fairseq-interactive "
                f"batches the lines of one buffer; use --buffer-size {batch} or more")
        check_generation_values(args)
        if not getattr(args, "path", None):
            raise HybridConfigError("--path is required: the checkpoint to translate with, e.g. "
                                    "--path checkpoints/checkpoint_best.pt")
    if getattr(args, "path", None):
        check_checkpoint_paths(args)
    if hasattr(args, "beam"):
        check_generation_data(args)


def check_checkpoint_paths(args: Any) -> None:

    suffix = getattr(args, "checkpoint_suffix", "") or ""
    shards = getattr(args, "checkpoint_shard_count", 1) or 1
    for given in utils.split_paths(args.path):
        for shard in range(shards):
            path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(given, suffix, shard, shards)
            named = f"--path {given!r}" + (f" ({path!r})" if path != given else "")
            if os.path.isdir(path):
                raise HybridConfigError(f"{named} is a directory, not a fairseq checkpoint file: "
                                        "give a file in it, e.g. checkpoint_best.pt")
            if not PathManager.exists(path):
                raise HybridConfigError(
                    f"{named} does not exist: give a checkpoint file fairseq-train wrote, e.g. "
                    "checkpoints/checkpoint_best.pt (relative to the current directory)"
                )


def model_options_of(state: Mapping[str, Tensor]) -> Dict[str, Any]:
    """The hybrid_lstm options a state dict was built with, read from its tensors (an
    option that cannot be read is left out)."""

    def dim(name: str, axis: int) -> Optional[int]:
        tensor = state.get(name)
        return None if tensor is None or tensor.dim() <= axis else int(tensor.shape[axis])

    found: Dict[str, Any] = {
        "--encoder-embed-dim": dim("encoder.embed_tokens.weight", 1),
        "--decoder-embed-dim": dim("decoder.embed_tokens.weight", 1),
        "--encoder-hidden-size": dim("encoder.stack.layers.0.weight_hh_l0", 1),
        "--decoder-hidden-size": dim("decoder.stack.layers.0.weight_hh_l0", 1),
        "--decoder-out-embed-dim": dim("decoder.head.output_proj.weight", 1),
    }
    for side in ("encoder", "decoder"):
        layers = {key.split(".")[3] for key in state if key.startswith(f"{side}.stack.layers.")}
        found[f"--{side}-layers"] = len(layers) or None
    if "decoder.head.output_proj.weight" in state:
        found[SHARED] = "decoder.head.output_proj.bias" not in state  # a tied projection has none
    feed, embed = dim("decoder.stack.layers.0.weight_ih_l0", 1), found["--decoder-embed-dim"]
    found["--input-feeding"] = None if feed is None or embed is None else feed > embed
    return {option: value for option, value in found.items() if value is not None}


SHARED = "--share-all-embeddings (or --share-decoder-input-output-embed)"


def differing_options(expected: Mapping[str, Tensor], given: Mapping[str, Tensor]) -> str:
    """``--encoder-embed-dim 32 (this run: 64), ...`` for the options the checkpoint
    (``given``) was trained with that this model (``expected``) does not have."""
    ours, theirs = model_options_of(expected), model_options_of(given)
    named = []
    for option, value in theirs.items():
        if option in ours and ours[option] != value:
            if isinstance(value, bool):
                named.append(f"{option} {'on' if value else 'off'} (this run: {'on' if ours[option] else 'off'})")
            else:
                named.append(f"{option} {value} (this run: {ours[option]})")
    return ", ".join(named)


def check_state_dict(expected: Mapping[str, Tensor], given: Mapping[str, Tensor]) -> None:
    """A checkpoint that does not fit this model, named by its cause: the options it was
    trained with that differ (read from its tensors), another dictionary, or another
    architecture."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    mismatched = [k for k in expected if k in given and expected[k].shape != given[k].shape]
    if not (missing or unexpected or mismatched):
        return
    embed = "encoder.embed_tokens.weight"
    if embed in expected and embed in given and expected[embed].shape[0] != given[embed].shape[0]:
        raise HybridConfigError(
            f"the checkpoint's dictionary has {given[embed].shape[0]} entries, the data directory's "
            f"{expected[embed].shape[0]} ({embed} is {list(given[embed].shape)}, this model's "
            f"{list(expected[embed].shape)}): was the data binarized with another dictionary? Use "
            "the data directory the checkpoint was trained on"
        )
    options = differing_options(expected, given)
    if options:
        raise HybridConfigError(
            f"the checkpoint was trained with other model options than this run's: {options}; "
            "give the options it was trained with (or another --save-dir to start a new training)"
        )
    if missing or unexpected:
        raise HybridConfigError(
            "the checkpoint does not fit hybrid_lstm with these options (another --arch?): "
            f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{' ...' if len(unexpected) > 3 else ''}"
        )
    name = mismatched[0]
    raise HybridConfigError(f"the checkpoint's {name} is {list(given[name].shape)}, this model's "
                            f"is {list(expected[name].shape)}: give the options it was trained with")
