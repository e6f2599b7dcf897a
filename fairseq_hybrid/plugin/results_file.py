"""fairseq-generate's ``--results-path`` file is not left behind by a run that fails.

fairseq-generate creates ``RESULTS/generate-<subset>.txt`` (truncating one already there)
before it loads the model, and writes each translation as it goes, so a run that stops on
an error (a checkpoint that does not fit, a model whose own length limit a sentence
exceeds, non-finite scores, Ctrl-C) leaves an empty or half-written file that looks like a
result. ``remove_if_unfinished`` is registered once the options are parsed and checked
(``fairseq_patches.checked_generation_options``); at exit, if the process is ending on an
uncaught exception (the interpreter has set ``sys.last_value``), it removes the file this
run wrote (and the results directory if the run created it and it is empty), quietly: the
error itself is the run's one line. A file the run never touched, e.g. when a parse-time
check refused the options, is kept.
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import Any, Optional, Tuple

def _stamp(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def remove_if_unfinished(path: str, before: Optional[Tuple[int, int, int]], new_folder: bool) -> bool:
    """Remove ``path`` if the process is failing and the file changed since ``before``;
    True if it was removed."""
    if getattr(sys, "last_value", None) is None or _stamp(path) in (None, before):
        return False
    os.remove(path)
    folder = os.path.dirname(path)
    if new_folder and not os.listdir(folder):
        os.rmdir(folder)
    return True


def watch_results_file(args: Any) -> None:
    """fairseq-generate with ``--results-path`` (not -interactive, which has no such file)."""
    results = getattr(args, "results_path", None)
    if not results or hasattr(args, "buffer_size") or not hasattr(args, "gen_subset"):
        return
    path = os.path.join(results, f"generate-{args.gen_subset}.txt")
    atexit.register(remove_if_unfinished, path, _stamp(path), not os.path.exists(results))
