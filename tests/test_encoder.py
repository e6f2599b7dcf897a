"""Tests of fairseq_hybrid/model/encoder.py."""
import torch

from helpers import make_batch, make_dictionary, make_model


def test_attention_is_reported_in_source_positions():
    dictionary = make_dictionary()
    model = make_model(dictionary).eval()
    batch = make_batch(dictionary, [(7, 4), (3, 4)])
    with torch.no_grad():
        _, extra = model(**batch["net_input"])
    attn = extra["attn"][0]
    src_pad = batch["net_input"]["src_tokens"].eq(dictionary.pad())
    assert torch.all(attn.masked_select(src_pad.unsqueeze(1).expand_as(attn)) == 0)
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))


def test_each_sentences_states_are_those_it_gets_alone_and_padding_is_moved_to_the_right():
    """fairseq pads sources on the left; the encoder right-pads them, and every sentence's
    top states, final (h, c) of every layer and padding mask are those of the sentence
    encoded alone; ``source_shift`` is how far it moved."""
    from fairseq_hybrid.model.encoder import HybridLSTMEncoder

    dictionary = make_dictionary()
    model = make_model(dictionary).eval()
    assert isinstance(model.encoder, HybridLSTMEncoder)
    batch = make_batch(dictionary, [(7, 2), (4, 2), (2, 2)])
    src_tokens, src_lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    with torch.no_grad():
        out = model.encoder(src_tokens, src_lengths)
        assert out["source_shift"].tolist() == [0, 3, 5]
        assert out["encoder_padding_mask"].sum(dim=1).tolist() == [0, 3, 5]
        for row, length in enumerate(src_lengths.tolist()):
            alone = model.encoder(src_tokens[row:row + 1, -length:], src_lengths[row:row + 1])
            assert not out["encoder_padding_mask"][row, :length].any()
            torch.testing.assert_close(out["encoder_out"][row, :length], alone["encoder_out"][0],
                                       rtol=1e-12, atol=1e-12)
            for key in ("final_hiddens", "final_cells"):
                torch.testing.assert_close(out[key][:, row], alone[key][:, 0], rtol=1e-12, atol=1e-12)


def test_a_reordered_output_is_the_output_of_the_reordered_batch():
    dictionary = make_dictionary()
    model = make_model(dictionary).eval()
    batch = make_batch(dictionary, [(6, 2), (5, 2), (3, 2), (2, 2)])
    src_tokens, src_lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    order = torch.tensor([2, 0, 3, 1, 1])  # beam search repeats sentences too
    with torch.no_grad():
        reordered = model.encoder.reorder_encoder_out(model.encoder(src_tokens, src_lengths), order)
        direct = model.encoder(src_tokens[order], src_lengths[order])
    assert reordered.keys() == direct.keys()
    for key, value in direct.items():
        torch.testing.assert_close(reordered[key], value, rtol=1e-12, atol=1e-12, msg=key)


def test_attention_weights_move_back_to_the_callers_left_padded_positions():
    from fairseq_hybrid.model.encoder import attention_in_source_order

    # one target step; sentence 0 unpadded, sentence 1 moved left by 2 when right-padded
    weights = torch.tensor([[[0.1, 0.2, 0.3, 0.4]], [[0.5, 0.5, 0.0, 0.0]]])
    moved = attention_in_source_order(weights, {"source_shift": torch.tensor([0, 2])})
    assert torch.equal(moved, torch.tensor([[[0.1, 0.2, 0.3, 0.4]], [[0.0, 0.0, 0.5, 0.5]]]))
