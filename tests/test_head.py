"""Tests of fairseq_hybrid/model/head.py."""
import torch

from fairseq_hybrid.model.head import AttentionHead


def test_attention_in_float64_computes_in_float64():
    """The attention weights of a float64 model match a float64 reference to 1e-12 (a
    float32 softmax is off by ~1e-8 and costs 1e-4 relative in float64 gradient checks)."""
    torch.manual_seed(0)
    head = AttentionHead(6, 5, 7, 11, dropout=0.0).double()
    queries, sources = torch.randn(3, 4, 6, dtype=torch.float64), torch.randn(3, 8, 5, dtype=torch.float64)
    mask = torch.zeros(3, 8, dtype=torch.bool)
    mask[1, :3] = True
    context, weights = head.attend(queries, sources, mask)
    scores = (queries @ head.score_proj.weight.T) @ sources.transpose(1, 2)
    scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
    expected = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected = expected / expected.sum(-1, keepdim=True)
    assert weights.dtype == torch.float64
    assert torch.allclose(weights, expected, rtol=0, atol=1e-12)
    assert torch.allclose(context, expected @ sources, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda q: head.attend(q, sources, mask)[0],
                                    (queries.clone().requires_grad_(),), rtol=1e-6, atol=1e-9)
