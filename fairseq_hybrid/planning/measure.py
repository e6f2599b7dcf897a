"""Measurement on one device: the forward and backward time of every (side, layer, chunk)
cell of the wavefront for each chunk count K, through the pipeline's own
``forward_cells``/``backward_cells`` with a worker stand-in that runs each task inline and
times it; the bytes each cell hands on; the embeddings; the head + loss per shard size; the
rest of the update (clipping + Adam); the cost of one ``DeviceWorkers.run_all`` round trip;
and how much CPU devices slow each other down when they work at once."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

import torch

from ..model.head import AttentionHead
from ..model.initialized_layers import lstm_layer
from ..model.loss import TokenLoss
from ..model.lstm_stack import run_layer
from ..parallel.head_shards import ShardLoss
from ..parallel.interface import HybridModel
from ..parallel.pipeline import pipeline_inputs
from ..parallel.placement import build_plan
from ..parallel.schedule import Key
from ..parallel.worker import DeviceWorkers
from ..chunking.auto_chunks import run_all_overhead
from ..chunking.cell_timing import TimingWorkers, device_clock, time_cells
from ..chunking.wavefront import CellTimes
from .sizes import BatchSize, ModelSize
from .stage_times import StageTimes


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def _measure_cells(
    model: Any, sample: dict, chunks: int, device: torch.device,
) -> Tuple[Dict[Key, float], Dict[Key, float], Dict[Key, int], int, int, int]:
    """One forward + backward of every cell on one device, through the pipeline's own code."""
    layers = model.encoder.num_layers
    plan = build_plan((device,), None, chunks, layers, layers)
    net = sample["net_input"]
    with torch.no_grad():
        draws = model.draw_step(net["src_tokens"], net["prev_output_tokens"])
    source, target, masks = pipeline_inputs(draws)
    timing = time_cells(model, plan, TimingWorkers(device_clock(device)), source,
                        net["src_lengths"], target, masks)
    return (timing.forward, timing.backward, timing.output_bytes, timing.state_bytes,
            timing.source_chunks, timing.target_chunks)


def _measure_run_all(workers: int, repeats: int = 200) -> float:
    """Median seconds of one ``DeviceWorkers.run_all`` of no-op tasks on ``workers`` CPU workers."""
    pool = DeviceWorkers([torch.device("cpu")] * workers)
    try:
        return run_all_overhead(pool, repeats, warm_up=20)
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
        pad = 1  # fairseq's padding index; targets are drawn above the special symbols
        head = AttentionHead(size.decoder_size, size.hidden, size.embed,
                             size.vocab, size.dropout)
        module = ShardLoss(head, TokenLoss(pad, 0.1, chunk_tokens=0))
        shard = max(1, math.ceil(batch.sentences / workers))
        target = torch.randint(4, size.vocab, (shard, batch.target_len),
                               generator=torch.Generator().manual_seed(1))
        for _ in range(workers):
            inputs = (torch.randn(shard, batch.target_len, size.decoder_size,
                                  requires_grad=True),
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
        return median(together) / median(alone)
    finally:
        pool.close()


def measure_model_stage_times(
    model: HybridModel,
    dictionary: Any,
    sample: dict,
    size: ModelSize,
    batch: BatchSize,
    chunk_counts: Sequence[int],
    device_counts: Sequence[int],
    repeats: int = 3,
    threads: int = 1,
    progress: Callable[[str], None] = lambda message: None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> StageTimes:
    """``measure_stage_times`` of a given ``HybridLSTMModel`` (train mode) on a given
    collated ``sample`` of ``batch``'s shape (a real batch, padding and all: the advisor's),
    moved to ``device`` in ``dtype`` (a GPU's bfloat16). On CUDA, ``StageTimes.peak_bytes``
    is the device's peak."""
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        now = device_clock(dev)
        model = model.to(dev, dtype)
        sample = dict(sample, target=sample["target"].to(dev),
                      net_input={name: value.to(dev) if name != "src_lengths" else value
                                 for name, value in sample["net_input"].items()})
        net = sample["net_input"]
        encoder, decoder = model.encoder, model.decoder
        features_dim = size.decoder_size

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
                {k: median(s[0][k] for s in samples[chunks]) for k in keys},
                {k: median(s[1][k] for s in samples[chunks]) for k in keys},
                out_bytes, state_bytes,
            )

        # --- embeddings (and the dropout masks drawn with them), forward and backward
        embed_f, embed_b = [], []
        for round_index in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            start = now()
            draws = model.draw_step(net["src_tokens"], net["prev_output_tokens"])
            source, target = draws.encoder.source, draws.decoder.target
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
        features_all = torch.randn(batch.sentences, batch.target_len, features_dim, device=dev,
                                   dtype=dtype)
        sources_all = torch.randn(batch.sentences, batch.source_len, size.hidden, device=dev,
                                  dtype=dtype)
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
                mask = decoder.head.combine_mask(  # over the tokens the loss selects (not padding)
                    (int(loss_fn.selection(target).sum()), decoder.head.combined_dim), features
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
        head_input = (batch.target_len * features_dim + batch.source_len * size.hidden) * element

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
            size, batch, threads, repeats, cells, median(embed_f), median(embed_b),
            {s: median(v) for s, v in head_f.items()}, {s: median(v) for s, v in head_b.items()},
            head_params, head_input, median(rest), overhead, str(dev),
            total_bytes - sum(layer_bytes), layer_bytes,
            torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
            activation_bytes=element,
        )
    finally:
        torch.set_num_threads(saved_threads)
