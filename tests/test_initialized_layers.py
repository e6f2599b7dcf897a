"""Tests of fairseq_hybrid/model/initialized_layers.py."""
import torch

from fairseq_hybrid.model.initialized_layers import INIT_RANGE, embedding, linear, lstm_layer


def assert_uniform_over_the_range(tensor: torch.Tensor) -> None:
    """Inside [-0.1, 0.1] and spread over all of it, centred on 0 (a uniform draw of
    thousands of values): not torch's default initialisation, which depends on the sizes
    (N(0, 1) for embeddings, +-1/sqrt(fan) for linear and LSTM layers)."""
    assert float(tensor.abs().max()) <= INIT_RANGE
    assert float(tensor.max()) > 0.95 * INIT_RANGE and float(tensor.min()) < -0.95 * INIT_RANGE
    assert abs(float(tensor.mean())) < 0.01


def test_every_weight_is_uniform_in_the_range_and_the_padding_row_is_zero():
    torch.manual_seed(0)
    table = embedding(300, 20, padding_idx=1)
    assert table.weight.shape == (300, 20) and table.padding_idx == 1
    assert torch.all(table.weight[1] == 0)
    assert_uniform_over_the_range(torch.cat([table.weight[:1], table.weight[2:]]))
    layer = linear(50, 40)  # default init: +-1/sqrt(50) = +-0.14
    assert layer.weight.shape == (40, 50) and layer.bias.shape == (40,)
    assert_uniform_over_the_range(layer.weight)
    assert float(layer.bias.abs().max()) <= INIT_RANGE
    assert linear(50, 40, bias=False).bias is None


def test_an_lstm_layer_is_one_unidirectional_time_major_layer_initialised_in_the_range():
    torch.manual_seed(0)
    layer = lstm_layer(30, 64)  # default init: +-1/sqrt(64) = +-0.125
    assert (layer.input_size, layer.hidden_size, layer.num_layers) == (30, 64, 1)
    assert not layer.bidirectional and not layer.batch_first
    params = dict(layer.named_parameters())
    assert set(params) == {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"}
    for name in ("weight_ih_l0", "weight_hh_l0"):
        assert_uniform_over_the_range(params[name])
    assert all(float(params[name].abs().max()) <= INIT_RANGE for name in ("bias_ih_l0", "bias_hh_l0"))
