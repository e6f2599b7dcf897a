"""The whole model's numbers: padding never changes a sentence's result, and shared
embeddings tie the output layer (the parts have their own files: tests/test_encoder.py,
test_decoder.py, test_head.py, ...)."""
import torch

from helpers import make_batch, make_dictionary, make_model


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


def test_shared_embeddings_tie_the_output_layer():
    dictionary = make_dictionary()
    model = make_model(dictionary, share_all_embeddings=True, encoder_embed_dim=12,
                       decoder_embed_dim=12, decoder_out_embed_dim=12)
    assert model.decoder.head.output_proj.weight is model.encoder.embed_tokens.weight
    assert model.decoder.embed_tokens is model.encoder.embed_tokens
