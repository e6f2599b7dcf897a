"""hybrid_cross_entropy against fairseq's own label_smoothed_cross_entropy: same loss,
nll_loss, sample_size, logging and every parameter gradient, with padding, smoothing and
token chunking."""
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from fairseq_hybrid.errors import HybridConfigError
from helpers import loss_and_grads, make_batch, make_dictionary, make_model, make_task, random_lengths


pytestmark = pytest.mark.usefixtures("full_precision_reference")


@pytest.mark.parametrize("input_feeding", [False, True])
@pytest.mark.parametrize("chunk", [0, 1, 7])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_matches_label_smoothed_cross_entropy(smoothing, chunk, input_feeding):
    dictionary = make_dictionary()
    task = make_task(dictionary)
    model = make_model(dictionary, input_feeding=input_feeding).train()
    batch = make_batch(dictionary, random_lengths(7, seed=11))
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    assert batch["target"].eq(dictionary.pad()).any(), "the batch must contain padding"

    reference = LabelSmoothedCrossEntropyCriterion(task, False, smoothing)
    ours = HybridCrossEntropyCriterion(task, False, smoothing, softmax_chunk_tokens=chunk)
    ref_loss, ref_size, ref_log, ref_grads = loss_and_grads(reference, model, batch)
    loss, size, log, grads = loss_and_grads(ours, model, batch)

    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=0)
    torch.testing.assert_close(log["nll_loss"], ref_log["nll_loss"], rtol=1e-10, atol=0)
    assert size == ref_size == batch["ntokens"]
    for key in ("ntokens", "nsentences", "sample_size"):
        assert log[key] == ref_log[key]
    assert grads.keys() == ref_grads.keys()
    assert len(grads) == len(list(model.parameters()))
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-13,
                                   msg=lambda m: f"{name}: {m}")


def test_float32_chunked_matches_within_float_tolerance():
    dictionary = make_dictionary()
    task = make_task(dictionary)
    model = make_model(dictionary, dtype=torch.float32)
    batch = make_batch(dictionary, random_lengths(9, seed=4))
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    ref = loss_and_grads(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, batch)
    ours = loss_and_grads(HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=5), model, batch)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=0)
    for name, grad in ours[3].items():
        torch.testing.assert_close(grad, ref[3][name], rtol=1e-5, atol=1e-6)


def test_accuracy_and_sentence_avg_match():
    dictionary = make_dictionary()
    task = make_task(dictionary)
    model = make_model(dictionary)
    batch = make_batch(dictionary, random_lengths(5, seed=8))
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    reference = LabelSmoothedCrossEntropyCriterion(task, True, 0.0, report_accuracy=True)
    ours = HybridCrossEntropyCriterion(task, True, 0.0, report_accuracy=True, softmax_chunk_tokens=3)
    _, ref_size, ref_log = reference(model, batch)
    _, size, log = ours(model, batch)
    assert size == ref_size == batch["target"].size(0)
    assert (log["n_correct"], log["total"]) == (ref_log["n_correct"], ref_log["total"])


@pytest.mark.parametrize("chunk", [-1, -5])
def test_negative_chunk_is_a_clear_error(chunk):
    task = make_task(make_dictionary())
    with pytest.raises(HybridConfigError, match=rf"--softmax-chunk-tokens {chunk} is not allowed"):
        HybridCrossEntropyCriterion(task, False, 0.0, softmax_chunk_tokens=chunk)
