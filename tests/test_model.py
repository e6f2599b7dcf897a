"""The model's numbers: padding never changes a sentence's result, and step-by-step
(incremental) decoding gives exactly the teacher-forced logits."""
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


def test_padding_does_not_change_a_sentence():
    dictionary = make_dictionary()
    model = make_model(dictionary).eval()
    lengths = [(9, 7), (5, 3), (3, 8), (2, 2)]
    batch = make_batch(dictionary, lengths)
    with torch.no_grad():
        logits, _ = model(**batch["net_input"])
        for row in range(len(lengths)):
            src = batch["net_input"]["src_tokens"][row]
            src = src[src.ne(dictionary.pad())].unsqueeze(0)
            prev = batch["net_input"]["prev_output_tokens"][row]
            tgt_len = int(batch["target"][row].ne(dictionary.pad()).sum())
            alone, _ = model(src, torch.tensor([src.size(1)]), prev[:tgt_len].unsqueeze(0))
            torch.testing.assert_close(alone[0], logits[row, :tgt_len], rtol=1e-12, atol=1e-12)


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


def test_shared_embeddings_tie_the_output_layer():
    dictionary = make_dictionary()
    model = make_model(dictionary, share_all_embeddings=True, encoder_embed_dim=12,
                       decoder_embed_dim=12, decoder_out_embed_dim=12)
    assert model.decoder.head.output_proj.weight is model.encoder.embed_tokens.weight
    assert model.decoder.embed_tokens is model.encoder.embed_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_mask_is_a_scaled_bernoulli_keep_mask(dtype):
    """Every entry is 0 or 1 / (1 - p), kept with probability 1 - p (within 5 standard
    deviations of the binomial count), in the dtype asked for; off in eval mode."""
    from fairseq.modules import FairseqDropout

    from fairseq_hybrid.model.dropout import dropout_mask, dropped_out

    p, n = 0.3, 400_000
    dropout = FairseqDropout(p).train()
    torch.manual_seed(0)
    mask = dropout_mask(dropout, (n,), torch.empty(0, dtype=dtype))
    assert mask.dtype == dtype and mask.shape == (n,)
    kept = mask != 0
    assert torch.all(mask[kept] == torch.tensor(1 / (1 - p), dtype=dtype))
    expected, sd = n * (1 - p), (n * p * (1 - p)) ** 0.5
    assert abs(int(kept.sum()) - expected) < 5 * sd
    x = torch.randn(3, 4).to(dtype)
    assert dropout_mask(dropout.eval(), (n,), x) is None
    assert dropped_out(dropout, x) is x
