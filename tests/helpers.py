"""Small models and batches built the way fairseq builds them (dictionary, collater)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from fairseq.data import Dictionary, LanguagePairDataset

import fairseq_hybrid  # noqa: F401  (registers the model and criterion)
from fairseq_hybrid.plugin.config import HybridLSTMConfig
from fairseq_hybrid.plugin.hybrid_lstm import HybridLSTMModel
from fairseq_hybrid.plugin.placement_options import placement_options


def make_dictionary(size: int = 40) -> Dictionary:
    dictionary = Dictionary()
    for i in range(size):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def make_task(dictionary: Dictionary) -> Any:
    return SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)


def make_model(dictionary: Dictionary, seed: int = 0, dtype=torch.float64, **overrides) -> HybridLSTMModel:
    options = dict(
        encoder_embed_dim=12, encoder_hidden_size=16, encoder_layers=2,
        decoder_embed_dim=12, decoder_hidden_size=14, decoder_layers=2,
        decoder_out_embed_dim=12, dropout=0.0,
        max_source_positions=1024, max_target_positions=1024,
    )
    options.update(overrides)
    torch.manual_seed(seed)
    model = HybridLSTMModel.build_model(HybridLSTMConfig(**options), make_task(dictionary))
    return model.to(dtype)


def make_batch(dictionary: Dictionary, lengths, seed: int = 1) -> dict:
    """A collated batch of random sentences with the given (src_len, tgt_len) pairs:
    left-padded sources, right-padded targets, sorted by source length like fairseq."""
    generator = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)

    def sentence(n: int) -> torch.Tensor:
        body = torch.randint(low, high, (n - 1,), generator=generator)
        return torch.cat([body, torch.tensor([dictionary.eos()])])

    src = [sentence(s) for s, _ in lengths]
    tgt = [sentence(t) for _, t in lengths]
    dataset = LanguagePairDataset(
        src, torch.tensor([len(s) for s in src]), dictionary,
        tgt, torch.tensor([len(t) for t in tgt]), dictionary,
    )
    return dataset.collater([dataset[i] for i in range(len(src))])


def random_lengths(count: int, seed: int, max_len: int = 9):
    generator = torch.Generator().manual_seed(seed)
    return [
        tuple(int(v) for v in torch.randint(2, max_len + 1, (2,), generator=generator))
        for _ in range(count)
    ]


def loss_and_grads(criterion, model, batch):
    """(loss, sample_size, logging output, {name: grad}) of one forward/backward."""
    model.zero_grad()
    loss, sample_size, logging = criterion(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, logging, grads


# ---- comparing the hybrid engine with the plain model
def use_devices(model, devices: str, chunks: int, balance=None, head_on_master=False):
    """Train ``model`` on ``devices`` with ``chunks`` time chunks from now on, the options
    given as on the command line (through the plugin's gate)."""
    options = SimpleNamespace(hybrid_devices=devices, pipeline_chunks=chunks, hybrid_balance=balance,
                              hybrid_head_on_master=head_on_master)
    layers = (model.encoder.num_layers, model.decoder.num_layers)
    model.runtime.configure(placement_options(options, layers))
    return model


def assert_same(actual, expected, rtol, atol):
    """Loss, nll and every gradient of ``loss_and_grads`` results agree."""
    loss, _, logging, grads = actual
    ref_loss, _, ref_logging, ref_grads = expected
    assert grads.keys() == ref_grads.keys()
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=0)
    torch.testing.assert_close(logging["nll_loss"], ref_logging["nll_loss"], rtol=rtol, atol=0)
    assert logging["ntokens"] == ref_logging["ntokens"]
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{name}: {m}")


def setup(dtype, seed, sentences=9, **model_options):
    """A 4+4-layer model in train mode and a random batch of ``sentences`` sentences."""
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=dtype, encoder_layers=4, decoder_layers=4,
                       **model_options).train()
    batch = make_batch(dictionary, random_lengths(sentences, seed=seed, max_len=12), seed=seed)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    return dictionary, make_task(dictionary), model, batch
