"""Tests of fairseq_hybrid/parallel/runtime.py."""
import threading

import pytest
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


def test_nothing_starts_before_the_first_step_and_auto_without_a_batch_plans_two_chunks_per_device():
    """Configuring starts no thread and builds no engine; an engine built without a batch to
    measure (no chooser) plans 2 chunks per device; ``close`` stops the workers and the
    next use builds a new engine; without a resolved chunk count ``plan`` needs one."""
    from fairseq_hybrid.parallel.placement import AUTO
    from fairseq_hybrid.parallel.runtime import HybridRuntime

    _, _, model, _ = setup(torch.float64, seed=1)
    runtime = model.runtime
    assert isinstance(runtime, HybridRuntime)
    threads = {t.name for t in threading.enumerate()}
    runtime.configure(devices=(torch.device("cpu"),) * 2, chunks=AUTO)
    assert runtime._engine is None and {t.name for t in threading.enumerate()} == threads
    with pytest.raises(ValueError, match="the chunk count is chosen when the engine is built: give chunks"):
        runtime.plan()
    assert runtime.plan(chunks=3).chunks == 3
    try:
        first = runtime.engine
        assert first.plan.chunks == 4 and first.plan.num_devices == 2
        assert runtime.engine is first
    finally:
        runtime.close()
    assert runtime._engine is None
    try:
        assert runtime.engine is not first
    finally:
        runtime.close()
