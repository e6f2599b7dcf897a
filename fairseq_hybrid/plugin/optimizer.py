"""``--optimizer torch_adam``: fairseq's Adam on ``torch.optim.AdamW`` with its fused
kernels (one multi-tensor kernel per device and dtype, on the CPU too).

fairseq's ``--optimizer adam`` runs its own per-parameter Python Adam unless apex's fused
Adam is installed and a GPU is present; on the CPU that Python loop took ~10% of a
``hybrid_lstm`` training step (6 elementwise passes per parameter). Same update rule,
same options (``--adam-betas``, ``--adam-eps``, ``--weight-decay``). fairseq's Adam decays
weights decoupled (``p -= lr * wd * p``), which is AdamW's rule. One difference: fairseq
adds eps before the bias correction of the second moment, torch after it, so fairseq's
eps is torch's eps / sqrt(1 - beta2^t): equal once 1 - beta2^t is near 1 (a few thousand
updates with beta2 = 0.999), and negligible before that for the usual eps of 1e-8.
"""
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adam import FairseqAdam
from omegaconf import II


@dataclass
class TorchAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay (decoupled, as fairseq's adam)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("torch_adam", dataclass=TorchAdamConfig)
class TorchAdam(FairseqOptimizer):
    def __init__(self, cfg: TorchAdamConfig, params) -> None:
        super().__init__(cfg)
        self._optimizer = torch.optim.AdamW(params, fused=True, **self.optimizer_config)

    optimizer_config = FairseqAdam.optimizer_config

    @property
    def supports_flat_params(self) -> bool:
        return True
