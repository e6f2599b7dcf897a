"""Tests of fairseq_hybrid/parallel/pipeline.py."""
import pytest
import torch

from fairseq_hybrid.model.lstm_stack import LSTMStack
from fairseq_hybrid.parallel.pipeline import WavefrontPipeline, join_chunks
from fairseq_hybrid.parallel.placement import build_plan
from fairseq_hybrid.parallel.schedule import DECODER, ENCODER
from fairseq_hybrid.parallel.worker import DeviceWorkers

CPU = torch.device("cpu")
LAYERS = 3


def stacks_and_inputs(seed=0, dropout=False):
    """Two 3-layer stacks (encoder, decoder) of hidden size 5, a right-padded source of
    lengths 7, 4, 2 and a decoder input of 5 steps, and each layer's dropout masks."""
    torch.manual_seed(seed)
    encoder = LSTMStack(4, 5, LAYERS, 0.0, "encoder").double()
    decoder = LSTMStack(4, 5, LAYERS, 0.0, "decoder").double()
    source = torch.randn(7, 3, 4, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 4, 2])

    def masks(steps):
        if not dropout:
            return [None] * LAYERS
        return [torch.bernoulli(torch.full((steps, 3, 4 if layer == 0 else 5), 0.7, dtype=torch.float64)) / 0.7
                for layer in range(LAYERS)]
    return encoder, decoder, source, target, lengths, {ENCODER: masks(7), DECODER: masks(5)}


def weighted_sum(encoder_top, finals, decoder_top):
    """A scalar that every output reaches with its own weights."""
    generator = torch.Generator().manual_seed(9)
    parts = [encoder_top, decoder_top, *[t for state in finals for t in state]]
    return sum((t * torch.randn(t.shape, generator=generator, dtype=t.dtype)).sum() for t in parts)


def backward(loss, leaves):
    """``loss.backward()``; the leaves' gradients, cleared for the next run."""
    loss.backward()
    grads = [leaf.grad.clone() for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    return grads


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("devices,chunks", [(1, 1), (1, 3), (2, 2), (3, 4), (3, 7)])
def test_the_wavefront_gives_the_stacks_outputs_states_and_gradients(devices, chunks, dropout):
    """Every (layer, chunk) cell on its layer's device worker, against the two stacks run
    whole, the decoder from the encoder's final states: the top outputs, the encoder's
    finals, and the gradients of the inputs and of every layer's parameters."""
    encoder, decoder, source, target, lengths, masks = stacks_and_inputs(dropout=dropout)
    params = [*encoder.parameters(), *decoder.parameters()]
    encoder_top, finals = encoder(source, lengths, None, masks[ENCODER])
    decoder_top, _ = decoder(target, None, finals, masks[DECODER])
    expected = [encoder_top, decoder_top, *[t for state in finals for t in state]]
    expected_grads = backward(weighted_sum(encoder_top, finals, decoder_top), [source, target, *params])

    plan = build_plan((CPU,) * devices, None, chunks, LAYERS, LAYERS)
    workers = DeviceWorkers(list(plan.devices))
    try:
        pipeline = WavefrontPipeline(encoder, decoder, None, plan, workers)
        out = pipeline.run(source, lengths, target, masks)
        loss = weighted_sum(out.encoder_top, out.encoder_finals, out.decoder_top)
        grads = backward(loss, [source, target, *params])  # the cells fill the parameters' .grad
    finally:
        workers.close()
    got = [out.encoder_top, out.decoder_top, *[t for state in out.encoder_finals for t in state]]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if chunks > 1:  # really chunked: the ledger saw cells hand outputs on across devices
        assert devices == 1 or pipeline.transfers.ledger.snapshot()


def test_without_a_target_only_the_encoder_runs_and_no_grad_records_no_graph():
    encoder, decoder, source, _, lengths, masks = stacks_and_inputs(seed=1)
    plan = build_plan((CPU,) * 2, None, 3, LAYERS, LAYERS)
    workers = DeviceWorkers(list(plan.devices))
    try:
        pipeline = WavefrontPipeline(encoder, decoder, None, plan, workers)
        with torch.no_grad():
            out = pipeline.run(source, lengths, None, masks)
            expected, finals = encoder(source, lengths, None, masks[ENCODER])
    finally:
        workers.close()
    assert out.decoder_top is None and not out.encoder_top.requires_grad
    torch.testing.assert_close(out.encoder_top, expected, rtol=1e-12, atol=1e-12)
    for (h, c), (h_ref, c_ref) in zip(out.encoder_finals, finals):
        torch.testing.assert_close((h, c), (h_ref, c_ref), rtol=1e-12, atol=1e-12)


def test_chunk_gradients_join_in_time_with_zeros_where_a_chunk_got_none():
    like = torch.zeros(5, 2)
    grads = [torch.ones(2, 2), None, torch.full((1, 2), 3.0)]
    joined = join_chunks(grads, [(0, 2), (2, 4), (4, 5)], like)
    assert torch.equal(joined, torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [3.0, 3.0]]))
    assert join_chunks([None, None], [(0, 2), (2, 5)], like) is None
