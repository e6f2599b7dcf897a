"""Hybrid against what a user would run instead, on the same devices: fairseq's data
parallelism (DDP) of the same model — at the same global batch (1/N of the sentences per
device, with the profile's small-batch LSTM slowdown) and at N times the batch — each
step from the same stage-time model, so the comparison cannot favour either side.

DDP: every device runs the whole model on its sentences; the gradients of all parameters
are all-reduced (ring: 2 (N-1)/N of their bytes over the link, in 25 MB buckets started as
backward produces them, so only what outlasts backward — at least the last bucket — adds
to the step); every device then runs the whole optimizer step.
Speedups are tokens per second over the same model on one device at the global batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from .analytic import stage_times_from_profile
from .profiles import DeviceProfile, with_link
from ..chunking.wavefront import Link
from .sizes import BatchSize, ModelSize
from .step_time import predict_step
from .stage_times import StageTimes

BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


@dataclass(frozen=True)
class SchemePrediction:
    devices: int
    step_s: float
    sentences: int  # per step, all devices together
    speedup: float  # tokens/s over one device at the global batch
    chunks: Optional[int] = None  # hybrid: the fastest K
    exposed_allreduce_s: float = 0.0  # DDP: what of the all-reduce outlasts backward


def allreduce_seconds(nbytes: float, devices: int, link: Link) -> float:
    """A bucketed ring all-reduce of ``nbytes`` over ``devices``."""
    if devices <= 1:
        return 0.0
    buckets = max(1, math.ceil(nbytes / BUCKET_BYTES))
    volume = 2 * (devices - 1) / devices * nbytes
    return link.cost(volume, count=2 * (devices - 1) * buckets)


StageFor = Callable[[BatchSize, Sequence[int], Sequence[int]], StageTimes]


def profile_stages(profile: DeviceProfile, model: ModelSize) -> StageFor:
    """Stage times of ``model`` at any batch, from ``profile``'s rates."""
    def stage_for(batch: BatchSize, chunks: Sequence[int], devices: Sequence[int]) -> StageTimes:
        return stage_times_from_profile(model, batch, profile, chunks, devices)
    return stage_for


def ddp_step(stage: StageTimes, devices: int, link: Link) -> Dict[str, float]:
    """One DDP step on ``devices`` devices, each running ``stage`` (the whole model on its
    batch): compute, the all-reduce, what of it outlasts backward, total."""
    parts = predict_step(stage, 1, 1, "dataflow", Link())
    backward = parts["pipeline_backward"] + parts["head_backward"] + parts["embeddings_backward"]
    grads = stage.param_bytes_master + sum(stage.param_bytes_layer)
    ring = allreduce_seconds(grads, devices, link)
    buckets = max(1, math.ceil(grads / BUCKET_BYTES))
    exposed = max(ring - backward, ring / buckets) if devices > 1 else 0.0
    return {"compute": parts["total"], "allreduce": ring, "exposed_allreduce": exposed,
            "total": parts["total"] + exposed}


def compare(stage_for: StageFor, layers: int, batch: BatchSize, device_counts: Sequence[int],
            chunk_counts: Sequence[int], link: Link) -> Dict[str, List[SchemePrediction]]:
    """Per N: today's hybrid schedule at its fastest K, DDP at the same global batch, DDP
    at N x the batch, all over ``link``, from stage times ``stage_for`` gives."""
    counts = sorted(set(device_counts) | {1})
    chunks = sorted(set(chunk_counts) | {1})
    stage = stage_for(batch, chunks, counts)
    stages = {batch: stage}  # each batch's stage times once (``measured`` measures them)
    base = predict_step(stage, 1, 1, "dataflow", link)["total"]
    rows: Dict[str, List[SchemePrediction]] = {"hybrid": [], "ddp_same_batch": [], "ddp_n_batch": []}
    for n in counts:
        if n <= layers:
            steps = {k: predict_step(stage, n, k, "dataflow", link)["total"] for k in chunks}
            k = min(steps, key=steps.get)
            rows["hybrid"].append(SchemePrediction(n, steps[k], batch.sentences, base / steps[k], k))
        share = BatchSize(math.ceil(batch.sentences / n), batch.source_len, batch.target_len)
        if share not in stages:
            stages[share] = stage_for(share, [1], [1])
        same = ddp_step(stages[share], n, link)
        rows["ddp_same_batch"].append(SchemePrediction(n, same["total"], batch.sentences,
                                                       base / same["total"],
                                                       exposed_allreduce_s=same["exposed_allreduce"]))
        more = ddp_step(stage, n, link)  # each device the whole batch: its compute is ``base``
        rows["ddp_n_batch"].append(SchemePrediction(n, more["total"], n * batch.sentences,
                                                    n * base / more["total"],
                                                    exposed_allreduce_s=more["exposed_allreduce"]))
    return rows


def compare_profile(profile: DeviceProfile, model: ModelSize, batch: BatchSize,
                    device_counts: Sequence[int], chunk_counts: Sequence[int],
                    link: Link = Link()) -> Dict[str, List[SchemePrediction]]:
    """``compare`` with stage times from ``profile`` (``link`` overrides its link)."""
    profile = with_link(profile, link)
    return compare(profile_stages(profile, model), model.layers, batch, device_counts,
                   chunk_counts, profile.link)


def fastest(rows: Dict[str, List[SchemePrediction]], devices: int, same_batch: bool = True) -> str:
    """Which of hybrid and DDP (at the same batch, or also DDP at N x batch) is predicted
    faster on ``devices`` devices."""
    names = ["hybrid", "ddp_same_batch"] + ([] if same_batch else ["ddp_n_batch"])
    best = {name: p.speedup for name in names for p in rows[name] if p.devices == devices}
    return max(best, key=best.get)
