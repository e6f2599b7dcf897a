"""--clip-norm over gradients on several devices (plugin/clipping.py): fairseq's numbers,
the coefficient on each gradient's device. This machine has one device kind, so the
multi-device arithmetic is checked against fairseq's own function on CPU tensors, and the
dispatch with gradients that report two devices; `make gpu-check` trains on cuda:0,cpu."""
import torch
from fairseq import utils

import fairseq_hybrid  # noqa: F401  (installs the patches)
from fairseq_hybrid.plugin import clipping


def parameters(seed, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    params = []
    for shape in ((7, 5), (5,), (3, 4, 2), (1,)):
        p = torch.nn.Parameter(torch.randn(shape, generator=generator))
        p.grad = torch.randn(shape, generator=generator) * scale
        params.append(p)
    return params


def test_fairseq_function_is_wrapped_once():
    assert getattr(utils.clip_grad_norm_, "_hybrid_devices", False)
    clipping.clipping_across_devices()
    assert utils.clip_grad_norm_.__wrapped__.__module__ == "fairseq.utils"


def test_across_devices_gives_fairseqs_numbers_bit_for_bit():
    original = utils.clip_grad_norm_.__wrapped__
    for max_norm, scale in ((1.0, 3.0), (1.0, 0.01), (0.0, 3.0)):  # clipped, below the norm, norm only
        ours, theirs = parameters(0, scale), parameters(0, scale)
        theirs[1].expert = True  # scaled with the others, not counted in the norm
        ours[1].expert = True
        norm = clipping.clip_across_devices(original, ours, [p.grad for p in ours], max_norm)
        expected = original(theirs, max_norm)
        assert torch.equal(norm, expected)
        for a, b in zip(ours, theirs):
            assert torch.equal(a.grad, b.grad)
    params = parameters(1)
    doubled = clipping.clip_across_devices(original, params, [p.grad for p in params], 1.0, lambda n: 2 * n)
    assert torch.equal(doubled, 2 * original(parameters(1), 0.0))


def test_gradients_on_two_devices_take_the_multi_device_path(monkeypatch):
    calls = []
    def spy(original, params, grads, max_norm, fn=None):
        calls.append(len(grads))
        return torch.tensor(1.0)

    monkeypatch.setattr(clipping, "clip_across_devices", spy)
    utils.clip_grad_norm_(parameters(2), 1.0)
    assert calls == []  # one device: fairseq's own function
    monkeypatch.setattr(clipping, "by_device", lambda tensors: {"a": [], "b": []})  # as two GPUs report
    utils.clip_grad_norm_(parameters(2), 1.0)
    assert calls == [4]
