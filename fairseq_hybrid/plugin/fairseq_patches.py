"""Every change the plugin makes to fairseq 0.12 when it is imported, in one place.

fairseq imports a ``--user-dir`` package before it loads a checkpoint or builds a batch,
in fairseq-train (also in each spawned worker), fairseq-generate and fairseq-interactive,
so these reach every run that loads the plugin. ``apply()`` installs each one once:

- ``allow_fairseq_checkpoints``: torch >= 2.6 loads weights only by default and fairseq 0.12
  calls ``torch.load`` without saying otherwise, so loading a checkpoint fails on
  ``argparse.Namespace`` and friends. Rather than turning weights-only loading off for the
  whole process, allow exactly the plain-data classes fairseq checkpoints hold: the
  weights-only unpickler still refuses anything else.
- ``checkpoints.apply()`` (``plugin/checkpoints.py``): checkpoints that are never lost
  or half written (atomic saves and copies, one line on a full or read-only disk, temporary
  files of killed saves removed at the next start), unreadable checkpoints and a missing
  ``--restore-file`` in one line, a rerun of a finished training that changes nothing, and
  ``--patience``'s count saved in each checkpoint, so a resumed run stops where the
  uninterrupted one does and a rerun of a run patience stopped trains no further.
- ``keep_last_batch``: fairseq's ``data_utils.batch_by_size`` silently drops the last
  batch when its size is not a multiple of ``--required-batch-size-multiple`` (default 8;
  fairseq issue #5036): fairseq-generate misses test sentences, validation skips some, and
  the longest training sentences (sorted last, often alone in their batch) are never
  trained on. The wrapper returns the dropped sentences as a last, smaller batch: the
  positions after fairseq's last batch, so a repeated index (an upsampled dataset) is kept
  once per occurrence, and never an empty batch. This changes, for every model trained
  with the plugin loaded, the number of batches per epoch (one more when fairseq dropped
  one) and therefore the shuffled order of the batches.
  ``FairseqDataset.batch_by_size`` (train, valid, generate, interactive) looks the function
  up on the module at each call, so replacing the module attribute reaches all of them.
- ``same_batches_after_resume``: fairseq builds a training split's batches once, when
  it creates the epoch iterator, ordering sentences of equal length with the seed
  ``--seed + epoch`` (``FairseqTask.get_batch_iterator``), and reuses them (reshuffled per
  epoch) for every later epoch of the process. A run started at epoch 1 keeps epoch 1's
  batches for good; a run resumed from a checkpoint of epoch 2 or later built its batches
  with that epoch's seed, so they hold other sentences and the resumed training differs
  from the uninterrupted one (any resume after the first epoch, e.g. from the checkpoint
  written at an epoch's end; fairseq's own ``--arch lstm`` too). The wrapper builds such
  a reused iterator's batches as at epoch 1, so resuming makes the same updates.
  ``--rebuild-batches`` and datasets whose iterator is not reused (sharded data) already
  build per epoch the same way in both runs and are left alone.
- ``resumed_epoch.epochs_resumed_by_sentences`` (``plugin/resumed_epoch.py``): a resume
  whose batches differ from the checkpoint's (another ``--max-tokens`` ...) goes on with the
  sentences of the epoch not yet trained on, where fairseq skipped a count of batches.
- ``pipeline_chunks_auto``: ``--pipeline-chunks`` is fairseq's own integer option (the
  model shares it); it also takes ``auto`` (read as 0, fairseq's default, which hybrid_lstm
  takes as "chosen by the performance model" on several devices), and a hybrid_lstm
  run's parser refuses an explicit value below 1 (``placement_options.chunks_argument``;
  other models keep fairseq's integer). fairseq's
  ``get_parser`` imports the ``--user-dir`` before it builds the parser, so wrapping
  ``options.add_distributed_training_args`` reaches fairseq-train's parser.
- ``checked_generation_options``: fairseq-generate/-interactive/-validate refuse, once
  parsed, the options fairseq's beam search cannot run and a missing ``--path``, for every
  model (``checks.check_generation_options``), fairseq-train the numbers it cannot train
  with (``checks.check_training_options``); fairseq-interactive skips an over-long line
  instead of ending the session (``sentence_limits.skip_overlong_lines``) and reads a byte
  of standard input that is not UTF-8 as an unknown character
  (``generation_options.tolerant_stdin``), and a failed
  fairseq-generate leaves no ``--results-path`` file behind (``plugin/results_file.py``).
  An option argparse cannot read is one line too, in every tool (``plugin/usage_errors.py``).
- ``sentence_limits.limited_batches`` (``plugin/sentence_limits.py``): sentences longer than
  ``--max-tokens`` or the positions limits, in any tool and split, are one line naming the
  limit (fairseq: an ``AssertionError`` or a bare ``Exception``), or, where invalid inputs are
  skipped, skipped with one warning line (also those over ``--max-tokens``).
- ``batch_limits.one_line_size_errors`` (``plugin/batch_limits.py``): a training or
  validation split whose sentences do not fit ``--max-tokens`` or the positions is one line;
  ``world_size.one_line_world_size``: more processes than GPUs for fairseq to start is too
  (and ``world_size.torchrun_without_gpus`` lets torchrun start CPU processes),
  and ``checkpoint_fit.named_misfits`` a checkpoint that does not fit the resumed model.
- ``one_line_non_finite``: a training stopped by a NaN/inf loss, and a beam search whose
  scores are all NaN/-inf, end with one line (what happened, at which update, what was
  saved) instead of fairseq's traceback; a training whose loss grew by orders of magnitude
  stops with such a line too (``plugin/stops.py``).
- ``clipping.clipping_across_devices`` (``plugin/clipping.py``): ``--clip-norm`` when a
  model's gradients are on several devices scales each device's gradients with the
  coefficient on that device (fairseq's one ``_foreach_mul_`` with a coefficient on one GPU
  fails there); single-device models keep fairseq's own function.
- ``data_parallel.torch_ddp_for_every_module`` (``plugin/data_parallel.py``): fairseq's
  default ``--ddp-backend pytorch_ddp`` hands torch's DistributedDataParallel
  ``device_ids`` for every module, which torch refuses for CPU modules; they get
  ``device_ids=None``, torch's rule for them (one-GPU modules are unchanged).
- ``sharded_optimizer.zero_sharding_with_torch`` (``plugin/sharded_optimizer.py``):
  ``--zero-sharding os`` on torch's ZeroRedundancyOptimizer (fairseq's needs fairscale);
  ``master_params``: ``--fp16``'s flat fp32 master copy only where every parameter is on the GPU.
- ``background_loading.stop_at_exit`` (``plugin/background_loading.py``): fairseq's
  background batch-loading thread, still building batches when a training stops before its
  epoch ends, stops between batches at exit instead of aborting the process (exit 134).
- ``one_line_errors``: a ``HybridError`` (bad input or a runtime failure: an ordinary
  exception a Python caller can catch) reaches the command line as its one line and exit status 1; Ctrl-C during a
  training ends with one line saying the update reached and how to resume.
"""
from __future__ import annotations

import argparse
import collections
import functools
import inspect
import re
import sys
import time
import traceback
import typing
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from fairseq import options
from fairseq.data import data_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer

from . import (background_loading, batch_limits, checkpoint_fit, checkpoints, checks, clipping, data_parallel,
               generation_options, master_params, resumed_epoch, results_file, sentence_limits,
               sharded_optimizer, stops, usage_errors, world_size)
from ..errors import PREFIX, HybridError, HybridRuntimeError, hybrid_error_in
from .placement_options import chunks_argument
from .batch_iterator import wrap_get_batch_iterator


# ------------------------------------------------------------------ torch.load
def _safe_classes() -> list:
    classes: list = [
        argparse.Namespace,
        collections.defaultdict,
        collections.OrderedDict,
        typing.Any,
        list, dict, int, float, str, bool, tuple, set,
    ]
    try:  # --eval-bleu and some optimizers keep numpy scalars/arrays in the state
        import numpy as np
        from numpy._core.multiarray import _reconstruct, scalar  # numpy >= 2 only

        classes += [np.ndarray, np.dtype, _reconstruct, scalar]
        classes += [type(np.dtype(t)) for t in ("float32", "float64", "int64", "int32", "bool")]
    except ImportError:  # pragma: no cover - numpy < 2
        pass
    try:  # multi-process resume re-broadcasts the state with omegaconf containers
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        classes += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover
        pass
    try:
        from fairseq.distributed.utils import _TensorPlaceholder  # not in every fairseq build

        classes.append(_TensorPlaceholder)
    except ImportError:  # pragma: no cover
        pass
    return classes


def allow_fairseq_checkpoints() -> None:
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(_safe_classes())


# ------------------------------------------------------------------ the last batch
def tail_of(indices: np.ndarray, batches: List) -> np.ndarray:
    """The index occurrences ``batches`` left out. fairseq's batches are contiguous slices
    of ``indices`` in order, so that is the positions after the last batch; repeated
    indices (upsampled datasets) count once per occurrence."""
    used = np.concatenate([np.asarray(batch, dtype=np.int64) for batch in batches]) \
        if batches else np.empty(0, dtype=np.int64)
    if np.array_equal(used, indices[: len(used)]):
        return indices[len(used):]
    left = collections.Counter(used.tolist())  # not a prefix: take each occurrence once
    keep = []
    for index in indices.tolist():
        if left[index] > 0:
            left[index] -= 1
        else:
            keep.append(index)
    return np.asarray(keep, dtype=np.int64)


def keep_last_batch() -> None:
    """Wrap ``fairseq.data.data_utils.batch_by_size`` (once) so no index is dropped."""

    original = data_utils.batch_by_size
    if getattr(original, "_hybrid_keeps_last_batch", False):
        return

    @functools.wraps(original)
    def batch_by_size(indices: Any, num_tokens_fn: Callable, num_tokens_vec: Any = None,
                      max_tokens: Optional[int] = None, max_sentences: Optional[int] = None,
                      required_batch_size_multiple: int = 1, fixed_shapes: Any = None) -> List:
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if len(indices) == 0:  # fairseq would fail on b[-1] with an IndexError
            return []
        batches = original(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                           required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None:  # fairseq's fixed-shape batching drops nothing itself
            return batches
        if sum(len(batch) for batch in batches) < len(indices):
            tail = tail_of(indices, batches)
            if len(tail):
                batches = list(batches) + [tail.astype(np.int64)]
        return batches

    batch_by_size._hybrid_keeps_last_batch = True
    data_utils.batch_by_size = batch_by_size


# ------------------------------------------------------------------ one line, not a traceback
INTERRUPTED = "_hybrid_interrupted"  # the line of a KeyboardInterrupt that stopped a training


def error_of_a_rank(raised: BaseException) -> Optional[HybridError]:
    """The one line of a process fairseq spawned (one per GPU): torch's spawn re-raises
    its failure in the parent as ``ProcessRaisedException`` with the child's traceback as
    text, whose last line is the ``HybridError`` raised there."""
    if not isinstance(raised, torch.multiprocessing.ProcessRaisedException):
        return None
    found = re.findall(re.escape(PREFIX) + r"[^\n]*", str(raised))
    return HybridError(found[-1][len(PREFIX):]) if found else None


def one_line_errors() -> None:
    """A ``HybridError`` is an ordinary exception; fairseq's command-line tools print it
    as its one line and exit with status 1: ``distributed_utils.call_main`` (train,
    hydra-train, interactive, validate) turns it into ``SystemExit`` (also when a process
    fairseq spawned raised it), and the excepthook does the same for the rest (parse time,
    fairseq-generate). Ctrl-C during a training (``fairseq_cli.train.main``, also under
    fairseq-hydra-train) prints ``stops.interrupted``'s line instead of the traceback; the
    process still ends by SIGINT."""

    hook = sys.excepthook
    if not getattr(hook, "_hybrid_one_line", False):
        def excepthook(kind: Any, value: BaseException, traceback: Any) -> None:
            line = getattr(value, INTERRUPTED, None)  # Ctrl-C during a training
            if line is not None:
                if line:
                    sys.stderr.write(f"{line}\n")
                return None
            error = hybrid_error_in(value)
            if error is None:
                return hook(kind, value, traceback)
            sys.stderr.write(f"{error}\n")

        excepthook._hybrid_one_line = True
        sys.excepthook = excepthook
    original = distributed_utils.call_main
    if getattr(original, "_hybrid_one_line", False):
        return

    @functools.wraps(original)
    def call_main(cfg: Any, main: Callable, **kwargs: Any) -> Any:
        try:
            return original(cfg, main, **kwargs)
        except KeyboardInterrupt:
            if getattr(main, "__module__", None) != "fairseq_cli.train":
                raise
            # a plain KeyboardInterrupt, so that Python still ends the process by SIGINT
            stopped = KeyboardInterrupt()
            setattr(stopped, INTERRUPTED, stops.interrupted(cfg))
            raise stopped from None
        except Exception as raised:
            error = hybrid_error_in(raised) or error_of_a_rank(raised)
            if error is None:
                raise
            raise SystemExit(str(error)) from None

    call_main._hybrid_one_line = True
    distributed_utils.call_main = call_main


# ------------------------------------------------------------------ batches after a resume
def same_batches_after_resume() -> None:
    """Wrap ``FairseqTask.get_batch_iterator`` (once): see the module's docstring."""
    wrap_get_batch_iterator("_hybrid_same_batches", first_epochs_batches)


def first_epochs_batches(original: Callable[..., Any], task: Any, dataset: Any,
                         given: Dict[str, Any]) -> Any:
    epoch = given["epoch"]
    reused = (
        epoch > 1 and not given["disable_iterator_cache"]
        and not given["update_epoch_batch_itr"] and task.can_reuse_epoch_itr(dataset)
        and not getattr(getattr(task, "cfg", None), "rebuild_batches", False)
        and dataset not in getattr(task, "dataset_to_epoch_iter", {})
    )
    if not reused:
        return original(**given)
    iterator = original(**{**given, "epoch": 1})  # the batches of a run's first epoch
    iterator.epoch = epoch  # then on, the epoch it really is (shuffling, set_epoch)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    return iterator


# ------------------------------------------------------------------ --pipeline-chunks auto
CHUNKS_HELP = ("hybrid_lstm: time chunks per batch for its layer pipeline, an integer >= 1 or "
               "auto (the default on several devices: measured and chosen before the first "
               "update)")


def pipeline_chunks_auto() -> None:
    """Wrap ``fairseq.options.add_distributed_training_args`` (once) so the parsers it
    builds accept ``--pipeline-chunks auto`` (``placement_options.chunks_argument``)."""

    original = options.add_distributed_training_args
    if getattr(original, "_hybrid_auto_chunks", False):
        return

    @functools.wraps(original)
    def add_distributed_training_args(parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        group = original(parser, *args, **kwargs)
        action = parser._option_string_actions.get("--pipeline-chunks")
        if action is not None:
            action.type = chunks_argument(parser)
            if CHUNKS_HELP not in (action.help or ""):  # fairseq's meaning first, for every model
                action.help = f"{action.help or ''} (--pipeline-model-parallel); {CHUNKS_HELP}"
        return group

    add_distributed_training_args._hybrid_auto_chunks = True
    options.add_distributed_training_args = add_distributed_training_args


# ------------------------------------------------------------------ generation options
def checked_generation_options() -> None:
    """Wrap ``fairseq.options.parse_args_and_arch`` (once): what fairseq-generate,
    -interactive and -validate parsed is checked (``checks.check_generation_options``)
    before they write anything, and so is what fairseq-train parsed
    (``checks.check_training_options``); every tool's parser reports a value it
    cannot parse in one line (``usage_errors.one_line_usage_errors``). fairseq's
    ``get_parser`` imports the ``--user-dir`` before the tool calls
    ``options.parse_args_and_arch``, so the wrapper is what it calls."""

    original = options.parse_args_and_arch
    if getattr(original, "_hybrid_checked", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def parse_args_and_arch(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        usage_errors.one_line_usage_errors(given.arguments["parser"])
        parsed = original(*args, **kwargs)
        if not given.arguments["suppress_defaults"]:  # the inner full parse checked it
            namespace = parsed[0] if given.arguments["parse_known"] else parsed
            checks.check_generation_options(namespace)
            checks.check_training_options(namespace)
            sentence_limits.skip_overlong_lines(namespace)
            generation_options.tolerant_stdin(namespace)
            results_file.watch_results_file(namespace)
        return parsed

    parse_args_and_arch._hybrid_checked = True
    options.parse_args_and_arch = parse_args_and_arch


# ------------------------------------------------------------------ non-finite numbers
class NonFiniteTraining(HybridRuntimeError, FloatingPointError):
    """fairseq's ``FloatingPointError`` with the one line (a caller catching fairseq's type
    still catches it)."""


class NonFiniteScores(HybridRuntimeError, AssertionError):
    """fairseq's beam-search ``AssertionError`` with the one line."""


def one_line_non_finite() -> None:
    """Wrap (once) ``Trainer.train_step`` and ``FairseqTask.inference_step``, for every
    model: a training that stops on fairseq's ``FloatingPointError`` (NaN/inf gradients:
    fairseq has then saved ``crash.pt`` and logged its NaN detector's findings) ends with
    one line saying at which update and what was saved, and so does one whose loss grew by
    orders of magnitude (``stops.check_loss_growth``); a beam search that cannot end any
    hypothesis because every score is NaN or -inf (fairseq's ``AssertionError: 200 <
    200``, e.g. with the weights of such a crash.pt) ends with one line naming the
    checkpoint (``stops.non_finite_training``, ``checkpoints.non_finite_scores``)."""

    train_step = Trainer.train_step
    if getattr(train_step, "_hybrid_one_line", False):
        return

    @functools.wraps(train_step)
    def checked_train_step(self: Any, samples: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.time()
        try:
            logging_output = train_step(self, samples, *args, **kwargs)
        except FloatingPointError as error:
            raise NonFiniteTraining(stops.non_finite_training(self, error, started)) from error
        stops.check_loss_growth(self, logging_output)
        return logging_output

    inference_step = FairseqTask.inference_step

    @functools.wraps(inference_step)
    def checked_inference_step(self: Any, generator: Any, models: Any, sample: Any,
                               *args: Any, **kwargs: Any) -> Any:
        try:
            return inference_step(self, generator, models, sample, *args, **kwargs)
        except AssertionError as error:
            frames = traceback.extract_tb(error.__traceback__)
            if not (re.fullmatch(r"\d+ < \d+", str(error)) and frames
                    and frames[-1].filename.endswith("sequence_generator.py")):
                raise
            ids = sample.get("id") if isinstance(sample, dict) else None
            raise NonFiniteScores(checkpoints.non_finite_scores(
                [] if ids is None else ids.tolist())) from error

    checked_train_step._hybrid_one_line = True
    Trainer.train_step = checked_train_step
    FairseqTask.inference_step = checked_inference_step


def apply() -> None:
    """Install every patch above (each is idempotent)."""
    allow_fairseq_checkpoints()
    checkpoints.apply()
    keep_last_batch()
    same_batches_after_resume()
    sentence_limits.limited_batches()
    resumed_epoch.epochs_resumed_by_sentences()
    batch_limits.one_line_size_errors()
    world_size.one_line_world_size()
    world_size.torchrun_without_gpus()
    checkpoint_fit.named_misfits()
    pipeline_chunks_auto()
    checked_generation_options()
    one_line_non_finite()
    one_line_errors()
    clipping.clipping_across_devices()
    data_parallel.torch_ddp_for_every_module()
    sharded_optimizer.zero_sharding_with_torch()
    master_params.flat_master_only_where_it_fits()
    background_loading.stop_at_exit()
