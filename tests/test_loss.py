"""Tests of fairseq_hybrid/model/loss.py."""
import pytest
import torch


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_output_layer_and_loss_match_autograd_of_fairseqs_formula(epsilon, bias):
    """Loss, nll, correct count and all three gradients against autograd through
    log_softmax (fairseq's label_smoothed_nll_loss written out), in float64."""
    from fairseq_hybrid.model.loss import projected_token_loss

    generator = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(5, 9, bias=bias).double()
    features = torch.randn(6, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    target = torch.randint(0, 9, (6,), generator=generator)
    parameters = (features, layer.weight) + ((layer.bias,) if bias else ())

    loss, nll, correct = projected_token_loss(layer, features, target, epsilon, True)
    lprobs = torch.log_softmax(layer(features), dim=-1)
    expected_nll = -lprobs.gather(1, target[:, None]).sum()
    eps_i = epsilon / 8
    expected = (1 - epsilon - eps_i) * expected_nll + eps_i * -lprobs.sum()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(nll, expected_nll, rtol=1e-12, atol=0)
    assert int(correct) == int(lprobs.argmax(-1).eq(target).sum())
    assert not nll.requires_grad
    loss.backward()
    reference = [p.grad.clone() for p in parameters]
    for p in parameters:
        p.grad = None
    expected.backward()
    for got, want in zip(reference, (p.grad for p in parameters)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_fused_loss_refuses_a_second_backward_loudly():
    """Its backward reuses the log-probabilities' buffer: a retained graph's second
    backward is torch's in-place error, never a silently wrong gradient."""
    from fairseq_hybrid.model.loss import projected_token_loss

    layer = torch.nn.Linear(4, 7)
    features = torch.randn(3, 4, requires_grad=True)
    loss = projected_token_loss(layer, features, torch.tensor([1, 2, 3]), 0.1, False)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
