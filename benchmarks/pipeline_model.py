"""A performance model of the hybrid training step: measure one device, simulate N.

This module owns three things:

1. **Measurement on one device** (``measure_stage_times``): the forward and backward time of
   every (side, layer, chunk) cell of the time-chunked wavefront for each chunk count K,
   obtained by running fairseq_hybrid's own ``WavefrontPipeline.forward_cells`` /
   ``backward_cells`` (hence ``lstm_stack.run_layer``, ``pipeline.chunk_bounds``,
   ``pipeline.clock_cycles``) with a worker stand-in that runs each cell's task inline and
   times it; the bytes of each cell's output and state (what crosses devices); the
   embeddings (forward/backward); the head + loss per shard size (forward and backward
   apart); the rest of the update (gradient clipping + Adam step); and the cost of one
   ``DeviceWorkers.run_all`` round trip (the per-clock-cycle barrier).
2. **A simulator** (``simulate_pipeline``, ``predict_step``) of the schedule the code
   issues: the layer -> device map comes from ``placement.build_plan``; forward cells run in
   ``clock_cycles`` order. Two synchronisation semantics:

   - ``cpu-workers`` (what ``pipeline.py``/``worker.py`` do on CPU devices): every clock
     cycle is a *barrier* (``run_all`` waits for all of the cycle's tasks); a device's cells
     in one cycle run one after another on its single worker. Backward: with N > 1 the same
     barrier per cycle in reverse clock order (``backward_cells``); with N = 1 one autograd
     thread runs all of it serially. The head's shards run forward and backward on the
     workers in parallel (``fairseq_hybrid.head_shards``).
   - ``cuda`` (what the same code does on GPUs): the host's per-cycle barrier only waits
     for kernel *launches*, so execution is *dataflow*: each device runs its cells in issue
     order, a cell starting when its inputs (plus a transfer, if they come from another
     device) are ready; backward likewise (each worker's per-cell ``backward`` call only
     queues its kernels), and the head's shards run forward and backward in parallel,
     plus the copy of the head's parameters to each replica and the reduction of their
     gradients. The optimizer step
     ("rest") scales with the largest share of the parameters on one device (embeddings
     and head stay on device 0).

   step(N, K) = embeddings fwd+bwd + pipeline fwd + head phase + pipeline bwd + rest, and
   speedup(N, K) = step(1, 1) / step(N, K).
3. **Validation and prediction** (``run`` / the CLI): the real training step of
   ``HybridLSTMModel`` with ``hybrid_cross_entropy`` measured on ``cpu`` and ``cpu,cpu``
   (one torch thread per device) against the model's prediction; and predictions for more
   devices (e.g. the WMT preset on 4) from one device's stage times.

    python -m benchmarks.pipeline_model --preset small --devices 2 --chunks 1,2,4 \
        --validate --quick --json results/bench/pipeline_model.json
    python -m benchmarks.pipeline_model --preset wmt --devices 4 --chunks 1,2,4,8,16

Per-device times are *this machine's* (on a CPU box: one CPU core per device); the same
command on a GPU box measures GPU stage times. Transfers use ``--bandwidth-gbs`` and
``--latency-us`` for the ``cuda`` semantics; CPU devices share memory (no transfer cost).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from .jsonio import write_json_atomic

Key = Tuple[str, int, int]  # (side, layer, chunk), as pipeline.py keys its cells
SEMANTICS = ("cpu-workers", "cuda")


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    embed: int
    vocab: int
    dropout: float = 0.1  # --dropout (embeddings in; between layers and H_c unless overridden)
    dropout_out: Optional[float] = None  # between layers and on H_c (None: --dropout)
    decoder_hidden: Optional[int] = None  # None: ``hidden`` (another size adds the bridge)


@dataclass(frozen=True)
class BatchSize:
    sentences: int
    source_len: int
    target_len: int

    @property
    def target_tokens(self) -> int:
        return self.sentences * self.target_len

    @property
    def source_tokens(self) -> int:
        return self.sentences * self.source_len


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


@dataclass(frozen=True)
class Preset:
    model: ModelSize
    batch: BatchSize
    quick_batch: BatchSize
    note: str = ""


PRESETS: Dict[str, Preset] = {
    # hybrid_lstm defaults: 2+2 layers x 256, vocab 8K; 160 x 25 = 4000 target tokens
    "small": Preset(ModelSize(2, 256, 256, 8000), BatchSize(160, 25, 25), BatchSize(160, 25, 25)),
    # hybrid_lstm_wmt_en_de: 4+4 x 1000, dropout between layers / on H_c 0, vocab 32K.
    # A realistic GPU batch is 64-128 x ~25-30; on this CPU that is too slow to measure
    # per chunk count, so the batch is scaled down (stated in the report).
    "wmt": Preset(
        ModelSize(4, 1000, 1000, 32000, dropout=0.1, dropout_out=0.0),
        BatchSize(32, 27, 27), BatchSize(16, 25, 25),
        note="batch scaled down from 64-128 sentences for CPU measurement",
    ),
}


# ------------------------------------------------------------------ model and batch
def build_model(size: ModelSize, seed: int = 0) -> Tuple[Any, Any]:
    """A ``HybridLSTMModel`` (float32, train mode) and its fairseq-like task."""
    from fairseq.data import Dictionary

    import fairseq_hybrid  # noqa: F401  (registers model and criterion)
    from fairseq_hybrid.config import HybridLSTMConfig
    from fairseq_hybrid.model import HybridLSTMModel

    dictionary = Dictionary()
    for index in range(size.vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{index}")
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    options = dict(
        encoder_embed_dim=size.embed, encoder_hidden_size=size.hidden,
        encoder_layers=size.layers, decoder_embed_dim=size.embed,
        decoder_hidden_size=size.decoder_hidden or size.hidden, decoder_layers=size.layers,
        decoder_out_embed_dim=size.embed, dropout=size.dropout,
        max_source_positions=1024, max_target_positions=1024,
    )
    if size.dropout_out is not None:
        options.update(encoder_dropout_out=size.dropout_out, decoder_dropout_out=size.dropout_out)
    torch.manual_seed(seed)
    model = HybridLSTMModel.build_model(HybridLSTMConfig(**options), task)
    return model.float().train(), task


def synthetic_sample(dictionary: Any, batch: BatchSize, seed: int = 1) -> dict:
    """A collated batch of random tokens, every sentence of the same lengths (no padding)."""
    generator = torch.Generator().manual_seed(seed)
    low, high, eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def tokens(length: int) -> torch.Tensor:
        body = torch.randint(low, high, (batch.sentences, length), generator=generator)
        body[:, -1] = eos
        return body

    source, target = tokens(batch.source_len), tokens(batch.target_len)
    prev = torch.cat([torch.full((batch.sentences, 1), eos), target[:, :-1]], dim=1)
    return {
        "id": torch.arange(batch.sentences),
        "nsentences": batch.sentences,
        "ntokens": batch.target_tokens,
        "net_input": {
            "src_tokens": source,
            "src_lengths": torch.full((batch.sentences,), batch.source_len),
            "prev_output_tokens": prev,
        },
        "target": target,
    }


def layer_map(devices: int, layers: int, balance: Optional[str] = None) -> Tuple[int, ...]:
    """Layer -> device index, as fairseq_hybrid.placement plans it."""
    from fairseq_hybrid.placement import build_plan

    return build_plan(",".join(["cpu"] * devices), balance, 1, layers, layers).layer_device


# ------------------------------------------------------------------ measurement
def device_clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` after the device has finished its queued work (CUDA kernels
    run asynchronously; CPU work is done when the call returns)."""
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


class TimingWorkers:
    """Stands in for ``worker.DeviceWorkers``: runs each task inline on the calling thread
    (one device) and records its wall time, in issue order."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.records: List[Tuple[str, float]] = []
        self.clock = clock

    def run_all(self, tasks: Sequence[Tuple[int, str, Callable[[], Any]]],
                inline_device: Optional[torch.device] = None) -> List[Any]:
        results = []
        for _, description, fn in tasks:
            start = self.clock()
            results.append(fn())
            self.records.append((description, self.clock() - start))
        return results


@dataclass
class CellTimes:
    """One chunk count K on one device: per cell forward/backward seconds (median of the
    repeats) and the bytes of each cell's output (what layer l+1 reads) and of one
    layer's (h, c) state."""
    chunks: int
    source_chunks: int
    target_chunks: int
    layers: int
    forward: Dict[Key, float]
    backward: Dict[Key, float]
    output_bytes: Dict[Key, int]
    state_bytes: int

    def cycles(self) -> List[List[Key]]:
        from fairseq_hybrid.pipeline import clock_cycles

        return [[(c.side, c.layer, c.chunk) for c in cycle]
                for cycle in clock_cycles(self.source_chunks, self.target_chunks, self.layers)]


@dataclass
class StageTimes:
    """Everything the simulator needs, measured on one device."""
    model: ModelSize
    batch: BatchSize
    threads: int
    repeats: int
    cells: Dict[int, CellTimes]  # K -> cell times
    embed_forward: float
    embed_backward: float
    head_forward: Dict[int, float]  # shard sentences -> seconds
    head_backward: Dict[int, float]
    head_param_bytes: int
    head_input_bytes_per_sentence: int  # H and S rows one shard receives (and returns grads of)
    rest: float  # gradient clipping + optimizer step
    cycle_overhead: Dict[int, float]  # workers -> seconds per run_all round trip
    device: str = "cpu"
    # parameter bytes on the master device whatever the plan (embeddings, bridges, head)
    # and of encoder + decoder layer l: how the optimizer step's work splits over devices
    param_bytes_master: int = 0
    param_bytes_layer: Tuple[int, ...] = ()

    def rest_share(self, layer_device: Sequence[int]) -> float:
        """The largest fraction of the parameters any one device holds (1 without counts)."""
        total = self.param_bytes_master + sum(self.param_bytes_layer)
        if not self.param_bytes_layer or total == 0:
            return 1.0
        per_device: Dict[int, int] = {0: self.param_bytes_master}
        for layer, device in enumerate(layer_device):
            per_device[device] = per_device.get(device, 0) + self.param_bytes_layer[layer]
        return max(per_device.values()) / total

    def head_times(self, sentences: int) -> Tuple[float, float]:
        if sentences <= 0:
            return 0.0, 0.0
        if sentences in self.head_forward:
            return self.head_forward[sentences], self.head_backward[sentences]
        # linear interpolation between the nearest measured shard sizes
        sizes = sorted(self.head_forward)
        lower = max([s for s in sizes if s <= sentences], default=sizes[0])
        upper = min([s for s in sizes if s >= sentences], default=sizes[-1])
        if lower == upper:
            scale = sentences / lower
            return self.head_forward[lower] * scale, self.head_backward[lower] * scale
        w = (sentences - lower) / (upper - lower)
        return tuple(  # type: ignore[return-value]
            (1 - w) * table[lower] + w * table[upper]
            for table in (self.head_forward, self.head_backward)
        )


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def _check_issue_order(records: Sequence[Tuple[str, float]], expected: Sequence[str]) -> None:
    """The pipeline issued one task per cell, in clock-cycle order (else the timings
    would be attributed to the wrong cells)."""
    issued = [description for description, _ in records]
    if issued != list(expected):
        raise RuntimeError(
            "pipeline_model: the pipeline's tasks no longer match clock_cycles order "
            f"(first issued: {issued[:3]}, expected: {list(expected)[:3]})"
        )


def _measure_cells(model: Any, sample: dict, chunks: int, device: torch.device) -> Tuple[Dict[Key, float], Dict[Key, float], Dict[Key, int], int, int, int]:
    """One forward + backward of every cell on one device, through the pipeline's own code."""
    from fairseq_hybrid.pipeline import (
        DECODER, ENCODER, Cell, WavefrontPipeline, chunk_bounds, clock_cycles, describe,
    )
    from fairseq_hybrid.placement import build_plan

    encoder, decoder = model.encoder, model.decoder
    layers = encoder.num_layers
    plan = build_plan(str(device), None, chunks, layers, layers)
    workers = TimingWorkers(device_clock(device))
    pipeline = WavefrontPipeline.for_model(model, plan, workers)
    net = sample["net_input"]
    with torch.no_grad():
        tokens = encoder.right_pad(net["src_tokens"])
        source = encoder.embed(tokens)
        target = decoder.embed(net["prev_output_tokens"])
    masks = {
        ENCODER: encoder.stack.draw_masks(source.size(0), source.size(1), source),
        DECODER: decoder.stack.draw_masks(target.size(0), target.size(1), target),
    }
    source.requires_grad_(True)
    target.requires_grad_(True)
    spans = {ENCODER: chunk_bounds(source.size(0), chunks),
             DECODER: chunk_bounds(target.size(0), chunks)}
    lengths = net["src_lengths"].cpu()
    with torch.enable_grad():
        outputs, states, records = pipeline.forward_cells(source, lengths, target, spans, masks)
    cycles = clock_cycles(len(spans[ENCODER]), len(spans[DECODER]), layers)
    order: List[Key] = [(c.side, c.layer, c.chunk) for cycle in cycles for c in cycle]
    _check_issue_order(workers.records, [describe(c) for cycle in cycles for c in cycle])
    forward = {key: seconds for key, (_, seconds) in zip(order, workers.records)}
    output_bytes = {key: out.numel() * out.element_size() for key, out in outputs.items()}
    some_state = next(iter(states.values()))
    state_bytes = sum(t.numel() * t.element_size() for t in some_state)
    workers.records.clear()
    top = layers - 1
    top_grads = {
        ENCODER: torch.randn(source.size(0), source.size(1), outputs[(ENCODER, top, 0)].size(-1),
                             device=device),
        DECODER: torch.randn(target.size(0), target.size(1), outputs[(DECODER, top, 0)].size(-1),
                             device=device),
    }
    pipeline.backward_cells(records, spans, top_grads, [(None, None)] * layers)
    reverse_order = [(c.side, c.layer, c.chunk) for cycle in reversed(cycles) for c in cycle]
    # a bridge's backward (sizes differ) runs on device 0 right after its decoder layer's
    # chunk 0: counted as part of that cell
    cell_records: List[Tuple[str, float]] = []
    bridge = "backward of the bridge into decoder layer "
    for description, seconds in workers.records:
        if description.startswith(bridge):
            cell = "backward of " + describe(Cell(DECODER, int(description[len(bridge):]), 0))
            index = [name for name, _ in cell_records].index(cell)
            cell_records[index] = (cell, cell_records[index][1] + seconds)
        else:
            cell_records.append((description, seconds))
    _check_issue_order(cell_records,
                       ["backward of " + describe(c) for cycle in reversed(cycles) for c in cycle])
    backward = {key: seconds for key, (_, seconds) in zip(reverse_order, cell_records)}
    return forward, backward, output_bytes, state_bytes, len(spans[ENCODER]), len(spans[DECODER])


def _measure_run_all(workers: int, repeats: int = 200) -> float:
    """Median seconds of one ``DeviceWorkers.run_all`` of no-op tasks (one per worker)."""
    from fairseq_hybrid.worker import DeviceWorkers

    pool = DeviceWorkers([torch.device("cpu")] * workers)
    try:
        tasks = [(i, "no-op", lambda: None) for i in range(workers)]
        for _ in range(20):
            pool.run_all(tasks)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            pool.run_all(tasks)
            samples.append(time.perf_counter() - start)
        return _median(samples)
    finally:
        pool.close()


def measure_concurrency(
    size: ModelSize, batch: BatchSize, workers: int = 2, repeats: int = 3,
    workload: str = "lstm",
) -> float:
    """How much slower one device's work runs while ``workers`` CPU devices work at once
    on this box (shared cores, memory bandwidth, and whatever else runs here): the median
    duration of a task on each of ``workers`` worker threads (``DeviceWorkers``, 1 torch
    thread each) together, divided by the same task on one worker alone (1.0 =
    independent devices). ``workload``: "lstm", one LSTM layer's forward + backward over
    the batch's source (a pipeline cell); "head", the head + loss forward (recording the
    graph, as in training) of one shard of ``sentences / workers`` sentences (what the head
    shards run concurrently)."""
    from fairseq_hybrid.head_shards import ShardLoss
    from fairseq_hybrid.layers import lstm_layer
    from fairseq_hybrid.loss import TokenLoss
    from fairseq_hybrid.lstm_stack import run_layer
    from fairseq_hybrid.worker import DeviceWorkers

    if workload not in ("lstm", "head"):
        raise ValueError(f"workload {workload!r}: lstm or head")
    pool = DeviceWorkers([torch.device("cpu")] * workers, cpu_threads=1)
    tasks: List[Callable[[], Any]] = []
    if workload == "lstm":
        for _ in range(workers):
            layer = lstm_layer(size.hidden, size.hidden)
            x = torch.randn(batch.source_len, batch.sentences, size.hidden)

            def lstm_task(layer: torch.nn.LSTM = layer, x: torch.Tensor = x) -> None:
                out, (h, c) = run_layer(layer, x, None, None)
                torch.autograd.backward([out, h, c], [torch.ones_like(out), torch.ones_like(h),
                                                      torch.ones_like(c)])
            tasks.append(lstm_task)
    else:
        model, task = build_model(size)
        module = ShardLoss(model.decoder.head,
                           TokenLoss(task.target_dictionary.pad(), 0.1, chunk_tokens=0))
        shard = max(1, math.ceil(batch.sentences / workers))
        target = synthetic_sample(task.target_dictionary, batch)["target"][:shard]
        for _ in range(workers):
            inputs = (torch.randn(shard, batch.target_len, size.hidden, requires_grad=True),
                      torch.randn(shard, batch.source_len, size.hidden, requires_grad=True),
                      torch.zeros(shard, batch.source_len, dtype=torch.bool), target)

            def head_task(inputs: Tuple[torch.Tensor, ...] = inputs) -> None:
                module(*inputs)  # with autograd recording, as in training; graph dropped
            tasks.append(head_task)

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        return run

    try:
        alone: List[float] = []
        together: List[float] = []
        for round_index in range(repeats + 1):
            solo = pool.run_all([(0, "alone", timed(tasks[0]))])
            both = pool.run_all([(i, "together", timed(tasks[i])) for i in range(workers)])
            if round_index > 0:
                alone.extend(solo)
                together.extend(both)
        return _median(together) / _median(alone)
    finally:
        pool.close()


def measure_stage_times(
    size: ModelSize,
    batch: BatchSize,
    chunk_counts: Sequence[int],
    device_counts: Sequence[int],
    repeats: int = 3,
    threads: int = 1,
    progress: Callable[[str], None] = lambda message: None,
    device: str = "cpu",
) -> StageTimes:
    """Measure the stage times of ``size`` on ``batch`` on one ``device`` ("cpu": this
    machine's CPU with ``threads`` torch threads, the thread count of one CPU device
    worker; or e.g. "cuda:0", timed with ``torch.cuda.synchronize``)."""
    from fairseq_hybrid.head_shards import ShardLoss
    from fairseq_hybrid.loss import TokenLoss

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        now = device_clock(dev)
        model, task = build_model(size)
        model = model.to(dev)
        dictionary = task.target_dictionary
        sample = synthetic_sample(dictionary, batch)
        sample["target"] = sample["target"].to(dev)
        net = sample["net_input"]
        for name in ("src_tokens", "prev_output_tokens"):
            net[name] = net[name].to(dev)
        encoder, decoder = model.encoder, model.decoder

        # --- cells, every K, interleaved over the repeats (one warm-up round first)
        samples: Dict[int, List[Tuple[Dict[Key, float], Dict[Key, float]]]] = {k: [] for k in chunk_counts}
        meta: Dict[int, Tuple[Dict[Key, int], int, int, int]] = {}
        for round_index in range(repeats + 1):
            for chunks in chunk_counts:
                fwd, bwd, out_bytes, state_bytes, ks, kt = _measure_cells(model, sample, chunks, dev)
                meta[chunks] = (out_bytes, state_bytes, ks, kt)
                if round_index > 0:
                    samples[chunks].append((fwd, bwd))
            progress(f"cells: round {round_index}/{repeats}")
        cells = {}
        for chunks in chunk_counts:
            out_bytes, state_bytes, ks, kt = meta[chunks]
            keys = samples[chunks][0][0].keys()
            cells[chunks] = CellTimes(
                chunks, ks, kt, size.layers,
                {k: _median(s[0][k] for s in samples[chunks]) for k in keys},
                {k: _median(s[1][k] for s in samples[chunks]) for k in keys},
                out_bytes, state_bytes,
            )

        # --- embeddings (and the dropout masks drawn with them), forward and backward
        embed_f, embed_b = [], []
        for round_index in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            start = now()
            tokens = encoder.right_pad(net["src_tokens"])
            source = encoder.embed(tokens)
            encoder.stack.draw_masks(source.size(0), source.size(1), source)
            encoder.top_mask((source.size(0), source.size(1), encoder.hidden_size), source)
            target = decoder.embed(net["prev_output_tokens"])
            decoder.stack.draw_masks(target.size(0), target.size(1), target)
            middle = now()
            torch.autograd.backward([source, target], [torch.ones_like(source), torch.ones_like(target)])
            end = now()
            if round_index > 0:
                embed_f.append(middle - start)
                embed_b.append(end - middle)
        progress("embeddings")

        # --- the head + loss on shards of every size the device counts need
        loss_fn = TokenLoss(padding_idx=dictionary.pad(), epsilon=0.1, chunk_tokens=0)
        module = ShardLoss(decoder.head, loss_fn)
        shard_sizes = sorted({math.ceil(batch.sentences / n) for n in device_counts}
                             | {batch.sentences})
        features_all = torch.randn(batch.sentences, batch.target_len, size.hidden, device=dev)
        sources_all = torch.randn(batch.sentences, batch.source_len, size.hidden, device=dev)
        padding_all = torch.zeros(batch.sentences, batch.source_len, dtype=torch.bool, device=dev)
        head_f: Dict[int, List[float]] = {s: [] for s in shard_sizes}
        head_b: Dict[int, List[float]] = {s: [] for s in shard_sizes}
        for round_index in range(repeats + 1):
            for shard in shard_sizes:
                model.zero_grad(set_to_none=True)
                features = features_all[:shard].clone().requires_grad_(True)
                sources = sources_all[:shard].clone().requires_grad_(True)
                target = sample["target"][:shard]
                start = now()
                mask = decoder.head.combine_mask(
                    (shard * batch.target_len, decoder.head.combined_dim), features
                )
                result = module(features, sources, padding_all[:shard], target, mask)
                middle = now()
                result.loss.backward()
                end = now()
                if round_index > 0:
                    head_f[shard].append(middle - start)
                    head_b[shard].append(end - middle)
        progress("head")
        head_params = sum(p.numel() * p.element_size() for p in decoder.head.parameters())
        element = features_all.element_size()
        head_input = (batch.target_len + batch.source_len) * size.hidden * element

        # --- the rest: gradient clipping + Adam step over every parameter
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=1e-6)
        grads = [torch.randn_like(p) * 1e-3 for p in params]
        rest = []
        for round_index in range(repeats + 1):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            start = now()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            model.zero_grad(set_to_none=True)
            if round_index > 0:
                rest.append(now() - start)
        progress("rest")

        overhead = {n: _measure_run_all(n) for n in sorted(set(device_counts) | {1})}
        layer_bytes = tuple(
            sum(p.numel() * p.element_size()
                for stack in (encoder.stack, decoder.stack)
                for p in stack.layers[layer].parameters())
            for layer in range(size.layers)
        )
        total_bytes = sum(p.numel() * p.element_size() for p in params)
        return StageTimes(
            size, batch, threads, repeats, cells, _median(embed_f), _median(embed_b),
            {s: _median(v) for s, v in head_f.items()}, {s: _median(v) for s, v in head_b.items()},
            head_params, head_input, _median(rest), overhead, str(dev),
            total_bytes - sum(layer_bytes), layer_bytes,
        )
    finally:
        torch.set_num_threads(saved_threads)


# ------------------------------------------------------------------ simulator
def _dependencies(key: Key, source_chunks: int, direction: str, layers: int, target_chunks: int) -> List[Tuple[Key, str]]:
    """The cells whose results ``key`` needs: (cell, kind) with kind "output" (crosses from
    layer l-1 forward / l+1 backward) or "state" (same layer). The pipeline's own rule
    (``input_cell``, ``state_cell``); backward inverts it."""
    from fairseq_hybrid.pipeline import Cell, clock_cycles, input_cell, state_cell

    def needs(cell: Cell) -> List[Tuple[Optional[Key], str]]:
        return [(input_cell(cell), "output"), (state_cell(cell, source_chunks), "state")]

    if direction == "forward":
        return [(dep, kind) for dep, kind in needs(Cell(*key)) if dep is not None]
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
    from fairseq_hybrid.pipeline import clock_cycles

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


def predict_step(
    stage: StageTimes, devices: int, chunks: int, semantics: str = "cpu-workers",
    link: Link = Link(), balance: Optional[str] = None,
    slowdown: Optional[Mapping[int, float]] = None,
    head_slowdown: Optional[Mapping[int, float]] = None,
) -> Dict[str, float]:
    """Predicted seconds of one training step on ``devices`` devices with ``chunks`` time
    chunks, by part (``total`` is their sum). ``slowdown``: see ``simulate_pipeline``;
    ``head_slowdown``: the same for the head shards' concurrent forward (default:
    ``slowdown``); cpu-workers only; None = devices that do not slow each other down."""
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics {semantics!r}: one of {SEMANTICS}")
    from fairseq_hybrid.placement import shard_bounds

    cells = stage.cells[chunks]
    mapping = layer_map(devices, stage.model.layers, balance)
    plain = devices == 1 and chunks == 1
    common = dict(output_bytes=cells.output_bytes, state_bytes=cells.state_bytes, link=link)
    run_all = stage.cycle_overhead.get(devices, 0.0)
    if semantics == "cpu-workers":
        forward = simulate_pipeline(
            cells.forward, mapping, cells.source_chunks, cells.target_chunks, "forward",
            "serial" if plain else "cycle", cycle_overhead=0.0 if plain else run_all,
            slowdown=slowdown, **common,
        )
        backward = simulate_pipeline(
            cells.backward, mapping, cells.source_chunks, cells.target_chunks, "backward",
            "serial" if devices == 1 else "cycle", cycle_overhead=0.0 if devices == 1 else run_all,
            slowdown=slowdown, **common,
        )
    else:
        forward = simulate_pipeline(cells.forward, mapping, cells.source_chunks,
                                    cells.target_chunks, "forward", "dataflow", **common)
        backward = simulate_pipeline(cells.backward, mapping, cells.source_chunks,
                                     cells.target_chunks, "backward", "dataflow", **common)
    # the head: sentences split into one shard per device
    shards = [end - start for start, end in shard_bounds(stage.batch.sentences, devices)]
    times = [stage.head_times(s) for s in shards if s > 0]
    head_forward = max(f for f, _ in times)
    head_backward = max(b for _, b in times)
    if semantics == "cpu-workers" and devices > 1:
        # fairseq_hybrid.head_shards: forward and backward of each shard on its worker,
        # one run_all round trip each
        shared = head_slowdown if head_slowdown is not None else slowdown
        factor = (shared or {}).get(len(times), 1.0)
        head_forward = head_forward * factor + run_all
        head_backward = head_backward * factor + run_all
    head_comm = 0.0
    if semantics == "cuda" and devices > 1:
        last = mapping[-1]
        moved = sum(s for index, s in enumerate(shards) if index != last and s > 0)
        # H and S shards out (forward) and their gradients back (backward), issued serially
        head_comm += 2 * link.cost(moved * stage.head_input_bytes_per_sentence, count=2)
        # replicate the head's parameters, reduce their gradients (pipelined broadcast)
        head_comm += 2 * link.cost(stage.head_param_bytes)
    # the optimizer step: one thread for CPU devices; on GPUs each device updates its own
    # parameters concurrently (kernels launched asynchronously), so the busiest one counts
    rest = stage.rest if semantics == "cpu-workers" else stage.rest * stage.rest_share(mapping)
    parts = {
        "embeddings_forward": stage.embed_forward,
        "embeddings_backward": stage.embed_backward,
        "pipeline_forward": forward,
        "pipeline_backward": backward,
        "head_forward": head_forward,
        "head_backward": head_backward,
        "head_transfers": head_comm,
        "rest": rest,
    }
    parts["total"] = sum(parts.values())
    return parts


def predict_speedups(
    stage: StageTimes, device_counts: Sequence[int], chunk_counts: Sequence[int],
    semantics: str = "cpu-workers", link: Link = Link(),
    slowdown: Optional[Mapping[int, float]] = None,
    head_slowdown: Optional[Mapping[int, float]] = None,
) -> Dict[Tuple[int, int], Dict[str, float]]:
    """speedup(N, K) = step(1 device, K = 1) / step(N, K), with each step's parts."""
    base = predict_step(stage, 1, 1, semantics, link)["total"]
    out = {}
    for n in device_counts:
        for k in chunk_counts:
            parts = predict_step(stage, n, k, semantics, link, slowdown=slowdown,
                                 head_slowdown=head_slowdown)
            out[(n, k)] = {**parts, "speedup": base / parts["total"]}
    return out


# ------------------------------------------------------------------ real steps
def measure_real_steps(
    size: ModelSize, batch: BatchSize, configs: Sequence[Tuple[int, int]], repeats: int = 3,
    threads: int = 1, progress: Callable[[str], None] = lambda message: None,
) -> Dict[Tuple[int, int], Dict[str, Any]]:
    """Median seconds of the real training step (zero_grad, ``hybrid_cross_entropy``
    forward through ``HybridLSTMModel``'s engine, backward, clip, Adam step) for each
    (devices, chunks) on CPU devices with ``threads`` torch threads per device;
    configurations interleaved (A B C A B C ...) after one warm-up step per device count."""
    from fairseq_hybrid.criterion import HybridCrossEntropyCriterion

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    model, task = build_model(size)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1)
    sample = synthetic_sample(task.target_dictionary, batch)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-6)
    engines = {}
    try:
        for n, k in configs:
            model.placement_options = {
                "hybrid_devices": ",".join(["cpu"] * n), "pipeline_chunks": k,
                "hybrid_balance": None,
            }
            model._hybrid_engine = None  # keep each configuration's engine; swapped below
            engine = model.hybrid_engine(cpu_threads=threads)
            engine.workers.run_all([(i, "start", lambda: None) for i in range(n)])
            engines[(n, k)] = engine
        samples: Dict[Tuple[int, int], List[float]] = {c: [] for c in configs}
        phases: Dict[Tuple[int, int], Dict[str, List[float]]] = {
            c: {"forward": [], "backward": [], "update": []} for c in configs
        }
        warm_up = list({n: (n, k) for n, k in reversed(configs)}.values())
        for round_index in range(repeats + 1):
            for config in (configs if round_index > 0 else warm_up):
                model._hybrid_engine = engines[config]
                start = time.perf_counter()
                model.zero_grad(set_to_none=True)
                loss, _, _ = criterion(model, sample)
                forward_end = time.perf_counter()
                loss.backward()
                backward_end = time.perf_counter()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                end = time.perf_counter()
                if round_index > 0:
                    samples[config].append(end - start)
                    phases[config]["forward"].append(forward_end - start)
                    phases[config]["backward"].append(backward_end - forward_end)
                    phases[config]["update"].append(end - backward_end)
            progress(f"real steps: round {round_index}/{repeats}")
        return {
            c: {"median_s": _median(v), "runs_s": v,
                "phases_median_s": {name: _median(t) for name, t in phases[c].items()}}
            for c, v in samples.items()
        }
    finally:
        for engine in engines.values():
            engine.workers.close()
        model._hybrid_engine = None
        torch.set_num_threads(saved_threads)


# ------------------------------------------------------------------ the report
def _gbs_link(bandwidth_gbs: float, latency_us: float) -> Link:
    return Link(bandwidth_gbs * 1e9, latency_us * 1e-6)


def run(
    preset: str = "small",
    quick: bool = False,
    validate: bool = False,
    devices: Optional[int] = None,
    chunks: Optional[Sequence[int]] = None,
    bandwidth_gbs: float = 10.0,
    latency_us: float = 20.0,
    repeats: Optional[int] = None,
    progress: Callable[[str], None] = lambda message: None,
    device: str = "cpu",
    sentences: Optional[int] = None,
) -> Dict[str, Any]:
    """Measure one device's stage times for ``preset``, predict speedups for 1..``devices``
    devices and ``chunks`` chunk counts under both semantics, and (``validate``) compare
    with the real step on CPU devices (N in 1, 2; K in ``chunks``). Returns a JSON-ready
    dict (see ``format_report``); benchmarks/scaling.py can merge it into its report.
    ``device``: where one device's stage times are measured ("cpu", or "cuda" on a GPU
    box: then the ``cuda`` rows are GPU predictions; validation needs "cpu")."""
    if validate and torch.device(device).type != "cpu":
        raise ValueError("--validate compares with CPU devices: measure with --device cpu")
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: one of {sorted(PRESETS)}")
    spec = PRESETS[preset]
    batch = spec.quick_batch if quick else spec.batch
    note = spec.note
    if sentences is not None:
        if sentences < 1:
            raise ValueError(f"--sentences {sentences}: at least 1")
        batch = BatchSize(sentences, batch.source_len, batch.target_len)
        note = f"{sentences} sentences (set with --sentences)"
    devices = devices or (2 if preset == "small" else 4)
    if devices > spec.model.layers:
        raise ValueError(f"{devices} devices for {spec.model.layers} layers: at most one per layer")
    chunks = list(chunks or ([1, 2, 4] if preset == "small" else [1, 2, 4, 8, 16]))
    if 1 not in chunks:
        chunks = [1] + chunks  # the denominator's K
    repeats = repeats or (3 if quick else 5)
    device_counts = list(range(1, devices + 1))
    started = time.perf_counter()
    load_start = os.getloadavg()
    stage = measure_stage_times(spec.model, batch, chunks, device_counts, repeats, 1, progress,
                                device)
    link = _gbs_link(bandwidth_gbs, latency_us)
    report: Dict[str, Any] = {
        "what": "pipeline performance model: per-cell stage times measured on one device, "
                "clock-cycle schedule simulated for N devices and K chunks",
        "preset": preset,
        "model": asdict(spec.model),
        "batch": asdict(batch),
        "batch_note": note,
        "measured_on": (
            f"{torch.cuda.get_device_name(torch.device(stage.device))} ({stage.device})"
            if stage.device.startswith("cuda") else
            f"{platform.processor() or platform.machine()}, 1 torch thread per device "
            f"(this machine's CPU; {os.cpu_count()} cores)"),
        "torch": torch.__version__,
        "denominator": "predicted step of hybrid_lstm on 1 device, K = 1 (same model, batch)",
        "link": {"cpu-workers": "shared memory: no transfer cost",
                 "cuda": {"bandwidth_gbs": bandwidth_gbs, "latency_us": latency_us}},
        "stage_times": _stage_summary(stage),
        "predictions": {},
    }
    for semantics, sem_link in (("cpu-workers", Link()), ("cuda", link)):
        table = predict_speedups(stage, device_counts, chunks, semantics, sem_link)
        report["predictions"][semantics] = [
            {"devices": n, "chunks": k, **{name: round(v, 6) for name, v in parts.items()}}
            for (n, k), parts in table.items()
        ]
    if validate:
        configs = [(n, k) for n in (1, 2) if n <= spec.model.layers for k in chunks]
        probes = 2 if quick else repeats

        def probe() -> Dict[str, float]:
            return {w: measure_concurrency(spec.model, batch, 2, probes, w)
                    for w in ("lstm", "head")}

        before = probe()
        real = measure_real_steps(spec.model, batch, configs, repeats, 1, progress)
        after = probe()
        contention = {w: {2: (before[w] + after[w]) / 2} for w in before}
        progress(f"2-worker slowdown before {before}, after {after}")
        predicted = predict_speedups(stage, [1, 2], chunks, "cpu-workers", Link())
        contended = predict_speedups(stage, [1, 2], chunks, "cpu-workers", Link(),
                                     contention["lstm"], contention["head"])
        base = real[(1, 1)]["median_s"]
        base_min = min(real[(1, 1)]["runs_s"])
        rows = []
        for n, k in configs:
            measured = base / real[(n, k)]["median_s"]
            measured_min = base_min / min(real[(n, k)]["runs_s"])
            model_speedup = predicted[(n, k)]["speedup"]
            contended_speedup = contended[(n, k)]["speedup"]
            rows.append({
                "devices": n, "chunks": k,
                "measured_step_s": round(real[(n, k)]["median_s"], 6),
                "predicted_step_s": round(predicted[(n, k)]["total"], 6),
                "measured_speedup": round(measured, 4),
                "predicted_speedup": round(model_speedup, 4),
                "speedup_error": round((model_speedup - measured) / measured, 4),
                "measured_speedup_of_fastest_runs": round(measured_min, 4),
                "speedup_error_vs_fastest_runs": round((model_speedup - measured_min) / measured_min, 4),
                "step_time_error": round(
                    (predicted[(n, k)]["total"] - real[(n, k)]["median_s"])
                    / real[(n, k)]["median_s"], 4),
                "predicted_speedup_with_measured_contention": round(contended_speedup, 4),
                "speedup_error_with_measured_contention": round(
                    (contended_speedup - measured) / measured, 4),
                "runs_s": [round(v, 6) for v in real[(n, k)]["runs_s"]],
                "phases_s": {
                    "measured": {name: round(t, 5)
                                 for name, t in real[(n, k)]["phases_median_s"].items()},
                    "predicted": _phases(predicted[(n, k)]),
                    "predicted_with_contention": _phases(contended[(n, k)]),
                },
            })
        report["validation"] = {
            "what": "real hybrid training step (zero_grad, hybrid_cross_entropy fwd through "
                    "HybridLSTMModel's engine, backward, clip, Adam) on cpu vs cpu,cpu "
                    "(1 torch thread per device), median of repeats, against the "
                    "cpu-workers prediction; speedups relative to the measured / predicted "
                    "cpu K=1 step; error = (predicted - measured) / measured",
            "repeats": repeats,
            "two_worker_slowdown": {
                w: {"before": round(before[w], 4), "after": round(after[w], 4),
                    "used": round(contention[w][2], 4)} for w in before
            },
            "contention_note": "the plain prediction assumes devices that do not slow each "
                               "other down; the second one scales pipeline cells that run "
                               "while both CPU workers are busy by the slowdown of two "
                               "concurrent LSTM layers, and the concurrent head shards' "
                               "forward by that of two concurrent head shards, both "
                               "measured on this box around the real steps (1.0 = "
                               "independent cores)",
            "rows": rows,
        }
    report["load_average_1_5_15min"] = {"start": load_start, "end": os.getloadavg()}
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


def _phases(parts: Mapping[str, float]) -> Dict[str, float]:
    """A predicted step's parts grouped as the real step's timers see them: the
    criterion's forward (embeddings, pipeline, head), ``loss.backward()``, clip + Adam."""
    return {
        "forward": round(parts["embeddings_forward"] + parts["pipeline_forward"]
                         + parts["head_forward"], 5),
        "backward": round(parts["pipeline_backward"] + parts["head_backward"]
                          + parts["head_transfers"] + parts["embeddings_backward"], 5),
        "update": round(parts["rest"], 5),
    }


def _stage_summary(stage: StageTimes) -> Dict[str, Any]:
    cells = {}
    for k, c in stage.cells.items():
        cells[str(k)] = {
            "source_chunks": c.source_chunks, "target_chunks": c.target_chunks,
            "forward_s": {"/".join(map(str, key)): round(v, 7) for key, v in c.forward.items()},
            "backward_s": {"/".join(map(str, key)): round(v, 7) for key, v in c.backward.items()},
            "forward_sum_s": round(sum(c.forward.values()), 6),
            "backward_sum_s": round(sum(c.backward.values()), 6),
            "output_bytes": {"/".join(map(str, key)): v for key, v in c.output_bytes.items()},
            "state_bytes": c.state_bytes,
        }
    return {
        "threads": stage.threads, "repeats": stage.repeats, "cells": cells,
        "embed_forward_s": round(stage.embed_forward, 6),
        "embed_backward_s": round(stage.embed_backward, 6),
        "head_forward_s": {str(s): round(v, 6) for s, v in stage.head_forward.items()},
        "head_backward_s": {str(s): round(v, 6) for s, v in stage.head_backward.items()},
        "head_param_bytes": stage.head_param_bytes,
        "head_input_bytes_per_sentence": stage.head_input_bytes_per_sentence,
        "rest_s": round(stage.rest, 6),
        "param_bytes_master": stage.param_bytes_master,
        "param_bytes_per_layer": list(stage.param_bytes_layer),
        "run_all_overhead_s": {str(n): round(v, 7) for n, v in stage.cycle_overhead.items()},
    }


def format_report(report: Dict[str, Any]) -> str:
    lines = [
        f"pipeline model: preset {report['preset']}, model {report['model']}, "
        f"batch {report['batch']}" + (f" ({report['batch_note']})" if report["batch_note"] else ""),
        f"per-device times measured on: {report['measured_on']}",
        f"denominator: {report['denominator']}",
    ]
    s = report["stage_times"]
    lines.append(
        f"stage times (1 device): embeddings {s['embed_forward_s'] + s['embed_backward_s']:.4f}s, "
        f"head fwd {s['head_forward_s']} bwd {s['head_backward_s']}, rest {s['rest_s']:.4f}s, "
        f"run_all round trip {s['run_all_overhead_s']}"
    )
    for k, c in s["cells"].items():
        lines.append(f"  K={k}: cells fwd sum {c['forward_sum_s']:.4f}s, bwd sum "
                     f"{c['backward_sum_s']:.4f}s")
    cuda = report["link"]["cuda"]
    for semantics, rows in report["predictions"].items():
        label = ("CPU worker threads (barrier per cycle; head shards on the workers), no transfer cost"
                 if semantics == "cpu-workers" else
                 f"CUDA semantics (dataflow), link {cuda['bandwidth_gbs']} GB/s + "
                 f"{cuda['latency_us']} us/transfer; per-device times as measured above")
        lines.append(f"predicted speedup, {label}:")
        lines.append(f"  {'N':>2} {'K':>3} {'step s':>9} {'pipe fwd':>9} {'pipe bwd':>9} "
                     f"{'head':>8} {'xfer':>7} {'emb+rest':>8} {'speedup':>8}")
        for r in rows:
            lines.append(
                f"  {r['devices']:>2} {r['chunks']:>3} {r['total']:>9.4f} "
                f"{r['pipeline_forward']:>9.4f} {r['pipeline_backward']:>9.4f} "
                f"{r['head_forward'] + r['head_backward']:>8.4f} {r['head_transfers']:>7.4f} "
                f"{r['embeddings_forward'] + r['embeddings_backward'] + r['rest']:>8.4f} "
                f"{r['speedup']:>8.3f}"
            )
    if "validation" in report:
        lines.append("validation (real step on CPU devices, 1 thread each, median of "
                     f"{report['validation']['repeats']}):")
        v = report["validation"]
        lines.append(
            "  two CPU workers at once run "
            f"{v['two_worker_slowdown']['lstm']['used']:.2f}x (LSTM cells) / "
            f"{v['two_worker_slowdown']['head']['used']:.2f}x (head shards) slower each than "
            "one alone on this box now (1.00 = independent cores)")
        lines.append(f"  {'N':>2} {'K':>3} {'meas s':>8} {'pred s':>8} {'meas x':>7} "
                     f"{'min x':>7} {'pred x':>7} {'err':>7} {'pred+c x':>8} {'err':>7}")
        for r in report["validation"]["rows"]:
            lines.append(
                f"  {r['devices']:>2} {r['chunks']:>3} {r['measured_step_s']:>8.4f} "
                f"{r['predicted_step_s']:>8.4f} {r['measured_speedup']:>7.3f} "
                f"{r['measured_speedup_of_fastest_runs']:>7.3f} "
                f"{r['predicted_speedup']:>7.3f} {100 * r['speedup_error']:>6.1f}% "
                f"{r['predicted_speedup_with_measured_contention']:>8.3f} "
                f"{100 * r['speedup_error_with_measured_contention']:>6.1f}%"
            )
        lines.append("  phases, measured / predicted / predicted with contention (s): "
                     "forward, backward, update")
        for r in report["validation"]["rows"]:
            ph = r["phases_s"]
            lines.append(f"  {r['devices']:>2} {r['chunks']:>3}  " + "   ".join(
                f"{name} {ph['measured'][name]:.3f}/{ph['predicted'][name]:.3f}/"
                f"{ph['predicted_with_contention'][name]:.3f}"
                for name in ("forward", "backward", "update")))
        lines.append("  (speedups over the cpu K=1 step, measured (median; min x: fastest runs) "
                     "and predicted; err = (pred - meas) / meas against the median; pred+c: "
                     "with the measured two-worker slowdown)")
    load = report["load_average_1_5_15min"]
    lines.append(f"load average (1 min) at start {load['start'][0]:.2f}, end {load['end'][0]:.2f}; "
                 f"elapsed {report['elapsed_s']}s")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--devices", type=int, help="largest N to predict (default: small 2, wmt 4)")
    parser.add_argument("--chunks", help="comma-separated K values (default: small 1,2,4; "
                        "wmt 1,2,4,8,16)")
    parser.add_argument("--validate", action="store_true",
                        help="also measure the real step on cpu and cpu,cpu and report the error")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (and for wmt a "
                        "smaller batch)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--sentences", type=int,
                        help="sentences per batch (default: the preset's; lengths stay)")
    parser.add_argument("--bandwidth-gbs", type=float, default=10.0,
                        help="device link bandwidth for the cuda semantics (GB/s)")
    parser.add_argument("--latency-us", type=float, default=20.0,
                        help="per-transfer latency for the cuda semantics (microseconds)")
    parser.add_argument("--device", default="cpu",
                        help="where to measure one device's stage times: cpu (default) or cuda")
    parser.add_argument("--json", help="write the report here (atomically)")
    args = parser.parse_args(argv)
    logging.getLogger("fairseq_hybrid").setLevel(logging.WARNING)  # no placement tables
    try:
        chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else None
    except ValueError:
        sys.exit(f"pipeline_model.py: error: --chunks {args.chunks!r}: comma-separated integers")
    if chunks is not None and min(chunks) < 1:
        sys.exit("pipeline_model.py: error: --chunks values must be >= 1")
    if args.devices is not None and args.devices < 1:
        sys.exit("pipeline_model.py: error: --devices must be >= 1")
    try:
        report = run(args.preset, args.quick, args.validate, args.devices, chunks,
                     args.bandwidth_gbs, args.latency_us, args.repeats,
                     progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True),
                     device=args.device, sentences=args.sentences)
    except ValueError as error:
        sys.exit(f"pipeline_model.py: error: {error}")
    print(format_report(report))
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
