"""Tests of fairseq_hybrid/model/decoder.py."""
import pytest
import torch

from helpers import make_batch, make_dictionary, make_model, random_lengths


@pytest.mark.parametrize("input_feeding", [False, True])
def test_incremental_logits_equal_teacher_forced(input_feeding):
    dictionary = make_dictionary()
    model = make_model(dictionary, input_feeding=input_feeding).eval()
    batch = make_batch(dictionary, random_lengths(6, seed=3))
    net_input = batch["net_input"]
    with torch.no_grad():
        full, _ = model(**net_input)
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        state: dict = {}
        prev = net_input["prev_output_tokens"]
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-12, atol=1e-12)


def test_reorder_incremental_state_follows_new_order():
    dictionary = make_dictionary()
    model = make_model(dictionary).eval()
    batch = make_batch(dictionary, random_lengths(4, seed=5))
    net_input = batch["net_input"]
    prev = net_input["prev_output_tokens"]
    order = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        full, _ = model(**net_input)
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        state: dict = {}
        model.decoder(prev[:, :1], encoder_out, incremental_state=state)
        model.decoder.reorder_incremental_state(state, order)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        second, _ = model.decoder(prev[order, :2], encoder_out, incremental_state=state)
    torch.testing.assert_close(second[:, 0], full[order, 1], rtol=1e-12, atol=1e-12)


def test_each_decoder_layer_starts_from_its_encoder_layers_final_state_bridged_if_sizes_differ():
    from fairseq_hybrid.model.decoder import HybridLSTMDecoder

    dictionary = make_dictionary()
    batch = make_batch(dictionary, [(6, 3), (4, 5)])
    net_input = batch["net_input"]
    for decoder_hidden, bridged in ((16, False), (14, True)):
        model = make_model(dictionary, encoder_hidden_size=16, decoder_hidden_size=decoder_hidden).eval()
        assert isinstance(model.decoder, HybridLSTMDecoder) and model.decoder.has_bridge is bridged
        with torch.no_grad():
            encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
            states = model.decoder.initial_states(encoder_out)
        assert len(states) == model.decoder.num_layers
        for layer, (h, c) in enumerate(states):
            hidden, cell = encoder_out["final_hiddens"][layer], encoder_out["final_cells"][layer]
            if bridged:
                bridge_h, bridge_c = model.decoder.bridge_hidden, model.decoder.bridge_cell
                torch.testing.assert_close(h, hidden @ bridge_h.weight.T + bridge_h.bias, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(c, cell @ bridge_c.weight.T + bridge_c.bias, rtol=1e-12, atol=1e-12)
                assert h.shape == (2, 14)
            else:
                assert torch.equal(h, hidden) and torch.equal(c, cell)
