"""The host bound of a GPU step: one Python process issues every device's work (a worker
thread per device, ``parallel/worker.py``), and the interpreter lock lets one thread run
Python at a time, so the host's time to issue the step's tasks — every pipeline cell
forward and backward, every head shard, every worker round trip (a clock cycle's barrier)
and every collective — adds up across the devices however many there are. A GPU cannot
run work before it is issued, so:

    step >= the sum of the host's time for every task it issues.

Finer than that one sum, the step runs in five phases in order (embeddings forward, the
pipeline's forward, the head, the pipeline's backward, the update). The host may run
ahead of the devices within a step (kernels are queued; nothing waits for a device before
the gradient norm's check at the update), never behind: each phase's device work ends no
earlier than the host has issued it. With ``d_i`` the devices' seconds of phase i (the
simulator's parts) and ``h_i`` the host's:

    H_i = H_(i-1) + h_i;  D_i = max(D_(i-1) + d_i, H_i);  step = D_5

a lower bound (the phase's last task still runs after it is issued). ``host_wait`` is what
it adds to the devices' own step. What is not charged: fairseq's own per-step Python (the
same for every scheme), and work that runs outside the lock (ATen's dispatch, the kernel
launches a device's autograd thread makes), which runs per device, in parallel.

The one-device step of one chunk is the plain model: one call per layer on the calling
thread and one ``.backward()`` (the autograd engine's C++ thread issues the backward, no
Python per cell); that is also every DDP process's step (a process of its own, its own
interpreter lock).
"""
from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

from ..parallel.schedule import clock_cycles
from ..chunking.wavefront import CellTimes
from .stage_times import HostTimes, StageTimes

PHASES = ("embeddings_forward", "pipeline_forward", "head", "pipeline_backward", "update")
PHASE_OF_PART: Dict[str, int] = {
    "embeddings_forward": 0, "pipeline_forward": 1,
    "head_forward": 2, "head_transfers": 2, "head_backward": 2, "head_broadcast": 2,
    "pipeline_backward": 3,
    "head_reduction": 4, "head_allreduce": 4, "optimizer_transfers": 4,
    "embeddings_backward": 4, "rest": 4,
}


def pipeline_host_seconds(host: HostTimes, cells: CellTimes, devices: int) -> Tuple[float, float]:
    """The host's seconds for the pipeline's forward and backward: a round trip per clock
    cycle and a task per cell (the plain model: a call per layer, backward in C++)."""
    count = len(cells.forward)
    if devices == 1 and cells.chunks == 1:
        return count * host.cell_forward, 0.0
    cycles = len(clock_cycles(cells.source_chunks, cells.target_chunks, cells.layers))
    return (cycles * host.round_trip + count * host.cell_forward,
            cycles * host.round_trip + count * host.cell_backward)


def head_host_seconds(host: HostTimes, shards: int, calls: int = 1) -> Tuple[float, float]:
    """The host's seconds for the head's forward and backward: one shard (the head on the
    calling thread, its backward inside autograd) or one round trip and a task per shard;
    ``calls``: head calls per shard (the planned head inside the wavefront: one per target
    chunk, issued within the pipeline's cycles)."""
    if shards <= 1:
        return host.shard_forward, 0.0
    trips = host.round_trip if calls == 1 else 0.0
    return (trips + calls * shards * host.shard_forward,
            trips + calls * shards * host.shard_backward)


def host_phases(stage: StageTimes, devices: int, chunks: int,
                steps: Sequence[str] = ()) -> Tuple[float, ...]:
    """The host's seconds in each of ``PHASES`` for one step on ``devices`` devices with
    ``chunks`` chunks, today's schedule or with the planned ``steps`` (``planned.py``):
    the head's two collectives (today, and overlapped on a side worker), the replicas'
    one all-reduce instead, the balanced optimizer's scatter and gather, the head per
    target chunk inside the wavefront."""
    host = stage.host
    if host is None:
        return (0.0,) * len(PHASES)
    cells = stage.cells[chunks]
    pipeline_forward, pipeline_backward = pipeline_host_seconds(host, cells, devices)
    shards = min(devices, stage.batch.sentences)
    phases = [0.0, pipeline_forward, 0.0, pipeline_backward, 0.0]
    if "head_in_wavefront" in steps and devices > 1:
        forward, backward = head_host_seconds(host, shards, cells.target_chunks)
        phases[1] += forward
        phases[3] += backward
    else:
        forward, backward = head_host_seconds(host, shards)
        phases[2] += forward + backward
    if devices > 1:
        if "replicas" in steps:
            phases[3] += host.collective  # the head's all-reduce
        else:
            phases[0] += host.collective  # the replicas' broadcast at the step's start
            phases[2] += host.collective  # their gradients reduced onto the master head
        if "balanced_optimizer" in steps:
            phases[4] += 2 * host.collective  # the scatter and the gather
    return tuple(phases)


def paced_step(device_phases: Sequence[float], host: Sequence[float]) -> float:
    """The step when the devices' phases cannot end before the host has issued them."""
    device_end = host_end = 0.0
    for device_seconds, host_seconds in zip(device_phases, host):
        host_end += host_seconds
        device_end = max(device_end + device_seconds, host_end)
    return device_end


def host_wait(parts: Mapping[str, float], host: Sequence[float]) -> float:
    """What the host's pace adds to the devices' step made of ``parts`` (seconds by part,
    no total): ``paced_step`` less their sum."""
    unknown = sorted(set(parts) - set(PHASE_OF_PART))
    if unknown:
        raise ValueError(f"parts {unknown}: each one of {sorted(PHASE_OF_PART)}")
    device_phases = [0.0] * len(PHASES)
    for name, seconds in parts.items():
        device_phases[PHASE_OF_PART[name]] += seconds
    return max(0.0, paced_step(device_phases, host) - sum(device_phases))
