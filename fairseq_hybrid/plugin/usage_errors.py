"""fairseq's command-line tools report a malformed option in one line.

argparse answers an option it cannot read (``--buffer-size ''``, ``--beam two``, a missing
positional argument) with the tool's whole usage, well over a hundred lines for fairseq's
tools, then its message. ``one_line_usage_errors`` makes such a parser raise
``HybridConfigError`` instead (the one line, exit status 1, like every other refusal): it is
applied to the parser every fairseq tool hands to ``options.parse_args_and_arch``
(``fairseq_patches.checked_generation_options``), so fairseq-train, -generate, -interactive
and -validate all read the same way, for every model.
"""
from __future__ import annotations

import argparse
from typing import NoReturn

from ..errors import HybridConfigError


def one_line_usage_errors(parser: argparse.ArgumentParser) -> None:
    """``parser.error`` raises the one line (argparse's message and where to find the usage),
    unless the caller gave the parser its own (the advisor's names its usage)."""
    if "error" in vars(parser):
        return

    def error(message: str) -> NoReturn:
        raise HybridConfigError(f"{message} (see {parser.prog} --help)")

    parser.error = error  # type: ignore[method-assign]
