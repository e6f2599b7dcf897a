"""The hybrid engine gives the single-device numbers: for N = 1..4 CPU devices and
K = 1..5 time chunks, loss and every parameter gradient equal the plain model's
(float64 to 1e-10, float32 to 1e-5), with random padding and lengths."""
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import (assert_same, loss_and_grads, setup, use_devices)


pytestmark = pytest.mark.usefixtures("full_precision_reference")


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_devices", [1, 2, 3, 4])
def test_float64_equals_single_device(num_devices, chunks):
    _, task, model, batch = setup(torch.float64, seed=num_devices * 10 + chunks)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=4)
    use_devices(model, ",".join(["cpu"] * num_devices), chunks)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("devices,chunks,balance", [("cpu,cpu", 3, None), ("cpu,cpu,cpu", 2, "2,1,1"),
                                                     ("cpu,cpu,cpu", 5, "1,1,2")])
def test_float32_equals_single_device(devices, chunks, balance):
    _, task, model, batch = setup(torch.float32, seed=7, sentences=11,
                                  encoder_hidden_size=16, decoder_hidden_size=16)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.0), model, batch)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.0)
    use_devices(model, devices, chunks, balance)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-5, atol=1e-6)


def test_model_parallel_only_keeps_the_head_on_device_0_with_the_same_numbers(monkeypatch):
    _, task, model, batch = setup(torch.float64, seed=5)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    use_devices(model, "cpu,cpu,cpu", 3, head_on_master=True)
    engine = model.runtime.engine
    assert engine.plan.head_devices == 1 and "head (all sentences)" in engine.plan.table()
    import fairseq_hybrid.parallel.engine

    monkeypatch.setattr(fairseq_hybrid.parallel.engine, "sharded_head_loss",
                        lambda *a: pytest.fail("the head was split"))
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=4)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)


def test_more_devices_than_sentences_leaves_empty_shards():
    _, task, model, batch = setup(torch.float64, seed=3, sentences=2)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    use_devices(model, "cpu,cpu,cpu", 2)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)


def test_bridge_between_different_hidden_sizes():
    _, task, model, batch = setup(torch.float64, seed=5, encoder_hidden_size=10,
                                  decoder_hidden_size=14)
    assert model.decoder.bridge_hidden is not None
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.0), model, batch)
    use_devices(model, "cpu,cpu", 3)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.0)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("devices,chunks", [("cpu,cpu", 3), ("cpu,cpu,cpu,cpu", 2)])
def test_input_feeding_equals_single_device(devices, chunks):
    _, task, model, batch = setup(torch.float64, seed=9, input_feeding=True)
    reference = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    use_devices(model, devices, chunks)
    hybrid = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=5)
    assert_same(loss_and_grads(hybrid, model, batch), reference, rtol=1e-10, atol=1e-13)


def test_bfloat16_model_runs_in_bfloat16_through_the_engine():
    """What fairseq's Trainer does for --bf16 (model.to(bfloat16)), then hybrid training."""
    _, task, model, batch = setup(torch.float32, seed=4)
    model = model.to(dtype=torch.bfloat16)
    use_devices(model, "cpu,cpu", 2)
    features, extra = model(**batch["net_input"], features_only=True, hybrid=True)
    assert features.dtype == extra["encoder_out"]["encoder_out"].dtype == torch.bfloat16
    loss, _, _ = HybridCrossEntropyCriterion(task, False, 0.1)(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.dtype == torch.bfloat16 and p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("input_feeding", [False, True])
@pytest.mark.parametrize("devices,chunks", [("cpu,cpu", 3), ("cpu,cpu,cpu,cpu", 5), ("cpu", 4)])
def test_dropout_numbers_do_not_depend_on_devices_or_chunks(devices, chunks, input_feeding):
    """Every random draw happens on the calling thread in the plain model's order, so
    with dropout the hybrid engine reproduces the single-device run exactly."""
    _, task, model, batch = setup(torch.float64, seed=13, dropout=0.3,
                                  input_feeding=input_feeding)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=6)
    use_devices(model, "cpu", 1)
    torch.manual_seed(77)
    reference = loss_and_grads(criterion, model, batch)
    use_devices(model, devices, chunks)
    torch.manual_seed(77)
    assert_same(loss_and_grads(criterion, model, batch), reference, rtol=1e-10, atol=1e-13)
    torch.manual_seed(78)
    other_seed = loss_and_grads(criterion, model, batch)
    assert other_seed[0] != reference[0]  # dropout really is on
