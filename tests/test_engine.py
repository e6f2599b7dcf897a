"""Tests of fairseq_hybrid/parallel/engine.py."""
import pytest
import torch

from fairseq_hybrid.model.loss import TokenLoss
from fairseq_hybrid.parallel.engine import HybridEngine
from helpers import make_batch, make_dictionary, make_model, random_lengths

CPU = torch.device("cpu")


def test_one_device_and_one_chunk_is_the_plain_model_and_h_comes_from_the_top_layers():
    dictionary = make_dictionary()
    for input_feeding in (False, True):
        model = make_model(dictionary, encoder_layers=3, decoder_layers=3, input_feeding=input_feeding)
        runtime = model.runtime
        try:
            engines = {(devices, chunks): runtime.build_engine(devices=(CPU,) * devices, chunks=chunks)
                       for devices, chunks in ((1, 1), (1, 2), (3, 2))}
            assert all(isinstance(engine, HybridEngine) for engine in engines.values())
            assert [engine.plain for engine in engines.values()] == [True, False, False]
            assert engines[(1, 1)].head_input_devices == (0, 0)
            # 3 layers on 3 devices: the top layers on device 2; input feeding's H on device 0
            assert engines[(3, 2)].head_input_devices == ((0, 2) if input_feeding else (2, 2))
        finally:
            runtime.close()


@pytest.mark.parametrize("input_feeding", [False, True])
@pytest.mark.parametrize("devices,chunks,split_head", [(2, 3, True), (3, 2, True), (3, 2, False)])
def test_features_and_head_loss_are_the_plain_models(devices, chunks, split_head, input_feeding):
    """Eval mode (no dropout), float64: H and S from ``features`` and the head's loss and nll
    from ``head_loss`` (split by sentences or on the master head alone) equal the plain
    model's ``features_only`` forward and the loss run on it."""
    dictionary = make_dictionary()
    model = make_model(dictionary, encoder_layers=3, decoder_layers=3, input_feeding=input_feeding).eval()
    batch = make_batch(dictionary, random_lengths(5, seed=6, max_len=8), seed=6)
    net, target = batch["net_input"], batch["target"]
    loss_fn = TokenLoss(padding_idx=dictionary.pad(), epsilon=0.1, chunk_tokens=0,
                        features_are_combined=model.decoder.features_are_combined)  # H_c with input feeding
    with torch.no_grad():
        features, _ = model(**net, features_only=True)
        expected = loss_fn(model.decoder.head, features, model.encoder(net["src_tokens"], net["src_lengths"]), target)
        try:
            engine = model.runtime.build_engine(devices=(CPU,) * devices, chunks=chunks, split_head=split_head)
            model.runtime.use_engine(engine)
            assert engine.plan.head_devices == (devices if split_head else 1)
            got_features, got_encoder_out = engine.features(net["src_tokens"], net["src_lengths"],
                                                            net["prev_output_tokens"])
            result = engine.head_loss(got_features, got_encoder_out, target, loss_fn)
        finally:
            model.runtime.close()
    torch.testing.assert_close(got_features, features, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.loss, expected.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(result.nll_loss, expected.nll_loss, rtol=1e-12, atol=0)
