"""``hybrid_cross_entropy``: the training criterion that runs the attention head itself.

It asks the model for features only (H and the encoder output), then computes attention,
combine, projection and the label-smoothed loss with ``loss.chunked_head_loss`` on target-token
chunks. Logging (loss, nll_loss, ppl, ntokens, nsentences, sample_size) is inherited from
fairseq's ``label_smoothed_cross_entropy``, whose numbers it reproduces.
"""

from dataclasses import dataclass, field
from typing import Any

from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..errors import require
from ..model.loss import TokenLoss


@dataclass
class HybridCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    softmax_chunk_tokens: int = field(
        default=0,
        metadata={
            "help": "compute the output layer and softmax on at most N target tokens at a "
            "time, recomputing them in backward (0 = all tokens at once)"
        },
    )


def validate_criterion_args(cfg: Any) -> None:
    chunk = getattr(cfg, "softmax_chunk_tokens", None)
    if chunk is not None:
        require(isinstance(chunk, int) and chunk >= 0, "--softmax-chunk-tokens", chunk,
                "an integer >= 0 (0 = no chunking)")
    eps = getattr(cfg, "label_smoothing", None)
    if eps is not None:
        require(0.0 <= eps < 1.0, "--label-smoothing", eps, "a value in [0, 1)")


@register_criterion("hybrid_cross_entropy", dataclass=HybridCrossEntropyConfig)
class HybridCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        task: Any,
        sentence_avg: bool,
        label_smoothing: float,
        ignore_prefix_size: int = 0,
        report_accuracy: bool = False,
        softmax_chunk_tokens: int = 0,
    ) -> None:
        validate_criterion_args(
            HybridCrossEntropyConfig(
                label_smoothing=label_smoothing, softmax_chunk_tokens=softmax_chunk_tokens
            )
        )
        super().__init__(
            task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy
        )
        self.softmax_chunk_tokens = softmax_chunk_tokens

    def forward(self, model: Any, sample: dict, reduce: bool = True):
        if not reduce:  # per-token losses: the plain path materialises them anyway
            return super().forward(model, sample, reduce=False)
        decoder = model.decoder
        loss_fn = TokenLoss(
            padding_idx=self.padding_idx,
            epsilon=self.eps,
            chunk_tokens=self.softmax_chunk_tokens,
            features_are_combined=decoder.features_are_combined,
            ignore_prefix_size=self.ignore_prefix_size,
            count_correct=self.report_accuracy,
        )
        target = model.get_targets(sample, None)
        runtime = getattr(model, "runtime", None)
        if runtime is None:  # a model that only shares our decoder API
            features, extra = model(**sample["net_input"], features_only=True)
            result = loss_fn(decoder.head, features, extra["encoder_out"], target)
        else:
            # through model(...) so fairseq's data-parallel wrapper sees the forward
            features, extra = model(**sample["net_input"], features_only=True, hybrid=True)
            result = runtime.head_loss(features, extra["encoder_out"], target, loss_fn)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": result.loss.data,
            "nll_loss": result.nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            logging_output["n_correct"] = utils.item(result.n_correct.data)
            logging_output["total"] = utils.item(
                sample["target"][:, self.ignore_prefix_size:].ne(self.padding_idx).sum()
            )
        return result.loss, sample_size, logging_output
