"""Label-smoothed cross entropy of the head, computed on target-token chunks.

Only real (non-padding) target tokens are gathered and projected; logits are materialised
at most ``chunk_tokens`` tokens at a time and recomputed in backward
(``torch.utils.checkpoint``), so batch x length x vocabulary logits never exist at once.
The sums equal fairseq's ``label_smoothed_nll_loss(..., reduce=True)``.
This function is what one data-parallel shard of the head runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .encoder import EncoderOut
from .head import AttentionHead


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


class SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross entropy of logits (N x V) with a fused backward.

    loss = a * nll + b * smooth with nll = lse - z[target], smooth = V * lse - sum(z),
    a = 1 - eps - eps_i, b = eps_i = eps / (V - 1) (fairseq's label_smoothed_nll_loss).
    Its gradient is (a + b V) softmax(z) - b - a onehot(target): one exp pass over the
    logits in backward instead of autograd's logsumexp/sum/gather backward chain (each a
    full N x V tensor), which took a quarter of a CPU training step. When the logits are
    an intermediate result (not a leaf), backward turns their buffer into the gradient
    in place: the head's peak memory is then one N x V tensor, not two. Callers must not
    read the logits after backward (the head does not: the output layer's backward needs
    its input and weight only).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float):
        log_normaliser = torch.logsumexp(logits, dim=-1)
        nll_sum = (log_normaliser - logits.gather(1, target.unsqueeze(1)).squeeze(1)).sum()
        vocab = logits.size(-1)
        if epsilon > 0:
            eps_i = epsilon / (vocab - 1)
            a, b = 1.0 - epsilon - eps_i, eps_i
            smooth_sum = (vocab * log_normaliser - logits.sum(dim=-1)).sum()
            loss = a * nll_sum + b * smooth_sum
        else:
            a, b = 1.0, 0.0
            loss = nll_sum.clone()
        ctx.save_for_backward(logits, target, log_normaliser)
        ctx.coefficients = (a, b)
        ctx.reuse_logits = logits.grad_fn is not None
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Optional[Tensor]):
        logits, target, log_normaliser = ctx.saved_tensors
        a, b = ctx.coefficients
        vocab = logits.size(-1)
        shift = log_normaliser.unsqueeze(1)
        grad = logits.sub_(shift) if ctx.reuse_logits else torch.sub(logits, shift)
        grad.exp_()
        grad.mul_(grad_loss * (a + b * vocab))
        if b != 0.0:
            grad.sub_(grad_loss * b)
        grad.scatter_add_(1, target.unsqueeze(1), (-a * grad_loss).expand(target.size(0), 1).to(grad.dtype))
        return grad, None, None


def smoothed_token_loss(
    logits: Tensor, target: Tensor, epsilon: float, count_correct: bool
) -> tuple:
    """Sums over tokens of fairseq's smoothed loss, nll and (optionally) correct argmaxes."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    loss, nll_sum = SmoothedCrossEntropy.apply(logits, target, epsilon)
    correct = logits.argmax(dim=-1).eq(target).sum() if count_correct else None
    return loss, nll_sum, correct


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
        return smoothed_token_loss(
            head.project(combined_chunk), target_chunk, epsilon, count_correct
        )

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
