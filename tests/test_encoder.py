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
