"""The placement options as fairseq-train and fairseq-hydra-train give them, checked at
parse time (nothing is placed): ``--hybrid-devices``, ``--hybrid-balance``,
``--pipeline-chunks`` (fairseq's own option, shared: its default 0 means unset, so only the
command line tells an explicit 0 apart), ``--hybrid-head-on-master``,
``--hybrid-allow-repeated-devices``."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import HybridConfigError
from ..parallel.placement import CHUNKS_OPTION, PlacementOptions, PlacementPlan, plan_for
from .config import effective
from .integration import explicit_option


def check_plan_options(cfg: Any, argv: Optional[Sequence[str]] = None) -> PlacementPlan:
    """Parse the options once (``PlacementOptions.from_config``) and plan them; the plan of
    ``--pipeline-chunks auto`` holds 1 chunk until the engine has chosen."""
    given = explicit_option(CHUNKS_OPTION, argv)
    if given is not None and given.strip() in ("0", "-0"):
        raise HybridConfigError(
            f"{CHUNKS_OPTION} {given.strip()} is not allowed: an integer >= 1 "
            "(1 = no time chunking; leave it out for the default)"
        )
    options = PlacementOptions.from_config(cfg)
    return plan_for(options, effective(cfg, "encoder_layers"), effective(cfg, "decoder_layers"))
