"""The simulator of the wavefront the code issues, from each cell's seconds: the pipeline's
forward or backward makespan over a layer -> device map, under the schedule the devices
run. The chunk chooser (``chunk_choice``) compares candidate chunk counts with it; the
planning models (``planning/step_time.py``, ``planned.py``) build whole steps on it.

- ``cycle`` (what ``parallel/pipeline.py``/``worker.py`` do on CPU devices): every clock
  cycle is a *barrier* (``run_all`` waits for all of the cycle's tasks); a device's cells in
  one cycle run one after another on its single worker. Backward: with N > 1 the same
  barrier per cycle in reverse clock order (``backward_cells``); with N = 1 one autograd
  thread runs all of it serially.
- ``dataflow`` (what the same code does on GPUs): the host's per-cycle barrier only waits for
  kernel *launches*, so each device runs its cells in issue order, a cell starting when its
  inputs (plus a transfer over the ``Link``, if they come from another device) are ready
  (``parallel.schedule.dependencies``); backward likewise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..parallel.schedule import Key, clock_cycles, dependencies

@dataclass
class CellTimes:
    """One chunk count K: per cell forward/backward seconds and the bytes of each cell's
    output (what layer l+1 reads) and of one layer's (h, c) state."""
    chunks: int
    source_chunks: int
    target_chunks: int
    layers: int
    forward: Dict[Key, float]
    backward: Dict[Key, float]
    output_bytes: Dict[Key, int]
    state_bytes: int


@dataclass(frozen=True)
class Link:
    """A device-to-device transfer: ``latency_s + bytes / bandwidth`` (bandwidth 0 = free,
    as for CPU devices sharing memory)."""
    bandwidth_bytes_per_s: float = 0.0
    latency_s: float = 0.0

    def cost(self, nbytes: float, count: int = 1) -> float:
        if self.bandwidth_bytes_per_s <= 0:
            return 0.0
        return count * self.latency_s + nbytes / self.bandwidth_bytes_per_s


SCHEDULES = ("cycle", "dataflow")  # CPU devices: a barrier per clock cycle; GPUs: dataflow


def cell_transfer_seconds(
    key: Key, direction: str, layer_device: Sequence[int], output_bytes: Mapping[Key, int],
    state_bytes: int, link: Link,
) -> float:
    """Transfer time the cell's own task spends moving its inputs to its device: the
    output of layer l-1 (forward) or the gradient of its output from layer l+1 (backward);
    and, for decoder chunk 0 on a device other than 0, the (h, c) round trip through the
    master device that ``WavefrontPipeline.forward_cells`` makes for the bridge (and its backward)."""
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
        return cell_transfer_seconds(key, direction, layer_device, output_bytes, state_bytes, link)

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
                for dep, _ in dependencies(key, source_chunks, direction, layers, target_chunks):
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
