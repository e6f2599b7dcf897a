"""Stage times from FLOPs and bytes: what one device of a ``DeviceProfile`` would measure,
for a model and batch, in the ``StageTimes`` form the simulator reads — so several GPUs
can be predicted without one. Every term is a count of this code's work (FLOPs of its
matrix products at the profile's rates, bytes of its elementwise passes at the profile's
memory bandwidth, launches at its overheads); the counts are in the functions below.
An LSTM cell: its recurrent part (with the gates' elementwise work) on the profile's
curves fitted to published cuDNN timings, which leave the input projection out; that is
charged as one matrix product (``lstm_cell_seconds``).

The loss's passes over the logits (``model/loss.py: ProjectedSmoothedCrossEntropy``,
16-bit training): the projection writes them (2 bytes), ``log_softmax`` reads them and
writes float32 log-probabilities (6), the smoothing sum and the target gather read those
(4); backward turns them into the gradient in place (exp, mul, sub: 24), casts it to
16 bits (read 4, write 2) for the output layer's two products: 12 + 30 = 42 bytes per
logit. float32 training: log_softmax in place (read 4, write 4), no casts: 16 + 24 = 40.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from ..parallel.schedule import DECODER, ENCODER, Key, chunk_bounds
from .profiles import DeviceProfile
from .sizes import BatchSize, ModelSize
from ..chunking.wavefront import CellTimes
from .stage_times import StageTimes

LOGIT_BYTES_16BIT = (12, 30)  # forward, backward bytes per logit (see the module docstring)
LOGIT_BYTES_32BIT = (16, 24)
HEAD_KERNELS = (30, 60)  # forward, backward launches of one head shard
# per hidden unit per token: the recurrent kernels read the input projection's 4 gate
# pre-activations where the published calls (cuDNN's skip-input mode) read one input
# (forward), and write the 4 pre-activations' gradients where they wrote one (backward)
PRE_ACTIVATION_EXTRA_ELEMENTS = 3


def lstm_flops_per_token(inputs: int, hidden: int) -> int:
    """Forward FLOPs of one LSTM layer for one token: 4 gates x (W_i x + W_h h)."""
    return 2 * 4 * hidden * (inputs + hidden)


def recurrent_seconds(profile: DeviceProfile, steps: int, sentences: int,
                      hidden: int) -> Tuple[float, float]:
    """Forward and backward seconds of the recurrent part of one call (W_h h, step after
    step, and the gates' elementwise work: what the published timings cover) from the
    profile's curves at ``hidden``'s nearest published size: forward at the forward
    curve's rate, backward the training curve's time (3x the FLOPs) less forward's."""
    if sentences <= 0 or steps <= 0:
        return 0.0, 0.0
    curves = profile.lstm_curves(hidden)
    flops = lstm_flops_per_token(0, hidden) * steps * sentences
    forward = flops / curves.forward.rate(sentences)
    return forward, 3 * flops / curves.training.rate(sentences) - forward


def lstm_cell_seconds(profile: DeviceProfile, steps: int, sentences: int, inputs: int,
                      hidden: int) -> Tuple[float, float]:
    """Forward and backward seconds of one pipeline cell: ``steps`` time steps of one
    layer over ``sentences`` sentences. The recurrent part from the published curves
    (``recurrent_seconds``); what the published calls leave out, charged here: the input
    projection (W_i x for every step: one matrix product, at the matrix-product rate;
    backward twice, dX and dW), the gate pre-activations' extra passes
    (``PRE_ACTIVATION_EXTRA_ELEMENTS``) and the cell's own overhead."""
    recurrent_forward, recurrent_backward = recurrent_seconds(profile, steps, sentences, hidden)
    tokens = steps * sentences
    projection = 2 * 4 * hidden * inputs * tokens / profile.gemm_flops
    extra = (PRE_ACTIVATION_EXTRA_ELEMENTS * hidden * tokens * profile.activation_bytes
             / profile.memory_bytes_per_s)
    forward = profile.cell_overhead_s + recurrent_forward + projection + extra
    backward = profile.cell_overhead_s + recurrent_backward + 2 * projection + extra
    return forward, backward


def head_seconds(profile: DeviceProfile, model: ModelSize, batch: BatchSize,
                 sentences: int) -> Tuple[float, float]:
    """Forward and backward seconds of the head + loss on one shard of ``sentences``."""
    if sentences <= 0:
        return 0.0, 0.0
    tokens = sentences * batch.target_len
    source, query = model.hidden, model.decoder_size
    combined, vocab = model.embed, model.vocab
    flops = 2 * tokens * (
        query * source  # W_a h
        + 2 * batch.source_len * source  # scores and context
        + (query + source) * combined  # W_c [h; c]
        + combined * vocab  # the output layer
    )
    logit_bytes = LOGIT_BYTES_16BIT if profile.activation_bytes == 2 else LOGIT_BYTES_32BIT
    attention_bytes = tokens * batch.source_len * 4 * 6  # float32 softmax over the scores
    launches = [k * profile.kernel_overhead_s for k in HEAD_KERNELS]
    forward = (flops / profile.gemm_flops + launches[0]
               + (tokens * vocab * logit_bytes[0] + attention_bytes) / profile.memory_bytes_per_s)
    backward = (2 * flops / profile.gemm_flops + launches[1]
                + (tokens * vocab * logit_bytes[1] + 2 * attention_bytes) / profile.memory_bytes_per_s)
    return forward, backward


@dataclass(frozen=True)
class ParameterCounts:
    master: int  # not in an LSTM layer: embeddings and bridge (device 0), head (top layers')
    head: int  # W_a, W_c, W_o, b_o
    layers: Tuple[int, ...]  # encoder + decoder layer l
    tensors: int  # parameter tensors in all (the optimizer's loop)

    @property
    def total(self) -> int:
        return self.master + sum(self.layers)


def parameter_counts(model: ModelSize) -> ParameterCounts:
    query = model.decoder_size
    head = query * model.hidden + (query + model.hidden) * model.embed + model.embed * model.vocab + model.vocab
    bridge = 2 * (model.hidden * query + query) if query != model.hidden else 0
    layers = []
    for layer in range(model.layers):
        encoder_in = model.embed if layer == 0 else model.hidden
        decoder_in = model.embed if layer == 0 else query
        layers.append(4 * model.hidden * (encoder_in + model.hidden + 2)
                      + 4 * query * (decoder_in + query + 2))
    tensors = 2 + 8 * model.layers + 4 + (4 if bridge else 0)
    return ParameterCounts(2 * model.vocab * model.embed + bridge + head, head, tuple(layers), tensors)


def mask_elements(model: ModelSize, batch: BatchSize) -> Tuple[int, int]:
    """Dropout-mask elements drawn before the pipeline (``draw_step``: embeddings, between
    layers, the encoder's top) and by the head (the combined states)."""
    dropout_out = model.dropout if model.dropout_out is None else model.dropout_out
    query = model.decoder_size
    b, s, t = batch.sentences, batch.source_len, batch.target_len
    drawn = 0
    if model.dropout > 0:
        drawn += b * (s + t) * model.embed
    if dropout_out > 0:
        drawn += b * s * model.hidden * model.layers + b * t * query * (model.layers - 1)
    return drawn, (b * t * model.embed if dropout_out > 0 else 0)


def stage_times_from_profile(
    model: ModelSize, batch: BatchSize, profile: DeviceProfile, chunk_counts: Sequence[int],
    device_counts: Sequence[int],
) -> StageTimes:
    """``StageTimes`` of ``model`` on ``batch`` as one device of ``profile`` would run them."""
    act = profile.activation_bytes
    query = model.decoder_size
    cells: Dict[int, CellTimes] = {}
    for chunks in sorted(set(chunk_counts) | {1}):
        forward: Dict[Key, float] = {}
        backward: Dict[Key, float] = {}
        output_bytes: Dict[Key, int] = {}
        spans = {ENCODER: chunk_bounds(batch.source_len, chunks),
                 DECODER: chunk_bounds(batch.target_len, chunks)}
        for side, hidden in ((ENCODER, model.hidden), (DECODER, query)):
            for layer in range(model.layers):
                inputs = model.embed if layer == 0 else hidden
                for chunk, (start, end) in enumerate(spans[side]):
                    key = (side, layer, chunk)
                    forward[key], backward[key] = lstm_cell_seconds(
                        profile, end - start, batch.sentences, inputs, hidden)
                    output_bytes[key] = (end - start) * batch.sentences * hidden * act
        cells[chunks] = CellTimes(chunks, len(spans[ENCODER]), len(spans[DECODER]),
                                  model.layers, forward, backward, output_bytes,
                                  2 * batch.sentences * model.hidden * act)
    shard_sizes = sorted({-(-batch.sentences // n) for n in device_counts} | {batch.sentences})
    combine_masks = mask_elements(model, batch)[1] / batch.sentences  # per sentence
    heads = {s: head_seconds(profile, model, batch, s) for s in shard_sizes}
    heads = {s: (f + profile.mask_seconds(int(combine_masks * s)), b) for s, (f, b) in heads.items()}
    counts = parameter_counts(model)
    bandwidth = profile.memory_bytes_per_s
    embed_bytes = batch.sentences * (batch.source_len + batch.target_len) * model.embed * act
    rest = (counts.total * profile.optimizer_bytes_per_param / bandwidth
            + counts.tensors * profile.optimizer_kernels_per_tensor * profile.kernel_overhead_s)
    return StageTimes(
        model, batch, threads=0, repeats=0, cells=cells,
        embed_forward=3 * embed_bytes / bandwidth + 4 * profile.kernel_overhead_s
        + profile.mask_seconds(mask_elements(model, batch)[0]),
        embed_backward=(2 * embed_bytes + 4 * model.vocab * model.embed * act) / bandwidth
        + 4 * profile.kernel_overhead_s,
        head_forward={s: f for s, (f, _) in heads.items()},
        head_backward={s: b for s, (_, b) in heads.items()},
        head_param_bytes=counts.head * act,
        head_input_bytes_per_sentence=(batch.target_len * query + batch.source_len * model.hidden) * act,
        rest=rest, cycle_overhead={n: 0.0 for n in device_counts}, device=profile.name,
        param_bytes_master=counts.master * act,
        param_bytes_layer=tuple(n * act for n in counts.layers),
        activation_bytes=act, host=profile.host,
    )
