"""``FairseqZeroRedundancyOptimizer``: torch's ``ZeroRedundancyOptimizer`` with what fairseq's
Trainer calls on fairscale's sharded optimizer (``sharded_optimizer.py`` installs it for
``--zero-sharding os`` and imports this module only when a run shards: importing
``torch.distributed.optim`` costs every process ~1 s).
"""
from __future__ import annotations

from typing import Any, Dict

from fairseq.distributed import utils as distributed_utils
from torch.distributed.optim import ZeroRedundancyOptimizer


class FairseqZeroRedundancyOptimizer(ZeroRedundancyOptimizer):
    """torch's ZeroRedundancyOptimizer with what fairseq's Trainer calls on fairscale's."""

    @property
    def disable_mem_eff_fp16_loading_hack(self) -> bool:
        return True  # the state is loaded by global parameter index, not by fp16 ids

    def __getattr__(self, name: str) -> Any:
        if name.startswith("supports") and name != "supports" and "optim" in self.__dict__:
            if hasattr(self.optim, name):
                return getattr(self.optim, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def broadcast_global_state_dict(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """Process 0's whole state to every process (each loads its share)."""
        return distributed_utils.broadcast_object(state_dict, src_rank=0, group=self.process_group)

    def held_share(self) -> str:
        """Which part of the state this process keeps, in words."""
        mine = [p for group in self.optim.param_groups for p in group["params"]]
        every = [p for group in self.param_groups for p in group["params"]]
        return (f"process {self.rank} of {self.world_size} keeps the optimizer state of {len(mine)} "
                f"of {len(every)} parameter tensors ({sum(p.numel() for p in mine):,} of "
                f"{sum(p.numel() for p in every):,} elements)")
