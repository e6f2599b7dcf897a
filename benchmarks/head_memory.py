"""Peak memory of the head (attention, combine, output layer, loss; forward + backward)
with and without token chunking.

    python -m benchmarks.head_memory --vocab 32000 --tokens 8000 --dim 256 --chunk-tokens 1024

Each measurement runs in a fresh process (``measure`` starts it), so allocator caches and
earlier peaks cannot hide anything. CUDA: ``max_memory_allocated`` above what was
allocated before the step. CPU: the resident-set high-water mark (``VmHWM``, reset just before
the step) above the resident set before the step, with glibc's mmap threshold fixed at 64 KiB so every
tensor is mmap-ed and returned to the system when freed (the high-water mark is then the
step's peak of live memory).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Dict

import torch

from .fairseq_runs import ROOT, BenchmarkError


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_resident_bytes() -> int:
    """The resident-set high-water mark (``VmHWM``; ``ru_maxrss`` where /proc lacks it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_resident() -> None:
    """Lower the high-water mark to the current resident set (Linux: ``clear_refs`` 5), so
    a peak of the warm-up or of the imports cannot hide the step's."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def head_step_peak(vocab: int, tokens: int, dim: int, chunk_tokens: int, device: str,
                   source_length: int = 25) -> Dict[str, float]:
    """Forward + backward of the head over ``tokens`` target tokens; peak bytes above the
    memory in use before the step."""
    from fairseq_hybrid.model import logits_workspace
    from fairseq_hybrid.model.head import AttentionHead
    from fairseq_hybrid.model.loss import TokenLoss

    torch.manual_seed(1)
    target_length = 25
    sentences = max(1, tokens // target_length)
    dev = torch.device(device)
    head = AttentionHead(dim, dim, dim, vocab, dropout=0.0).to(dev)
    features = torch.randn(sentences, target_length, dim, device=dev, requires_grad=True)
    sources = torch.randn(sentences, source_length, dim, device=dev, requires_grad=True)
    padding = torch.zeros(sentences, source_length, dtype=torch.bool, device=dev)
    target = torch.randint(4, vocab, (sentences, target_length), device=dev)
    loss_fn = TokenLoss(padding_idx=1, epsilon=0.1, chunk_tokens=chunk_tokens)
    encoder_out = {"encoder_out": sources, "encoder_padding_mask": padding}
    # warm-up on a slice of the batch (both settings alike): thread pools, the autograd
    # engine and the math library's buffers (~75 MB on the first large product) are set
    # up before the measured step, not counted in it
    few = max(1, min(sentences, 1024 // target_length))
    part = {k: v[:few] for k, v in encoder_out.items()}
    loss_fn(head, features[:few], part, target[:few]).loss.backward()
    logits_workspace.release()  # the step's own logits buffer is part of its peak
    head.zero_grad(set_to_none=True)
    features.grad = sources.grad = None
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    else:
        reset_peak_resident()
        before, high_water_before = resident_bytes(), peak_resident_bytes()
    loss_fn(head, features, encoder_out, target).loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
    else:
        after = peak_resident_bytes()
        if after <= high_water_before:
            raise BenchmarkError("the step did not raise the resident high-water mark: an "
                                 "earlier peak hides it (measure in a fresh process)")
        peak = after - before
    return {"vocab": vocab, "tokens": sentences * target_length, "dim": dim,
            "chunk_tokens": chunk_tokens, "device": device, "peak_bytes": peak}


def measure(vocab: int, tokens: int, dim: int, chunk_tokens: int, device: str) -> Dict[str, float]:
    """``head_step_peak`` in a fresh process."""
    command = [sys.executable, "-m", "benchmarks.head_memory", "--vocab", str(vocab),
               "--tokens", str(tokens), "--dim", str(dim), "--chunk-tokens", str(chunk_tokens),
               "--device", device]
    # a fixed mmap threshold: glibc otherwise raises it as large blocks are freed, serves
    # later 10-100 MB chunks from its heap and keeps them resident after free, so the
    # resident high-water mark would count freed chunks as live (flaky, 2-6x too high)
    env = dict(os.environ, PYTHONWARNINGS="ignore", MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise BenchmarkError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--chunk-tokens", type=int, default=0, help="0 = no chunking")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for name in ("vocab", "tokens", "dim"):
        if getattr(args, name) < 1:
            sys.exit(f"head_memory: error: --{name} {getattr(args, name)} must be >= 1")
    print(json.dumps(head_step_peak(args.vocab, args.tokens, args.dim, args.chunk_tokens, args.device)))


if __name__ == "__main__":
    main()
