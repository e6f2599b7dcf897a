"""The one way the plugin reports bad user input: a single line on stderr, exit status 1,
raised before any work starts (no traceback: the user did nothing wrong in Python).

``HybridConfigError`` is an ordinary ``Exception``, so a Python program (``load_model_
ensemble`` on a bad checkpoint, say) can catch it like any other error. On the command
line the plugin turns it into the one line and exit status 1 (``fairseq_patches.
one_line_errors``: fairseq's ``call_main`` and the process's excepthook), also when fairseq
re-raised it as another exception (``trainer.load_checkpoint`` does)."""
from __future__ import annotations

from typing import Any, Optional


class HybridConfigError(Exception):
    """Bad user input, with the message the command line prints as its one line."""

    def __init__(self, message: str) -> None:
        super().__init__(f"fairseq_hybrid: error: {message}")


def hybrid_error_in(error: Optional[BaseException]) -> Optional[HybridConfigError]:
    """The ``HybridConfigError`` that ``error`` is, or was raised while handling."""
    for _ in range(8):
        if error is None or isinstance(error, HybridConfigError):
            return error
        error = error.__cause__ or error.__context__
    return None


def require(condition: bool, option: str, value: Any, allowed: str) -> None:
    """Raise ``HybridConfigError`` naming ``option``, the bad ``value`` and what is allowed."""
    if not condition:
        raise HybridConfigError(f"{option} {value!r} is not allowed: {allowed}")
