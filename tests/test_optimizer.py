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


def test_the_fp16_master_copy_is_flat_only_where_every_parameter_is_on_this_processs_gpu(monkeypatch):
    """fairseq's flat fp32 buffer syncs only the parameters on the current GPU
    (plugin/master_params.py): it is kept there, per-parameter copies are built elsewhere,
    and those train every parameter as AdamW on fp32 copies does."""
    from types import SimpleNamespace

    from fairseq.optim.fp16_optimizer import FP16Optimizer
    from omegaconf import OmegaConf

    from fairseq_hybrid.plugin import master_params

    with monkeypatch.context() as fake_gpu:
        fake_gpu.setattr(torch.cuda, "is_available", lambda: True)
        fake_gpu.setattr(torch.cuda, "current_device", lambda: 1)
        on = [SimpleNamespace(device=torch.device(d)) for d in ("cuda:1", "cuda:1")]
        assert master_params.flat_master_fits(on)
        for elsewhere in ("cuda:0", "cpu"):
            assert not master_params.flat_master_fits([*on, SimpleNamespace(device=torch.device(elsewhere))])
    assert not master_params.flat_master_fits(on)  # no GPU here

    master_params.flat_master_only_where_it_fits()  # the plugin applied it already: idempotent
    cfg = OmegaConf.create({
        "common": {"fp16": True, "bf16": False, "fp16_no_flatten_grads": False, "fp16_init_scale": 128,
                   "fp16_scale_window": None, "fp16_scale_tolerance": 0.0, "threshold_loss_scale": None,
                   "min_loss_scale": 1e-4, "model_parallel_size": 1},
        "optimizer": {"_name": "torch_adam", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                      "weight_decay": 0.0, "lr": [0.01]},
        "distributed_training": {"distributed_world_size": 1, "pipeline_model_parallel": False},
        "optimization": {"update_freq": [1]},
    })
    generator = torch.Generator().manual_seed(1)
    weights = [torch.nn.Parameter(torch.randn(s, generator=generator).half()) for s in ((5, 3), (4,))]
    reference = [torch.nn.Parameter(w.detach().float()) for w in weights]
    wrapper = FP16Optimizer.build_optimizer(cfg, weights)  # fairseq alone: AssertionError, no CUDA
    assert not wrapper.has_flat_params and cfg.common.fp16_no_flatten_grads
    adamw = torch.optim.AdamW(reference, lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    for _ in range(3):
        wrapper.zero_grad()  # as fairseq's Trainer: scaled backward, unscaled in step
        grads = [torch.randn(w.shape, generator=generator).half() for w in weights]
        wrapper.backward(sum((w * g).sum() for w, g in zip(weights, grads)))
        for r, g in zip(reference, grads):
            r.grad = g.float()
        wrapper.step()
        adamw.step()
    for w, r in zip(weights, reference):
        torch.testing.assert_close(w, r.detach().half())
