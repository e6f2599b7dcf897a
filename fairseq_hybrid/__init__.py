"""fairseq_hybrid: a fairseq ``--user-dir`` plugin for attention LSTM translation models
trained with hybrid data-model parallelism (Ono, Utiyama, Sumita 2019, arXiv 1909.00562).

Importing the package registers the ``hybrid_lstm`` model (and its presets) and the
``hybrid_cross_entropy`` criterion and the ``torch_adam`` optimizer with fairseq, lets fairseq's CLIs load checkpoints
under torch >= 2.6 (``compat``) reports unreadable checkpoints in one line (``checks``) and makes fairseq's
checkpoint_last/best copies atomic (``atomic_copy``); with ``FAIRSEQ_HYBRID_MEMORY_REPORT``
set, the process writes its peak memory at exit for the benchmarks (``memory_report``).
"""
from .atomic_copy import atomic_checkpoint_copies
from .checks import readable_checkpoints
from .compat import allow_fairseq_checkpoints
from .memory_report import install_from_environment

allow_fairseq_checkpoints()
readable_checkpoints()
atomic_checkpoint_copies()
install_from_environment()

from . import criterion, model, optimizer  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
