"""fairseq_hybrid: a fairseq ``--user-dir`` plugin for attention LSTM translation models
trained with hybrid data-model parallelism (Ono, Utiyama, Sumita 2019, arXiv 1909.00562).

Importing the package registers the ``hybrid_lstm`` model (and its presets) and the
``hybrid_cross_entropy`` criterion and the ``torch_adam`` optimizer with fairseq, and
patches fairseq (``fairseq_patches``, all in one module): checkpoints load under
torch >= 2.6, unreadable checkpoints are reported in one line, checkpoint_last/best copies
are atomic, and the last batch fairseq would drop is kept. With
``FAIRSEQ_HYBRID_MEMORY_REPORT`` set, the process writes its peak memory at exit for the
benchmarks (``memory_report``).
"""
from . import fairseq_patches
from .memory_report import install_from_environment

fairseq_patches.apply()
install_from_environment()

from . import criterion, model, optimizer  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
