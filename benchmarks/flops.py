"""Model FLOPs, counted analytically, and the machine's matrix-product FLOP/s, measured.

Model FLOP utilisation (MFU) = achieved model FLOP/s / a large matrix product's FLOP/s
measured in the same run with the same threads. Only matrix-product FLOPs are counted
(2 per multiply-add): LSTM gates, attention (W_a projection, scores, context), the
combine layer W_c[h; c], the output layer. Elementwise work (gates' nonlinearities,
softmax, dropout, the optimizer) is not counted: it is the overhead MFU exposes.
Backward = 2 x forward; the chunked head's recompute adds one more forward of the
output layer.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import torch


@dataclass(frozen=True)
class ModelShape:
    layers: int
    encoder_embed: int
    encoder_hidden: int
    decoder_embed: int
    decoder_hidden: int
    out_embed: int
    vocab: int
    input_feeding: bool  # fairseq lstm, HybridNMT-IF: H_c of t-1 is part of layer 0's input
    head_recompute: bool = False  # --softmax-chunk-tokens > 0

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


def lstm_flops(inputs: int, hidden: int) -> int:
    """Forward FLOPs of one LSTM layer for one token: 4 gates x (W_i x + W_h h)."""
    return 2 * 4 * hidden * (inputs + hidden)


def encoder_flops_per_token(shape: ModelShape) -> int:
    return sum(
        lstm_flops(shape.encoder_embed if layer == 0 else shape.encoder_hidden, shape.encoder_hidden)
        for layer in range(shape.layers)
    )


def decoder_flops_per_token(shape: ModelShape, source_length: float) -> float:
    """Forward FLOPs per target token attending over ``source_length`` source states."""
    first_input = shape.decoder_embed + (shape.out_embed if shape.input_feeding else 0)
    lstm = sum(
        lstm_flops(first_input if layer == 0 else shape.decoder_hidden, shape.decoder_hidden)
        for layer in range(shape.layers)
    )
    attention = (
        2 * shape.decoder_hidden * shape.encoder_hidden  # W_a h
        + 2 * 2 * shape.encoder_hidden * source_length  # scores and context
    )
    combine = 2 * (shape.decoder_hidden + shape.encoder_hidden) * shape.out_embed
    output = 2 * shape.out_embed * shape.vocab
    return lstm + attention + combine + output


def training_flops_per_target_token(
    shape: ModelShape, source_per_target: float, source_length: float
) -> float:
    """Forward + backward (+ head recompute) FLOPs per target token of a batch with
    ``source_per_target`` source tokens per target token and mean attended source length
    ``source_length`` (per target token)."""
    forward = source_per_target * encoder_flops_per_token(shape) + decoder_flops_per_token(
        shape, source_length
    )
    recompute = 2 * shape.out_embed * shape.vocab if shape.head_recompute else 0
    return 3 * forward + recompute


def matmul_flops_per_second(
    threads: int, size: int = 2048, repeats: int = 5, device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Median FLOP/s of a ``size`` x ``size`` matrix product in ``dtype`` (``threads`` torch
    threads on the CPU; one GPU when ``device`` is CUDA)."""
    device = device or torch.device("cpu")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        inner = 3 if device.type == "cpu" else 50
        times = []
        for _ in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append((time.perf_counter() - start) / inner)
        return 2 * size**3 / statistics.median(times[1:])
    finally:
        torch.set_num_threads(previous)
