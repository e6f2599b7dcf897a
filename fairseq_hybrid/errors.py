"""The one way the plugin reports bad user input: a single line on stderr, exit status 1,
raised before any work starts (no traceback: the user did nothing wrong in Python)."""
from __future__ import annotations

from typing import Any


class HybridConfigError(SystemExit):
    """``SystemExit`` so fairseq's CLIs print just the message and exit with status 1."""

    def __init__(self, message: str) -> None:
        super().__init__(f"fairseq_hybrid: error: {message}")


def require(condition: bool, option: str, value: Any, allowed: str) -> None:
    """Raise ``HybridConfigError`` naming ``option``, the bad ``value`` and what is allowed."""
    if not condition:
        raise HybridConfigError(f"{option} {value!r} is not allowed: {allowed}")
