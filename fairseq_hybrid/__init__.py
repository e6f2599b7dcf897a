"""fairseq_hybrid: a fairseq ``--user-dir`` plugin for attention LSTM translation models
trained with hybrid data-model parallelism (Ono, Utiyama, Sumita 2019, arXiv 1909.00562).

Layers, each importing only the ones before it:

    errors      the one exception type
    model/      the network (nn code only: encoder, decoder, head, loss)
    parallel/   the engine: placement, workers, wavefront pipeline, head shards
    perfmodel/  measure, simulate, choose chunks (reads parallel's schedule)
    plugin/     what fairseq sees: registration, config, criterion, patches, Hydra
    tools/      the advisor and small utilities for the benchmarks

Importing the package registers the ``hybrid_lstm`` model (and its presets), the
``hybrid_cross_entropy`` criterion and the ``torch_adam`` optimizer with fairseq, and
patches fairseq (``plugin/fairseq_patches.py``, all in one module). With
``FAIRSEQ_HYBRID_MEMORY_REPORT`` set, the process writes its peak memory at exit for the
benchmarks (``tools/memory_report.py``).
"""
from .plugin import fairseq_patches
from .tools.memory_report import install_from_environment

fairseq_patches.apply()
install_from_environment()

from .plugin import criterion, hybrid_lstm, optimizer  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
