"""fairseq_hybrid: a fairseq ``--user-dir`` plugin for attention LSTM translation models
trained with hybrid data-model parallelism (Ono, Utiyama, Sumita 2019, arXiv 1909.00562).

Layers, lowest first: each imports only from the rows below it, and the two units of one
row not from each other (``tests/test_layering.py`` holds the code to this table):

    errors, jsonio      the error types (bad input, runtime failure); the one JSON writer
    model/              the network (nn code only: encoder, decoder, head, loss)
    parallel/           the engine: placement, schedule, workers, wavefront pipeline, head shards
    chunking/           --pipeline-chunks auto: time the cells, simulate the wavefront, choose K
    plugin/, planning/  what runs inside fairseq: registration, config, criterion, patches,
                        Hydra; beside it, what only plans: step predictions, GPU profiles,
                        the planned schedules, the comparison with DDP, the advisor's advice
    tools/              the command-line tools: the advisor, the checkpoint converter

Importing the package registers the ``hybrid_lstm`` model (and its presets), the
``hybrid_cross_entropy`` criterion and the ``torch_adam`` optimizer with fairseq, and
patches fairseq (``plugin/fairseq_patches.py``, all in one module). With
``FAIRSEQ_HYBRID_MEMORY_REPORT`` set, the process writes its peak memory at exit for the
benchmarks (``plugin/memory_report.py``).
"""
from .plugin import fairseq_patches
from .plugin.memory_report import install_from_environment

fairseq_patches.apply()
install_from_environment()

from .plugin import criterion, hybrid_lstm, optimizer  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
