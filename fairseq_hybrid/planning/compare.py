"""Every way to train the model on N devices, each step from the same stage-time model so
the comparison cannot favour any of them, and the fastest at the user's global batch:

- ``hybrid``: one process drives the N devices (the layer pipeline and the sharded head).
- ``ddp_same_batch``: fairseq's data parallelism (torch DDP, one process per device), each
  device 1/N of the sentences (with the profile's small-batch LSTM slowdown).
- ``ddp_sharded``: the same with the optimizer state sharded over the processes (fairseq's
  ``--zero-sharding os``): each process steps 1/N of the parameters, then the updated
  parameters are gathered from their owners after the step.
- ``groups``: S-device hybrids in R = N / S processes (S, R > 1), data parallel between
  them with ``legacy_ddp`` (what the plugin runs for several devices per process: the
  all-reduce follows backward), each group 1/R of the sentences.
- ``ddp_n_batch``: DDP at N times the batch (another batch: shown, never picked).

DDP: every device runs the whole model on its sentences; the gradients of all parameters
are all-reduced (ring: 2 (N-1)/N of their bytes over the link, in 25 MB buckets started as
backward produces them, so only what outlasts backward — at least the last bucket — adds
to the step); every device then runs the whole optimizer step.
Speedups are tokens per second over the same model on one device at the global batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..chunking.chunk_choice import simplest_within
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
    stages: int = 1  # devices per process
    replicas: int = 1  # processes (data-parallel replicas)


# the schemes that train the user's global batch, in the order a tie goes to
SAME_BATCH = ("hybrid", "ddp_same_batch", "ddp_sharded", "groups")
# the fairseq-train options that shard the optimizer state over DDP processes, as the plugin
# runs them (``plugin/sharded_optimizer.py``: torch's ZeroRedundancyOptimizer); None would
# leave ``ddp_sharded`` predicted but never picked
SHARDED_OPTIMIZER: Optional[Tuple[str, ...]] = ("--zero-sharding", "os")


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


def ddp_sharded_step(stage: StageTimes, devices: int, link: Link) -> Dict[str, float]:
    """``ddp_step`` with the optimizer state sharded: each process steps 1/N of the
    parameters, then gathers the others' updated parameters (a ring all-gather of
    (N-1)/N of their bytes, after the step: exposed)."""
    step = ddp_step(stage, devices, link)
    if devices <= 1:
        return {**step, "gather": 0.0}
    params = stage.param_bytes_master + sum(stage.param_bytes_layer)
    gather = link.cost((devices - 1) / devices * params, count=devices - 1)
    saved = stage.rest * (1 - 1 / devices)
    return {**step, "gather": gather, "total": step["total"] - saved + gather}


def group_splits(devices: int, layers: int) -> List[Tuple[int, int]]:
    """(stages, replicas) with stages x replicas = ``devices``, both > 1, stages <= layers."""
    return [(s, devices // s) for s in range(2, min(devices, layers) + 1)
            if devices % s == 0 and devices // s > 1]


def fastest_hybrid(stage: StageTimes, devices: int, chunks: Sequence[int], link: Link,
                   schedule: str) -> Tuple[int, float]:
    """The fastest K (of ``chunks`` that ``stage`` has cell times for) and its step for a
    hybrid over ``devices``."""
    steps = {k: predict_step(stage, devices, k, schedule, link)["total"]
             for k in chunks if k in stage.cells}
    k = min(steps, key=steps.get)
    return k, steps[k]


def compare(stage_for: StageFor, layers: int, batch: BatchSize, device_counts: Sequence[int],
            chunk_counts: Sequence[int], link: Link,
            schedule: str = "dataflow") -> Dict[str, List[SchemePrediction]]:
    """Per N, every scheme of the module's list over ``link``, from the stage times
    ``stage_for`` gives (each batch's once); the hybrids under ``schedule`` (GPUs:
    dataflow; CPU devices: cycle)."""
    counts = sorted(set(device_counts) | {1})
    chunks = sorted(set(chunk_counts) | {1})
    stage = stage_for(batch, chunks, [n for n in counts if n <= layers])  # hybrids: a layer each
    # each batch's stage times once (``measured`` measures them), with every K where a
    # hybrid runs it
    stages = {(batch, True): stage}

    def stage_at(sentences: int, devices: int) -> StageTimes:
        share = BatchSize(sentences, batch.source_len, batch.target_len)
        key = (share, devices > 1)
        if (share, True) in stages:
            return stages[(share, True)]
        if key not in stages:
            stages[key] = stage_for(share, chunks if devices > 1 else [1], list(range(1, devices + 1)))
        return stages[key]

    base = predict_step(stage, 1, 1, schedule, link)["total"]
    rows: Dict[str, List[SchemePrediction]] = {name: [] for name in (*SAME_BATCH, "ddp_n_batch")}
    for n in counts:
        if n <= layers:
            k, step = fastest_hybrid(stage, n, chunks, link, schedule)
            rows["hybrid"].append(SchemePrediction(n, step, batch.sentences, base / step, k, stages=n))
        share = stage_at(math.ceil(batch.sentences / n), 1)
        same = ddp_step(share, n, link)
        rows["ddp_same_batch"].append(SchemePrediction(n, same["total"], batch.sentences,
                                                       base / same["total"],
                                                       exposed_allreduce_s=same["exposed_allreduce"],
                                                       replicas=n))
        if n > 1:
            sharded = ddp_sharded_step(share, n, link)
            rows["ddp_sharded"].append(SchemePrediction(n, sharded["total"], batch.sentences,
                                                        base / sharded["total"],
                                                        exposed_allreduce_s=same["exposed_allreduce"],
                                                        replicas=n))
        groups = []
        for s, r in group_splits(n, layers):
            group = stage_at(math.ceil(batch.sentences / r), s)
            k, step = fastest_hybrid(group, s, chunks, link, schedule)
            grads = group.param_bytes_master + sum(group.param_bytes_layer)
            ring = allreduce_seconds(grads, r, link)  # legacy_ddp: after backward, all exposed
            groups.append(SchemePrediction(n, step + ring, batch.sentences, base / (step + ring), k,
                                           exposed_allreduce_s=ring, stages=s, replicas=r))
        if groups:
            rows["groups"].append(max(groups, key=lambda p: p.speedup))
        more = ddp_step(stage, n, link)  # each device the whole batch: its compute is ``base``
        rows["ddp_n_batch"].append(SchemePrediction(n, more["total"], n * batch.sentences,
                                                    n * base / more["total"],
                                                    exposed_allreduce_s=more["exposed_allreduce"],
                                                    replicas=n))
    return rows


def compare_profile(profile: DeviceProfile, model: ModelSize, batch: BatchSize,
                    device_counts: Sequence[int], chunk_counts: Sequence[int],
                    link: Link = Link()) -> Dict[str, List[SchemePrediction]]:
    """``compare`` with stage times from ``profile`` (``link`` overrides its link)."""
    profile = with_link(profile, link)
    return compare(profile_stages(profile, model), model.layers, batch, device_counts,
                   chunk_counts, profile.link)


def fastest(rows: Dict[str, List[SchemePrediction]], devices: int, same_batch: bool = True) -> str:
    """The scheme predicted fastest on ``devices`` devices among those that train the same
    global batch (also DDP at N x the batch unless ``same_batch``); one within
    ``TIE_TOLERANCE`` of it that comes earlier in ``SAME_BATCH`` (simpler to run) wins."""
    names = [name for name in SAME_BATCH if name != "ddp_sharded" or SHARDED_OPTIMIZER]
    names += [] if same_batch else ["ddp_n_batch"]
    best = {name: p.speedup for name in names for p in rows.get(name, []) if p.devices == devices}
    return simplest_within(list(best), lambda name: 1 / best[name])  # seconds per token
