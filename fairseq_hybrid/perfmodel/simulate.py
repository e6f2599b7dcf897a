"""The simulator of the schedule the code issues, from one device's stage times: forward
cells in ``clock_cycles`` order over the layer -> device map of ``placement.build_plan``,
under two schedules (``cycle``: a barrier per clock cycle, CPU devices;
``dataflow``: GPUs, each device running its cells in issue order as their inputs arrive),
and the step and speedup predictions built on it.

- ``cycle`` (what ``parallel/pipeline.py``/``worker.py`` do on CPU devices): every clock
  cycle is a *barrier* (``run_all`` waits for all of the cycle's tasks); a device's cells in
  one cycle run one after another on its single worker. Backward: with N > 1 the same
  barrier per cycle in reverse clock order (``backward_cells``); with N = 1 one autograd
  thread runs all of it serially. The head's shards run forward and backward on the
  workers in parallel (``parallel/head_shards.py``).
- ``dataflow`` (what the same code does on GPUs): the host's per-cycle barrier only waits for
  kernel *launches*, so execution is *dataflow*: each device runs its cells in issue order,
  a cell starting when its inputs (plus a transfer, if they come from another device) are
  ready; backward likewise, and the head's shards run forward and backward in parallel.
  Between them, the head's traffic as the code moves it (``traffic.today``'s routes: each
  shard's slices of H and S from the top layers' device and dH, dS back, one copy after
  another: ``head_slice_seconds``); the replicas' parameters in one broadcast and their
  gradients in one reduction, NCCL collectives along a ring issued on the collective
  worker's side streams (``parallel/collective_worker.py``), each charged only for what
  outlasts the work it overlaps: the broadcast the embeddings' and the pipeline's forward,
  the reduction the pipeline's backward (``overlapped_collectives``).
  The optimizer step ("rest") scales with the largest share of the parameters on one device
  (the embeddings on device 0, the master head with the top layers). Where the stage
  times carry the host's issue times (a GPU profile's), the step is paced by the one
  Python process that issues every device's work (``host_bound``: the part "host_wait").

    step(N, K) = embeddings fwd+bwd + pipeline fwd + head phase + pipeline bwd + rest
                 (+ host_wait on GPUs)
    speedup(N, K) = step(1, 1) / step(N, K)
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..parallel.pipeline import Key, ScheduleCell, clock_cycles, input_cell, state_cell
from ..parallel.placement import shard_bounds
from .host_bound import host_phases, host_wait
from .sizes import Link, layer_map
from .stage_times import CellTimes, StageTimes
from .traffic import StepShapes, today

SCHEDULES = ("cycle", "dataflow")  # CPU devices: a barrier per clock cycle; GPUs: dataflow


def _dependencies(
    key: Key, source_chunks: int, direction: str, layers: int, target_chunks: int,
) -> List[Tuple[Key, str]]:
    """The cells whose results ``key`` needs: (cell, kind) with kind "output" (crosses from
    layer l-1 forward / l+1 backward) or "state" (same layer). The pipeline's own rule
    (``input_cell``, ``state_cell``); backward inverts it."""
    def needs(cell: ScheduleCell) -> List[Tuple[Optional[Key], str]]:
        return [(input_cell(cell), "output"), (state_cell(cell, source_chunks), "state")]

    if direction == "forward":
        return [(dep, kind) for dep, kind in needs(ScheduleCell(*key)) if dep is not None]
    return [
        (other.key, kind)
        for cycle in clock_cycles(source_chunks, target_chunks, layers) for other in cycle
        for dep, kind in needs(other) if dep == key
    ]


def _cell_transfer(
    key: Key, direction: str, layer_device: Sequence[int], output_bytes: Mapping[Key, int],
    state_bytes: int, link: Link,
) -> float:
    """Transfer time the cell's own task spends moving its inputs to its device: the
    output of layer l-1 (forward) or the gradient of its output from layer l+1 (backward);
    and, for decoder chunk 0 on a device other than 0, the (h, c) round trip through the
    master device that ``_initial_state`` makes for the bridge (and its backward)."""
    side, layer, chunk = key
    cost = 0.0
    if link.bandwidth_bytes_per_s <= 0:
        return cost
    if direction == "forward":
        if layer > 0 and layer_device[layer] != layer_device[layer - 1]:
            cost += link.cost(output_bytes.get((side, layer - 1, chunk), 0))
    else:
        if layer < len(layer_device) - 1 and layer_device[layer] != layer_device[layer + 1]:
            cost += link.cost(output_bytes.get(key, 0))
    if side == "decoder" and chunk == 0 and layer_device[layer] != 0:
        cost += 2 * link.cost(state_bytes, count=2)  # h, c to master and back
    return cost


def simulate_pipeline(
    times: Mapping[Key, float],
    layer_device: Sequence[int],
    source_chunks: int,
    target_chunks: int,
    direction: str = "forward",
    sync: str = "cycle",
    output_bytes: Optional[Mapping[Key, int]] = None,
    state_bytes: int = 0,
    link: Link = Link(),
    cycle_overhead: float = 0.0,
    slowdown: Optional[Mapping[int, float]] = None,
) -> float:
    """Makespan (seconds) of the forward or backward of the wavefront.

    ``times``: seconds of each (side, layer, chunk) cell in this direction;
    ``layer_device``: device index of each layer (encoder and decoder layer l alike).
    ``sync``:
      - "cycle": barrier per clock cycle (``WavefrontPipeline.forward_cells`` /
        ``backward_cells`` with ``DeviceWorkers.run_all``): a cycle lasts as long as its
        busiest device, whose cells (and their input transfers) run one after another;
        plus ``cycle_overhead`` per cycle. Backward: the cycles in reverse order.
      - "dataflow": each device runs its cells in issue order, each starting when its
        inputs are ready (CUDA streams: the workers only queue kernels, forward and backward).
      - "serial": one thread runs every cell (one CPU autograd ``.backward()``).
    ``slowdown`` (cycle mode): devices that share hardware (CPU "devices" on one box's
    cores and memory) run slower together: with m devices busy in a cycle, each cell takes
    ``slowdown[m]`` times its one-device time (missing: 1, independent devices).
    """
    layers = len(layer_device)
    output_bytes = output_bytes or {}
    cycles = [[(c.side, c.layer, c.chunk) for c in cycle]
              for cycle in clock_cycles(source_chunks, target_chunks, layers)]
    if direction == "backward":
        cycles = list(reversed(cycles))
    elif direction != "forward":
        raise ValueError(f"direction {direction!r}: forward or backward")

    def transfer(key: Key) -> float:
        return _cell_transfer(key, direction, layer_device, output_bytes, state_bytes, link)

    if sync == "serial":
        return sum(times[key] + transfer(key) for cycle in cycles for key in cycle)
    if sync == "cycle":
        total = 0.0
        for cycle in cycles:
            busy: Dict[int, float] = {}
            for key in cycle:
                device = layer_device[key[1]]
                busy[device] = busy.get(device, 0.0) + times[key] + transfer(key)
            factor = (slowdown or {}).get(len(busy), 1.0)
            total += max(busy.values()) * factor + cycle_overhead
        return total
    if sync == "dataflow":
        free: Dict[int, float] = {}
        finish: Dict[Key, float] = {}
        for cycle in cycles:
            for key in cycle:
                device = layer_device[key[1]]
                ready = 0.0
                for dep, _ in _dependencies(key, source_chunks, direction, layers, target_chunks):
                    ready = max(ready, finish[dep])
                start = max(free.get(device, 0.0), ready)
                finish[key] = start + transfer(key) + times[key]
                free[device] = finish[key]
        return max(finish.values()) if finish else 0.0
    raise ValueError(f"sync {sync!r}: cycle, dataflow or serial")


def pipeline_makespans(
    cells: CellTimes, layer_device: Sequence[int], schedule: str = "cycle",
    cycle_overhead: float = 0.0, link: Link = Link(),
    slowdown: Optional[Mapping[int, float]] = None, bridge: bool = True,
) -> Tuple[float, float]:
    """Forward and backward seconds of the pipeline as the code runs it: on GPUs dataflow;
    on CPU devices a barrier per clock cycle, except that one device with K = 1 is the plain
    model and one device's backward is one autograd thread (serial). ``bridge``: whether
    decoder chunk 0 moves the encoder's state through device 0."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: one of {SCHEDULES}")
    devices = len(set(layer_device))
    common = dict(output_bytes=cells.output_bytes, state_bytes=cells.state_bytes if bridge else 0,
                  link=link)
    makespans = []
    for table, direction in ((cells.forward, "forward"), (cells.backward, "backward")):
        sync, overhead = schedule, cycle_overhead
        one_thread = devices == 1 and (cells.chunks == 1 or direction == "backward")
        if schedule == "cycle" and one_thread:
            sync, overhead = "serial", 0.0
        makespans.append(simulate_pipeline(
            table, layer_device, cells.source_chunks, cells.target_chunks, direction, sync,
            cycle_overhead=overhead if sync == "cycle" else 0.0,
            slowdown=slowdown if sync == "cycle" else None, **common))
    return makespans[0], makespans[1]


def predict_step(
    stage: StageTimes, devices: int, chunks: int, schedule: str = "cycle",
    link: Link = Link(), balance: Optional[str] = None,
    slowdown: Optional[Mapping[int, float]] = None,
    head_slowdown: Optional[Mapping[int, float]] = None,
) -> Dict[str, float]:
    """Predicted seconds of one training step on ``devices`` devices with ``chunks`` time
    chunks, by part (``total`` is their sum). ``slowdown``: see ``simulate_pipeline``;
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
    targets, masks, the loss and its gradient, dH and dS back (``traffic.today``'s head
    routes less the parameters and their gradients) — one after another."""
    seconds = 0.0
    for (_, destination, phase), nbytes in today(layer_device, devices, step_shapes(stage)).items():
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
