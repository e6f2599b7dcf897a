"""The plugin's errors, each printed on the command line as a single line on stderr with
exit status 1 (no traceback: the user did nothing wrong in Python).

- ``HybridConfigError``: bad user input (an option, a data directory, a checkpoint that
  does not fit the model), raised before any work starts.
- ``HybridRuntimeError``: a failure while running that no input check could have caught
  (a loss that became NaN or diverged, a disk that filled up while saving): it says what
  happened and what was kept.

Both are ordinary ``Exception``s (``HybridError``), so a Python program
(``load_model_ensemble`` on a bad checkpoint, say) can catch them like any other error. On
the command line the plugin turns them into the one line and exit status 1
(``fairseq_patches.one_line_errors``: fairseq's ``call_main`` and the process's
excepthook), also when fairseq re-raised one as another exception
(``trainer.load_checkpoint`` does)."""
from __future__ import annotations

from typing import Any, Optional

PREFIX = "fairseq_hybrid: error: "  # every one line starts so


class HybridError(Exception):
    """An error the command line prints as its one line (the message, after ``PREFIX``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{PREFIX}{message}")


class HybridConfigError(HybridError):
    """Bad user input, with the message the command line prints as its one line."""


class HybridRuntimeError(HybridError):
    """A failure while running that is not bad input (a non-finite or diverged loss, a full
    disk), with the message the command line prints as its one line."""


def hybrid_error_in(error: Optional[BaseException]) -> Optional[HybridError]:
    """The ``HybridError`` that ``error`` is, or was raised while handling."""
    for _ in range(8):
        if error is None or isinstance(error, HybridError):
            return error
        error = error.__cause__ or error.__context__
    return None


def require(condition: bool, option: str, value: Any, allowed: str) -> None:
    """Raise ``HybridConfigError`` naming ``option``, the bad ``value`` and what is allowed."""
    if not condition:
        raise HybridConfigError(f"{option} {value!r} is not allowed: {allowed}")
