"""Tests of fairseq_hybrid/model/network.py."""
import pytest
import torch

from fairseq_hybrid.model.network import HybridLSTMNetwork
from helpers import make_batch, make_dictionary, make_model


class RecordingRuntime:
    """A parallel runtime that records what the network asks of it."""

    def __init__(self, features):
        self.calls = []
        self._features = features

    def features(self, src_tokens, src_lengths, prev_output_tokens):
        self.calls.append(("features", src_tokens, src_lengths, prev_output_tokens))
        return self._features, {"encoder_out": "S"}

    def restore_placement(self):
        self.calls.append(("restore_placement",))


def network_and_batch(**options):
    dictionary = make_dictionary()
    model = make_model(dictionary, **options).eval()
    return HybridLSTMNetwork(model.encoder, model.decoder), make_batch(dictionary, [(5, 4), (3, 2)])


def test_the_plain_forward_is_the_encoder_then_the_decoder():
    network, batch = network_and_batch()
    net = batch["net_input"]
    with torch.no_grad():
        logits, extra = network(**net)
        encoder_out = network.encoder(net["src_tokens"], net["src_lengths"])
        expected, expected_extra = network.decoder(net["prev_output_tokens"], encoder_out=encoder_out)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    torch.testing.assert_close(extra["attn"][0], expected_extra["attn"][0], rtol=0, atol=0)


def test_hybrid_forward_asks_the_runtime_and_needs_one():
    network, batch = network_and_batch()
    net = batch["net_input"]
    with pytest.raises(RuntimeError, match=r"forward\(hybrid=True\) needs a parallel runtime"):
        network(**net, hybrid=True)
    features = torch.zeros(2, 4, 14)
    network.runtime = RecordingRuntime(features)
    out, extra = network(**net, features_only=True, hybrid=True)
    assert out is features and extra == {"encoder_out": {"encoder_out": "S"}, "attn": None}
    [(name, *args)] = network.runtime.calls
    assert name == "features" and all(a is b for a, b in zip(args, (
        net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])))


def test_moving_the_model_asks_the_runtime_to_restore_its_placement():
    network, _ = network_and_batch()
    network.to(torch.float32)  # no runtime: nothing to restore, no error
    network.runtime = RecordingRuntime(None)
    network.to(torch.float64)
    network.half()
    assert network.runtime.calls == [("restore_placement",), ("restore_placement",)]
    assert next(network.parameters()).dtype == torch.float16


@pytest.mark.parametrize("input_feeding", [False, True])
def test_a_step_draws_the_decoders_inputs_up_front_only_without_input_feeding(input_feeding):
    network, batch = network_and_batch(input_feeding=input_feeding)
    net = batch["net_input"]
    draws = network.draw_step(net["src_tokens"], net["prev_output_tokens"])
    assert draws.encoder.source.shape == (5, 2, 12)  # time-major source embeddings
    if input_feeding:
        assert draws.decoder is None
    else:
        assert draws.decoder.target.shape == (4, 2, 12)
        assert len(draws.decoder.masks) == network.decoder.num_layers
