"""Tests of fairseq_hybrid/planning/analytic.py."""
import pytest

from fairseq_hybrid.planning.analytic import head_seconds, lstm_cell_seconds, parameter_counts, recurrent_seconds
from fairseq_hybrid.planning.lstm_published import FP16_TENSOR_OP, V100_TIMINGS, select
from fairseq_hybrid.planning.profiles import PROFILES
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from helpers import FLAT, make_dictionary, make_model


def test_an_lstm_cell_costs_its_recurrent_part_on_the_curves_and_its_input_projection_as_a_gemm():
    forward, backward = lstm_cell_seconds(FLAT, steps=3, sentences=20, inputs=4, hidden=5)
    recurrent = 2 * 4 * 5 * 5 * 3 * 20  # 4 gates x W_h h, per token (what the curves cover)
    recurrent_forward = recurrent / (1e11 * 20 / (20 + 10))
    recurrent_training = 3 * recurrent / (1.5e11 * 20 / (20 + 20))
    projection = 2 * 4 * 5 * 4 * 3 * 20 / 1e12  # 4 gates x W_i x, one matrix product
    extra = 3 * 5 * 3 * 20 * 2 / 1e9  # 4 pre-activations read (written) where 1 was
    assert forward == pytest.approx(1e-3 + recurrent_forward + projection + extra)
    assert backward == pytest.approx(
        1e-3 + (recurrent_training - recurrent_forward) + 2 * projection + extra)
    # no gate bytes beyond ``extra``: the published times already include the gates
    assert forward - 1e-3 - recurrent_forward - projection == pytest.approx(3 * 5 * 60 * 2 / 1e9)


def test_the_recurrent_part_reproduces_the_published_v100_times():
    """An independent reference: DeepBench's V100 fp16 hidden-1024 times (25 steps), which
    the v100 profile's curves were fitted to, within the fit's 1%."""
    for t in select(V100_TIMINGS, FP16_TENSOR_OP, 1024):
        forward, backward = recurrent_seconds(PROFILES["v100"], t.steps, t.batch, 1024)
        assert forward == pytest.approx(t.forward_s, rel=0.01)
        assert forward + backward == pytest.approx(t.training_s, rel=0.01)


def test_the_head_costs_its_matrix_products_and_the_losss_passes_over_the_logits():
    model, batch = ModelSize(1, 6, 4, 50), BatchSize(8, 3, 2)
    forward, backward = head_seconds(FLAT, model, batch, 8)
    tokens = 8 * 2
    flops = 2 * tokens * (6 * 6 + 2 * 3 * 6 + 12 * 4 + 4 * 50)
    memory = tokens * 50 * 12 + tokens * 3 * 4 * 6  # LOGIT_BYTES_16BIT: 12 forward, 30 backward
    assert forward == pytest.approx(flops / 1e12 + memory / 1e9)
    assert backward == pytest.approx(2 * flops / 1e12 + (tokens * 50 * 30 + 2 * tokens * 3 * 24) / 1e9)
    assert head_seconds(FLAT, model, batch, 0) == (0.0, 0.0)


def test_parameter_counts_match_a_real_model():
    dictionary = make_dictionary(40)
    for hidden, decoder_hidden in ((16, 16), (16, 14)):  # without and with the bridge
        model = make_model(dictionary, encoder_hidden_size=hidden, decoder_hidden_size=decoder_hidden,
                           encoder_embed_dim=12, decoder_embed_dim=12, decoder_out_embed_dim=12,
                           encoder_layers=2, decoder_layers=2)
        counts = parameter_counts(ModelSize(2, hidden, 12, len(dictionary),
                                            decoder_hidden=decoder_hidden))
        head = sum(p.numel() for p in model.decoder.head.parameters())
        assert counts.head == head
        assert counts.total == sum(p.numel() for p in model.parameters())
        assert counts.tensors == len(list(model.parameters()))
        layer0 = sum(p.numel() for stack in (model.encoder.stack, model.decoder.stack)
                     for p in stack.layers[0].parameters())
        assert counts.layers[0] == layer0
