"""Peak memory of a training or generation process, for the benchmarks.

When ``FAIRSEQ_HYBRID_MEMORY_REPORT`` names a directory, the process writes
``<dir>/<pid>.json`` at exit: its resident-set high-water mark and, for every CUDA device
it used, ``torch.cuda.max_memory_allocated``. Loaded with the plugin (``--user-dir``), so
fairseq's own models are measured the same way. Nothing happens without the variable.
"""
from __future__ import annotations

import atexit
import os
import resource
import sys
from pathlib import Path
from typing import Dict

import torch

from ..jsonio import write_json_atomic

ENV_VAR = "FAIRSEQ_HYBRID_MEMORY_REPORT"


def peak_memory() -> Dict[str, object]:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    report: Dict[str, object] = {
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        report["cuda_max_allocated_bytes"] = {
            f"cuda:{index}": torch.cuda.max_memory_allocated(index)
            for index in range(torch.cuda.device_count())
            if torch.cuda.max_memory_allocated(index) > 0
        }
    return report


def write_report(directory: str) -> None:
    write_json_atomic(peak_memory(), Path(directory) / f"{os.getpid()}.json")


_installed = False


def install_from_environment() -> None:
    global _installed
    directory = os.environ.get(ENV_VAR)
    if directory and not _installed:
        atexit.register(write_report, directory)
        _installed = True
