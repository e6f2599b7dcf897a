"""Tests of fairseq_hybrid/model/lstm_stack.py."""
import pytest
import torch
from torch import nn

from fairseq_hybrid.model.dropout import LazyMask, MaskQueue, resolve
from fairseq_hybrid.model.initialized_layers import lstm_layer
from fairseq_hybrid.model.lstm_stack import LSTMStack, run_layer


def test_run_layer_gives_each_sentence_what_it_gives_alone_whatever_the_padding():
    """Each sentence's outputs and final state equal the layer run over its real steps
    alone (torch's nn.LSTM, batch of one); padded steps output zeros; a sentence with 0
    steps keeps its state."""
    torch.manual_seed(0)
    layer = lstm_layer(3, 5).double()
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    h0, c0 = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    steps = torch.tensor([6, 2, 0, 4])
    out, (h, c) = run_layer(layer, x, steps, (h0, c0))
    assert out.shape == (6, 4, 5)
    for b, n in enumerate(steps.tolist()):
        assert torch.all(out[n:, b] == 0)
        if n == 0:
            assert torch.equal(h[b], h0[b]) and torch.equal(c[b], c0[b])
            continue
        alone, (h_alone, c_alone) = layer(x[:n, b:b + 1], (h0[b][None, None], c0[b][None, None]))
        torch.testing.assert_close(out[:n, b], alone[:, 0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(h[b], h_alone[0, 0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c[b], c_alone[0, 0], rtol=1e-12, atol=1e-12)


def test_run_layer_without_padding_is_the_layer_from_a_zero_state_and_no_step_changes_nothing():
    torch.manual_seed(1)
    layer = lstm_layer(3, 4).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    out, (h, c) = run_layer(layer, x, None, None)
    expected, (h_ref, c_ref) = layer(x)  # torch's zero initial state
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close((h, c), (h_ref[0], c_ref[0]), rtol=0, atol=0)
    state = (torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64))
    out, kept = run_layer(layer, x, torch.tensor([0, 0]), state)
    assert torch.all(out == 0) and kept is state


def test_the_stack_is_torchs_multi_layer_lstm_with_the_same_weights():
    """An independent reference: one multi-layer ``nn.LSTM`` holding the stack's weights."""
    torch.manual_seed(2)
    stack = LSTMStack(3, 5, 3, dropout_between=0.0, module_name="test").double()
    reference = nn.LSTM(3, 5, num_layers=3).double()
    for index, layer in enumerate(stack.layers):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, f"{name}_l{index}").data.copy_(getattr(layer, f"{name}_l0"))
    x = torch.randn(7, 2, 3, dtype=torch.float64)
    out, finals = stack(x, None, None, [None] * 3)
    expected, (h, c) = reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for index, (h_layer, c_layer) in enumerate(finals):
        torch.testing.assert_close(h_layer, h[index], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c_layer, c[index], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("queued", [False, True])
def test_each_layers_input_mask_has_its_input_shape_the_first_only_with_an_input_dropout(queued):
    from fairseq.modules import FairseqDropout

    stack = LSTMStack(3, 5, 3, dropout_between=0.5, module_name="test").train()
    like = torch.empty(0)
    queue = MaskQueue() if queued else None
    masks = stack.draw_masks(7, 2, like, None, queue)
    assert masks[0] is None and all(isinstance(m, LazyMask) is queued for m in masks[1:])
    for mask in map(resolve, masks[1:]):
        assert mask.shape == (7, 2, 5) and set(mask.unique().tolist()) <= {0.0, 2.0}
    with_input = stack.draw_masks(7, 2, like, FairseqDropout(0.5).train())
    assert with_input[0].shape == (7, 2, 3)
    assert stack.eval().draw_masks(7, 2, like, FairseqDropout(0.5).eval()) == [None] * 3
