"""One training step's predicted seconds, by part, from one device's stage times: the
pipeline's forward and backward from the wavefront simulator
(``chunking.wavefront.pipeline_makespans``), the head's shards, the head's traffic as the
code moves it, the optimizer step and, on GPUs, the host's pace; and the speedups over
one device built on it.

- ``cycle`` (CPU devices): the head's shards run forward and backward on the workers in
  parallel (``parallel/head_shards.py``), a ``run_all`` round trip each.
- ``dataflow`` (GPUs): between the pipeline's forward and backward, the head's traffic
  (``traffic.step_traffic``'s routes: each shard's slices of H and S from the top layers'
  device and dH, dS back, one copy after another: ``head_slice_seconds``); the replicas'
  parameters in one broadcast and their gradients in one reduction, NCCL collectives along
  a ring issued on the collective worker's side streams (``parallel/collective_worker.py``),
  each charged only for what outlasts the work it overlaps: the broadcast the embeddings'
  and the pipeline's forward, the reduction the pipeline's backward
  (``overlapped_collectives``).
  The optimizer step ("rest") scales with the largest share of the parameters on one device
  (the embeddings on device 0, the master head with the top layers). Where the stage
  times carry the host's issue times (a GPU profile's), the step is paced by the one
  Python process that issues every device's work (``host_bound``: the part "host_wait").

    step(N, K) = embeddings fwd+bwd + pipeline fwd + head phase + pipeline bwd + rest
                 (+ host_wait on GPUs)
    speedup(N, K) = step(1, 1) / step(N, K)
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..chunking.wavefront import SCHEDULES, Link, pipeline_makespans
from ..parallel.placement import shard_bounds
from .host_bound import host_phases, host_wait
from .sizes import layer_map
from .stage_times import StageTimes
from .traffic import StepShapes, step_traffic


def predict_step(
    stage: StageTimes, devices: int, chunks: int, schedule: str = "cycle",
    link: Link = Link(), balance: Optional[str] = None,
    slowdown: Optional[Mapping[int, float]] = None,
    head_slowdown: Optional[Mapping[int, float]] = None,
) -> Dict[str, float]:
    """Predicted seconds of one training step on ``devices`` devices with ``chunks`` time
    chunks, by part (``total`` is their sum). ``slowdown``: see ``chunking.wavefront.simulate_pipeline``;
    ``head_slowdown``: the same for the head shards' concurrent forward (default:
    ``slowdown``); cycle only; None = devices that do not slow each other down."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: one of {SCHEDULES}")
    cells = stage.cells[chunks]
    mapping = layer_map(devices, stage.model.layers, balance)
    bridge = stage.model.has_bridge
    run_all = stage.cycle_overhead.get(devices, 0.0)
    forward, backward = pipeline_makespans(cells, mapping, schedule, run_all, link,
                                           slowdown, bridge)
    # the head: sentences split into one shard per device
    shards = [end - start for start, end in shard_bounds(stage.batch.sentences, devices)]
    times = [stage.head_times(s) for s in shards if s > 0]
    head_forward = max(f for f, _ in times)
    head_backward = max(b for _, b in times)
    if schedule == "cycle" and devices > 1:
        # fairseq_hybrid.parallel.head_shards: forward and backward of each shard on its worker,
        # one run_all round trip each
        shared = head_slowdown if head_slowdown is not None else slowdown
        factor = (shared or {}).get(len(times), 1.0)
        head_forward = head_forward * factor + run_all
        head_backward = head_backward * factor + run_all
    head_comm, collectives = 0.0, {"head_broadcast": 0.0, "head_reduction": 0.0}
    if schedule == "dataflow" and devices > 1:
        head_comm = head_slice_seconds(stage, mapping, devices, link)
        collectives = overlapped_collectives(stage, devices, link,
                                             stage.embed_forward + forward, backward)
    # the optimizer step: one thread for CPU devices; on GPUs each device updates its own
    # parameters concurrently (kernels launched asynchronously), so the busiest one counts
    rest = stage.rest if schedule == "cycle" else stage.rest * stage.rest_share(mapping)
    parts = {
        "embeddings_forward": stage.embed_forward,
        "embeddings_backward": stage.embed_backward,
        "pipeline_forward": forward,
        "pipeline_backward": backward,
        "head_forward": head_forward,
        "head_backward": head_backward,
        "head_transfers": head_comm,
        **collectives,
        "rest": rest,
    }
    if schedule == "dataflow" and stage.host is not None:  # GPUs: the one process's pace
        parts["host_wait"] = host_wait(parts, host_phases(stage, devices, chunks))
    parts["total"] = sum(parts.values())
    return parts


def step_shapes(stage: StageTimes) -> StepShapes:
    """The shapes that decide a step's traffic, from what the stage times were taken on."""
    model, batch = stage.model, stage.batch
    query = model.decoder_size
    dropout = model.dropout if model.dropout_out is None else model.dropout_out
    return StepShapes(batch.sentences, batch.source_len, batch.target_len, model.hidden, query,
                      model.embed, stage.head_param_bytes, stage.activation_bytes,
                      combine_dropout=dropout > 0, bridge=model.has_bridge)


def head_slice_seconds(stage: StageTimes, layer_device: Sequence[int], devices: int,
                       link: Link) -> float:
    """The head's copies other than its two collectives — each shard's slices of H and S,
    targets, masks, the loss and its gradient, dH and dS back (``traffic.step_traffic``'s head
    routes less the parameters and their gradients) — one after another."""
    seconds = 0.0
    for (_, destination, phase), nbytes in step_traffic(layer_device, devices, step_shapes(stage)).items():
        if not phase.startswith("head") or phase == "head_params":
            continue
        if phase == "head_backward" and destination == layer_device[-1]:  # the replicas' grads
            nbytes -= stage.head_param_bytes
        if nbytes > 0:
            seconds += link.cost(nbytes)
    return seconds


def collective_seconds(nbytes: float, devices: int, link: Link) -> float:
    """One NCCL broadcast or reduce of ``nbytes`` over ``devices``: pipelined along a
    ring, each link carrying the bytes once, a latency per hop."""
    return link.cost(nbytes, count=devices - 1) if devices > 1 else 0.0


def overlapped_collectives(stage: StageTimes, devices: int, link: Link, forward_hidden_by: float,
                           backward_hidden_by: float) -> Dict[str, float]:
    """The head's two collectives as the engine issues them, on side streams while other
    work runs: the replicas' parameters broadcast while ``forward_hidden_by`` seconds of
    the step's forward run before the head's (which waits for it), their gradients reduced
    while ``backward_hidden_by`` seconds of backward run after the head's (the optimizer
    step waits for it); only what outlasts each adds to the step (the link's contention
    with the pipeline's own copies is not charged)."""
    collective = collective_seconds(stage.head_param_bytes, devices, link)
    return {"head_broadcast": max(0.0, collective - forward_hidden_by),
            "head_reduction": max(0.0, collective - backward_hidden_by)}


def predict_speedups(
    stage: StageTimes, device_counts: Sequence[int], chunk_counts: Sequence[int],
    schedule: str = "cycle", link: Link = Link(),
    slowdown: Optional[Mapping[int, float]] = None,
    head_slowdown: Optional[Mapping[int, float]] = None,
) -> Dict[Tuple[int, int], Dict[str, float]]:
    """speedup(N, K) = step(1 device, K = 1) / step(N, K), with each step's parts."""
    base = predict_step(stage, 1, 1, schedule, link)["total"]
    out = {}
    for n in device_counts:
        for k in chunk_counts:
            parts = predict_step(stage, n, k, schedule, link, slowdown=slowdown,
                                 head_slowdown=head_slowdown)
            out[(n, k)] = {**parts, "speedup": base / parts["total"]}
    return out
