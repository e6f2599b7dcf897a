"""Tests of fairseq_hybrid/parallel/runtime.py."""
import torch

from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import setup, use_devices


def test_a_model_with_an_engine_can_be_deep_copied():
    import copy

    _, task, model, batch = setup(torch.float64, seed=2)
    use_devices(model, "cpu,cpu", 2)
    HybridCrossEntropyCriterion(task, False, 0.0)(model, batch)
    assert model.runtime._engine is not None
    twin = copy.deepcopy(model)
    assert twin.runtime._engine is None and model.runtime._engine is not None
    assert twin.runtime.model is twin and twin.runtime.options == model.runtime.options
    for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(a, b) and a is not b, name
