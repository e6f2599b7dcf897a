"""``--optimizer torch_adam`` makes the same updates as fairseq's ``--optimizer adam``
(with a tiny eps: the two add eps on either side of the bias correction)."""
import pytest
import torch
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

from fairseq_hybrid.plugin.optimizer import TorchAdam, TorchAdamConfig


def config(cls, weight_decay, **extra):
    return cls(adam_betas="(0.9, 0.98)", adam_eps=1e-14, weight_decay=weight_decay, lr=[0.01], **extra)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_torch_adam_follows_fairseq_adam(weight_decay):
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=generator, dtype=torch.float64)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    fused = TorchAdam(config(TorchAdamConfig, weight_decay), ours)
    reference = FairseqAdam(config(FairseqAdamConfig, weight_decay, tpu=False), theirs)
    assert type(reference._optimizer).__module__ == "fairseq.optim.adam"  # the Python Adam
    for _ in range(4):
        for a, b in zip(ours, theirs):
            grad = torch.randn(a.shape, generator=generator, dtype=torch.float64)
            a.grad, b.grad = grad.clone(), grad.clone()
        fused.step()
        reference.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert fused.optimizer_config == {"lr": 0.01, "betas": (0.9, 0.98), "eps": 1e-14,
                                      "weight_decay": weight_decay}
