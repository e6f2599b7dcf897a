"""Label-smoothed cross entropy of the head, computed on target-token chunks.

Only real (non-padding) target tokens are gathered and projected; logits are materialised
at most ``chunk_tokens`` tokens at a time and recomputed in backward
(``torch.utils.checkpoint``), so batch x length x vocabulary logits never exist at once.
The sums equal fairseq's ``label_smoothed_nll_loss(..., reduce=True)``.
This function is what one data-parallel shard of the head runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .encoder import EncoderOut
from .head import AttentionHead
from .logits_workspace import linear_into_buffer


class HeadLoss(NamedTuple):
    loss: Tensor  # summed label-smoothed loss (differentiable)
    nll_loss: Tensor  # summed negative log-likelihood (detached)
    n_correct: Optional[Tensor]  # argmax == target count, when asked for


def sum_head_losses(parts: Sequence[HeadLoss], device: Optional[torch.device] = None) -> HeadLoss:
    """The sums of several parts' losses (token chunks, sentence shards), on ``device``
    (default: where they are)."""
    def total(tensors: List[Tensor]) -> Tensor:
        return torch.stack([t if device is None else t.to(device) for t in tensors]).sum()

    counts = [part.n_correct for part in parts if part.n_correct is not None]
    return HeadLoss(
        total([part.loss for part in parts]),
        total([part.nll_loss for part in parts]),
        total(counts) if counts else None,
    )


def smoothing_coefficients(epsilon: float, vocab: int) -> Tuple[float, float]:
    """(a, b) of fairseq's label_smoothed_nll_loss as ``a * nll + b * smooth``:
    a = 1 - eps - eps_i, b = eps_i = eps / (V - 1)."""
    if epsilon <= 0:
        return 1.0, 0.0
    eps_i = epsilon / (vocab - 1)
    return 1.0 - epsilon - eps_i, eps_i


class ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output layer and the summed label-smoothed cross entropy of its logits, fused.

    loss = a * nll + b * smooth with nll = -log p[target], smooth = -sum_v log p[v]
    (``smoothing_coefficients``). The logits (N x V) are the only N x V tensor: the
    output layer writes them, ``log_softmax`` turns them into log-probabilities in place
    (one fused pass per row), and backward turns those into the logits' gradient in place,
    (a + b V) p - b - a onehot(target), before the two matrix products of the output
    layer's backward. Autograd's chain (logsumexp, its temporaries, gather, sum, and the
    linear layer's backward on a fresh gradient tensor) allocated and page-faulted three
    more N x V float32 tensors per step and passed over them about ten times: a tenth of
    a CPU training step at a vocabulary of 8K. float32 logits are written into a buffer
    kept between steps (``logits_workspace``); 16-bit logits get a float32 copy for the
    loss (the gradient is cast back for the products), as fairseq's criterion does.
    """

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor,
                epsilon: float, count_correct: bool):
        logits, ctx.lease = linear_into_buffer(features, weight, bias)
        if logits.dtype in (torch.float32, torch.float64):
            log_probs = torch._log_softmax(logits, -1, False, out=logits)
        else:
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        a, b = smoothing_coefficients(epsilon, log_probs.size(-1))
        nll_sum = -log_probs.gather(1, target.unsqueeze(1)).sum()
        loss = a * nll_sum - b * log_probs.sum() if b != 0.0 else nll_sum.clone()
        correct = log_probs.argmax(dim=-1).eq(target).sum() if count_correct else None
        ctx.save_for_backward(features, weight, log_probs, target)
        ctx.coefficients = (a, b)
        ctx.logits_dtype = logits.dtype
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(*(t for t in (nll_sum, correct) if t is not None))
        return loss, nll_sum, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Optional[Tensor], _grad_correct: Optional[Tensor]):
        features, weight, log_probs, target = ctx.saved_tensors
        a, b = ctx.coefficients
        grad = log_probs.exp_()  # the buffer is this node's own: nothing else reads it
        grad.mul_(grad_loss * (a + b * grad.size(-1)))
        if b != 0.0:
            grad.sub_(grad_loss * b)
        grad.scatter_add_(1, target.unsqueeze(1), (-a * grad_loss).expand(target.size(0), 1).to(grad.dtype))
        grad = grad.to(ctx.logits_dtype)
        grad_features = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_features = grad.mm(weight.to(grad.dtype)).to(features.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t().mm(features.to(grad.dtype)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0).to(weight.dtype)
        if ctx.lease is not None:
            ctx.lease.give_back()
        return grad_features, grad_weight, grad_bias, None, None, None


def projected_token_loss(
    output_proj: nn.Linear, features: Tensor, target: Tensor, epsilon: float, count_correct: bool
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Sums over tokens (rows of ``features``, N x D) of fairseq's smoothed loss, nll and
    (optionally) correct argmaxes of ``output_proj``'s logits."""
    return ProjectedSmoothedCrossEntropy.apply(
        features, output_proj.weight, output_proj.bias, target, epsilon, count_correct)


def selected_tokens(target: Tensor, padding_idx: int, ignore_prefix_size: int = 0) -> Tensor:
    """B x T: the target positions the loss counts (real tokens past the prefix)."""
    selected = target.ne(padding_idx)
    if ignore_prefix_size > 0:
        selected[:, :ignore_prefix_size] = False
    return selected


def chunked_head_loss(
    head: AttentionHead,
    features: Tensor,
    encoder_out: EncoderOut,
    target: Tensor,
    padding_idx: int,
    epsilon: float,
    chunk_tokens: int,
    features_are_combined: bool = False,
    ignore_prefix_size: int = 0,
    count_correct: bool = False,
    combine_mask: Optional[Tensor] = None,
) -> HeadLoss:
    """Loss of the head over one batch (or shard) of sentences.

    features: B x T x D decoder states H (or H_c when ``features_are_combined``);
    target: B x T with ``padding_idx`` at padding; combine_mask: the dropout mask of H_c
    for the selected tokens, drawn in advance by a caller that shards the batch.
    """
    selected = selected_tokens(target, padding_idx, ignore_prefix_size)
    if features_are_combined:
        combined = features[selected]
    else:
        context, _ = head.attend(
            features, encoder_out["encoder_out"], encoder_out["encoder_padding_mask"]
        )
        combined = head.combine(features[selected], context[selected], combine_mask)
    tokens = target[selected]

    def chunk_loss(combined_chunk: Tensor, target_chunk: Tensor) -> tuple:
        return projected_token_loss(head.output_proj, combined_chunk, target_chunk, epsilon, count_correct)

    total = tokens.numel()
    if chunk_tokens <= 0 or total <= chunk_tokens:
        return HeadLoss(*chunk_loss(combined, tokens))
    return sum_head_losses([
        HeadLoss(*checkpoint(chunk_loss, combined[start : start + chunk_tokens],
                             tokens[start : start + chunk_tokens], use_reentrant=False))
        for start in range(0, total, chunk_tokens)
    ])


@dataclass(frozen=True)
class TokenLoss:
    """``chunked_head_loss`` with the criterion's settings bound: what one head shard runs."""

    padding_idx: int
    epsilon: float
    chunk_tokens: int
    features_are_combined: bool = False
    ignore_prefix_size: int = 0
    count_correct: bool = False

    def selection(self, target: Tensor) -> Tensor:
        return selected_tokens(target, self.padding_idx, self.ignore_prefix_size)

    def __call__(
        self, head: AttentionHead, features: Tensor, encoder_out: EncoderOut, target: Tensor,
        combine_mask: Optional[Tensor] = None,
    ) -> HeadLoss:
        return chunked_head_loss(
            head, features, encoder_out, target, self.padding_idx, self.epsilon,
            self.chunk_tokens, self.features_are_combined, self.ignore_prefix_size,
            self.count_correct, combine_mask,
        )
