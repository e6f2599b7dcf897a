"""The planned schedule, one step at a time, from the same stage times, link and
simulator as today's (``step_time.predict_step``, GPUs: dataflow) — so each step's modelled
gain is known before it is built, and nothing is credited that the step does not remove.

Steps (each on top of today's schedule; any subset):

- ``replicas``: each device keeps its head replica (and its optimizer state) for the whole
  run. No broadcast of the head's parameters at each step and no reduction of their
  gradients onto the master head (today's two collectives, overlapped with the pipeline:
  ``simulate.overlapped_collectives``): the head's gradients are all-reduced instead
  (bucketed ring), overlapped with the pipeline's backward — only what outlasts it, and at
  least the last bucket, adds to the step. Every device then applies the head's optimizer
  step.
- ``balanced_optimizer``: the optimizer step of the parameters every plan keeps on device 0
  (embeddings, bridges, head) is split evenly over the devices (its gradients scattered
  from where they were summed — with ``replicas`` the head's are already on every device
  and only the rest is scattered — and the updated values gathered back, both charged,
  after backward); each device steps its own layers too, so the busiest device's share
  sets the time.
- ``head_in_wavefront``: the head runs per target time chunk, split by sentences over the
  devices, issued as soon as the top decoder layer has produced the chunk (forward), and
  its backward per chunk from the last one, each chunk's head backward releasing that
  chunk's top decoder cell (backward): one dataflow simulation of cells and head tasks per
  direction. Each extra head call pays the head's fixed per-call cost again (estimated
  from the stage times at two shard sizes). Without ``replicas`` today's collectives
  stay, the broadcast charged whole (the first head call comes early in the forward), the
  reduction hidden by the backward left once the head's last gradient is ready.

Everything else — the wavefront's own traffic, H and S slices straight from the top
layers' device, targets and masks from device 0 — is charged as today, and so is the
host's pace (``host_bound``) for the tasks each step issues: the collectives it keeps,
adds or drops, and with the head inside the wavefront a head task per target chunk and
shard.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Sequence, Tuple

from ..parallel.schedule import DECODER, ENCODER, Key, chunk_bounds, clock_cycles, dependencies
from ..parallel.placement import shard_bounds
from .compare import BUCKET_BYTES, allreduce_seconds
from .host_bound import host_phases, host_wait
from ..chunking.wavefront import Link, cell_transfer_seconds
from .sizes import layer_map
from .step_time import overlapped_collectives, predict_step
from .stage_times import StageTimes

STEPS = ("replicas", "balanced_optimizer", "head_in_wavefront")  # the plan, in full
KNOWN_STEPS = STEPS
# today, then the steps added one at a time in the order they are planned to be built
PLANNED_LADDER = ((), ("replicas",), ("replicas", "balanced_optimizer"), STEPS)
Task = Tuple[str, int, float, Tuple[str, ...]]  # (name, device, seconds, names it waits for)


def finish_times(tasks: Sequence[Task], low_priority: str = "") -> Dict[str, float]:
    """When each task finishes. Each device runs one task at a time from two queues in
    issue order — its cells, and the tasks whose names start with ``low_priority`` (the
    head: a second, low-priority stream) — each task starting when the device is free and
    every task it waits for has finished; when both queues' next tasks are ready, the
    cell goes first. Without ``low_priority``: one queue, the GPU's stream order."""
    queues: Dict[Tuple[int, bool], List[Task]] = {}
    for task in tasks:
        low = bool(low_priority) and task[0].startswith(low_priority)
        queues.setdefault((task[1], low), []).append(task)
    finish: Dict[str, float] = {}
    free: Dict[int, float] = {}
    while any(queues.values()):
        best = None  # (start, low, device)
        for (device, low), queue in queues.items():
            if not queue or any(w not in finish for w in queue[0][3]):
                continue
            start = max([free.get(device, 0.0), *(finish[w] for w in queue[0][3])])
            if best is None or (start, low) < best[:2]:
                best = (start, low, device)
        if best is None:
            raise ValueError("tasks wait for a task that is not issued before them")
        start, low, device = best
        name, _, seconds, _ = queues[(device, low)].pop(0)
        finish[name] = free[device] = start + seconds
    return finish


def _cell(key: Key) -> str:
    return "cell %s %d %d" % key


def _head_call_overhead(stage: StageTimes, sentences: int) -> Tuple[float, float]:
    """The fixed part of one head call (forward, backward): t(s) = a + b s from two sizes."""
    whole, half = stage.head_times(sentences), stage.head_times(max(1, sentences // 2))
    return max(0.0, 2 * half[0] - whole[0]), max(0.0, 2 * half[1] - whole[1])


def wavefront_with_head(stage: StageTimes, devices: int, chunks: int,
                        link: Link) -> Tuple[float, float, float]:
    """Forward and backward makespans of the pipeline with the head inside it, and when
    in the backward the head's last gradient is ready."""
    cells = stage.cells[chunks]
    mapping = layer_map(devices, stage.model.layers)
    layers, top = len(mapping), len(mapping) - 1
    state_bytes = cells.state_bytes if stage.model.has_bridge else 0
    source_chunks, target_chunks = cells.source_chunks, cells.target_chunks
    spans = chunk_bounds(stage.batch.target_len, chunks)
    shards = [(i, end - start) for i, (start, end)
              in enumerate(shard_bounds(stage.batch.sentences, devices)) if end > start]
    cycles = clock_cycles(source_chunks, target_chunks, layers)

    def head_task_seconds(direction: int, shard_sentences: int, chunk: int) -> float:
        whole = stage.head_times(shard_sentences)[direction]
        fixed = _head_call_overhead(stage, shard_sentences)[direction]
        share = (spans[chunk][1] - spans[chunk][0]) / stage.batch.target_len
        return fixed + (whole - fixed) * share

    encoder_tops = tuple(_cell((ENCODER, top, k)) for k in range(source_chunks))
    forward: List[Task] = []
    for cycle in cycles:
        for c in cycle:
            key = c.key
            waits = tuple(_cell(d) for d, _ in
                          dependencies(key, source_chunks, "forward", layers, target_chunks))
            seconds = cells.forward[key] + cell_transfer_seconds(
                key, "forward", mapping, cells.output_bytes, state_bytes, link)
            forward.append((_cell(key), mapping[key[1]], seconds, waits))
            if key[0] == DECODER and key[1] == top:
                for device, rows in shards:
                    forward.append((f"head {key[2]} {device}", device,
                                    head_task_seconds(0, rows, key[2]),
                                    (_cell(key), *encoder_tops)))
    backward: List[Task] = []

    def head_backward(chunk: int) -> None:
        for device, rows in shards:
            backward.append((f"head {chunk} {device}", device, head_task_seconds(1, rows, chunk), ()))

    head_backward(target_chunks - 1)
    all_heads = tuple(f"head {k} {d}" for k in range(target_chunks) for d, _ in shards)
    for cycle in reversed(cycles):
        for c in cycle:
            key = c.key
            waits = [_cell(d) for d, _ in
                     dependencies(key, source_chunks, "backward", layers, target_chunks)]
            if key[1] == top:
                waits += ([f"head {key[2]} {d}" for d, _ in shards] if key[0] == DECODER
                          else list(all_heads))
            seconds = cells.backward[key] + cell_transfer_seconds(
                key, "backward", mapping, cells.output_bytes, state_bytes, link)
            backward.append((_cell(key), mapping[key[1]], seconds, tuple(waits)))
            if key[0] == DECODER and key[1] == top and key[2] > 0:
                head_backward(key[2] - 1)
    forward_done = finish_times(forward, "head")
    backward_done = finish_times(backward, "head")
    return (max(forward_done.values()), max(backward_done.values()),
            max(backward_done[name] for name in all_heads))


def _shares(stage: StageTimes, mapping: Sequence[int], devices: int,
            steps: Sequence[str]) -> float:
    """The busiest device's fraction of the one-device optimizer step."""
    total = stage.param_bytes_master + sum(stage.param_bytes_layer)
    if not stage.param_bytes_layer or total == 0:
        return 1.0
    per_device = stage.layer_bytes_per_device(mapping)
    if "balanced_optimizer" in steps:
        for device in per_device:
            per_device[device] += stage.param_bytes_master / devices
    elif "replicas" in steps:  # every replica steps the whole head
        per_device[0] += stage.param_bytes_master
        for device in range(1, devices):
            per_device[device] += stage.head_param_bytes
    else:  # today: the master head with the top layers, the rest on device 0
        return stage.rest_share(mapping)
    return max(per_device.values()) / total


def predict_planned_step(stage: StageTimes, devices: int, chunks: int, link: Link,
                         steps: Sequence[str]) -> Dict[str, float]:
    """One step's predicted seconds by part with ``steps`` of the plan applied (an empty
    ``steps``: today's ``predict_step`` on GPUs, part for part)."""
    unknown = sorted(set(steps) - set(KNOWN_STEPS))
    if unknown:
        raise ValueError(f"steps {unknown}: each one of {KNOWN_STEPS}")
    parts = dict(predict_step(stage, devices, chunks, "dataflow", link))
    parts.pop("total")
    if devices == 1:
        return {**parts, "total": sum(parts.values())}
    parts.pop("host_wait", None)  # charged again below, for the tasks these steps issue
    mapping = layer_map(devices, stage.model.layers)
    behind = parts["pipeline_backward"]  # backward left once the head's gradients are ready
    if "head_in_wavefront" in steps:
        forward, backward, heads_done = wavefront_with_head(stage, devices, chunks, link)
        parts.update(pipeline_forward=forward, pipeline_backward=backward,
                     head_forward=0.0, head_backward=0.0)
        behind = backward - heads_done
    if "replicas" in steps:  # no collectives: the all-reduce instead
        parts.update(head_broadcast=0.0, head_reduction=0.0)
        ring = allreduce_seconds(stage.head_param_bytes, devices, link)
        buckets = max(1, math.ceil(stage.head_param_bytes / BUCKET_BYTES))
        parts["head_allreduce"] = max(ring - behind, ring / buckets)
    elif "head_in_wavefront" in steps:  # today's collectives, the broadcast no longer hidden
        parts.update(overlapped_collectives(stage, devices, link, 0.0, behind))
    if "balanced_optimizer" in steps:
        share = (devices - 1) / devices
        # the gradients scattered from where they were summed: with the replicas the
        # head's are already on every device (all-reduced), only the rest is scattered
        scattered = stage.param_bytes_master - (stage.head_param_bytes if "replicas" in steps else 0)
        # the updated values gathered back: to device 0 (and with the replicas the head's
        # shards to every replica, an all-gather: the same bytes on each link)
        parts["optimizer_transfers"] = (link.cost(scattered * share)
                                        + link.cost(stage.param_bytes_master * share))
    parts["rest"] = stage.rest * _shares(stage, mapping, devices, steps)
    if stage.host is not None:
        parts["host_wait"] = host_wait(parts, host_phases(stage, devices, chunks, steps))
    return {**parts, "total": sum(parts.values())}


def planned_speedups(stage: StageTimes, devices: int, chunk_counts: Sequence[int], link: Link,
                     ladder: Sequence[Sequence[str]]) -> Mapping[Tuple[str, ...], Tuple[int, float]]:
    """For each set of steps in ``ladder``: the fastest K and its speedup over one device."""
    base = predict_step(stage, 1, 1, "dataflow", link)["total"]
    out = {}
    for steps in ladder:
        totals = {k: predict_planned_step(stage, devices, k, link, steps)["total"]
                  for k in chunk_counts}
        k = min(totals, key=totals.get)
        out[tuple(steps)] = (k, base / totals[k])
    return out
