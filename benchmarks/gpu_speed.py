"""``make gpu-check``'s speed check (``benchmarks/gpu_check.py``, check 4): fairseq's
``lstm_luong_wmt_en_de`` against ``hybrid_lstm_wmt_en_de`` (4+4 x 1000, vocab 32K, synthetic
data, fp16) in target tokens/s on one GPU, MFU against a matrix product measured there, peak
memory; without CUDA the same at small sizes on the CPU."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from .data import length_stats, synthetic_data
from .fairseq_runs import TrainConfig, run_training
from .flops import ModelShape, matmul_flops_per_second, training_flops_per_target_token
from .scaling import dictionary_size


def speed_check(device: str, work: Path, quick: bool) -> Tuple[str, Dict[str, Any]]:
    on_gpu = device.startswith("cuda")
    if on_gpu:
        vocab, sizes, layers, hidden, max_tokens = 32000, "", 4, 1000, 4000
        archs = ("lstm_luong_wmt_en_de", "hybrid_lstm_wmt_en_de")
        extra, env, threads = "--fp16", {"CUDA_VISIBLE_DEVICES": device[5:]}, 1
        placement = " --hybrid-devices cuda:0"
    else:
        layers, hidden, vocab, max_tokens = 2, 64, 1000, 1000
        sizes = (f" --encoder-layers {layers} --decoder-layers {layers} --encoder-embed-dim {hidden}"
                 f" --encoder-hidden-size {hidden} --decoder-embed-dim {hidden}"
                 f" --decoder-hidden-size {hidden} --decoder-out-embed-dim {hidden}")
        archs = ("lstm", "hybrid_lstm")
        extra, env, threads = "", {}, os.cpu_count() or 1
        placement = " --hybrid-devices cpu"
    # the CPU's --quick checks the machinery (``make gpu-check`` without --quick runs the
    # sizes above): less data, one warm-up and one timed interval of 2 updates, and a
    # 1024² matrix product 15 times (1/10 of the work; its peak here is ~0.9x a 2048²'s)
    cpu_quick = quick and not on_gpu
    sentences = 500 if cpu_quick else 2000 if quick else 8000
    data = synthetic_data(vocab, sentences, 15, 40, work / f"synthetic-v{vocab}")
    stats = length_stats(data)
    vocab = dictionary_size(data)  # the word types the data really has, for the FLOPs
    interval, intervals = (2, 2) if cpu_quick else (3, 3) if quick else (10, 3)
    rows: Dict[str, Any] = {}
    for key, arch in zip(("lstm", "hybrid"), archs):
        options = f"--arch {arch}{sizes}" + (placement if key == "hybrid" else "")
        config = TrainConfig(key, arch, options, threads, max_tokens=max_tokens, env=env)
        result = run_training(str(data), config, interval * intervals, interval, extra=extra)
        shape = ModelShape(layers, hidden, hidden, hidden, hidden, hidden, vocab, key == "lstm")
        flops = training_flops_per_target_token(shape, stats.source_per_target,
                                                stats.attended_source_length)
        rows[key] = {"arch": arch, "target_tokens_per_s": result.target_wps,
                     "model_flops_per_target_token": flops,
                     "peak_cuda_bytes": result.peak_cuda_bytes,
                     "peak_rss_bytes": result.peak_rss_bytes}
    dtype = torch.float16 if on_gpu else torch.float32
    size, repeats = (1024, 4) if cpu_quick else (2048, 5)
    peak = matmul_flops_per_second(threads, size, repeats, device=torch.device(device), dtype=dtype)
    for row in rows.values():
        row["mfu"] = row["model_flops_per_target_token"] * row["target_tokens_per_s"] / peak
    ratio = rows["hybrid"]["target_tokens_per_s"] / rows["lstm"]["target_tokens_per_s"]
    data_out = {"precision": "fp16" if on_gpu else "fp32", "matmul_flops_per_s": peak,
                "vocab": vocab,
                "matmul_size": size, "max_tokens": max_tokens, "rows": rows,
                "ratio_hybrid_over_lstm": ratio}
    return (f"{archs[1]} {rows['hybrid']['target_tokens_per_s']:,.0f} vs {archs[0]} "
            f"{rows['lstm']['target_tokens_per_s']:,.0f} target tok/s ({ratio:.2f}x); MFU "
            f"{rows['hybrid']['mfu']:.1%} vs {rows['lstm']['mfu']:.1%}", data_out)
