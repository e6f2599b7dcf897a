"""``python -m fairseq_hybrid.tools.advise``: what to run before a long training. Takes the data
directory and the same options as ``fairseq-train`` (parsed by fairseq's own parser, with
the plugin's parse-time checks), measures the real model on real batches of the training
split on the first device (a short measurement, per-cell and per-stage), and recommends
``--pipeline-chunks``, ``--hybrid-balance``, ``--max-tokens``, the device count and the
data-parallel replica count from the performance model (``planning.recommend``), each with
its predicted target tokens/s. It then times a few real steps of the recommended
configuration on the given devices to report the model's error there, prints the table and
the ``fairseq-train`` command line with the choices filled in, and writes the report as
JSON (atomically).

    python -m fairseq_hybrid.tools.advise data-bin/my-en-de --user-dir fairseq_hybrid \\
        --arch hybrid_lstm --hybrid-devices cpu,cpu --max-tokens 4000 --link-gbps 10
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from .advice_report import REPLICA_LIMIT, command_line, format_report, recommendation_rows, scheme_command
from ..errors import HybridConfigError
from ..jsonio import write_json_atomic
from ..chunking.auto_chunks import probe_chunks
from ..chunking.chunk_choice import simplest_within
from ..parallel.placement import Devices
from ..plugin.placement_options import PlacementOptions, parse_balance, placement_options
from ..parallel.worker import cpu_threads_per_worker
from ..planning.measure import measure_model_stage_times
from ..planning.compare import SAME_BATCH, SHARDED_OPTIMIZER, compare
from ..planning.recommend import (
    Prediction, batch_knee, best_balance, best_chunks, device_knee, memory_limit, predict,
    replica_knee, with_fitted_cells,
)
from ..chunking.wavefront import Link
from ..planning.sizes import BatchSize, ModelSize
from ..planning.stage_times import StageTimes

logger = logging.getLogger(__name__)
# between the devices of one machine (the cuda schedule's transfers); CPU devices share memory
GPU_LINK = Link(10e9, 20e-6)
SWEEP = (0.25, 0.5, 1, 2, 4)  # --max-tokens tried, as multiples of the given one
CHECK_STEPS = 3  # real steps timed for the model's error (after one warm-up step)


def add_advisor_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("advisor (python -m fairseq_hybrid.tools.advise)")
    group.add_argument("--link-gbps", type=float, default=10.0,
                       help="bandwidth between machines in Gbit/s, for the data-parallel "
                            "replica count (default 10)")
    group.add_argument("--link-latency-us", type=float, default=50.0,
                       help="latency of one all-reduce message between machines (default 50)")
    group.add_argument("--advice-json", default="advice.json",
                       help="where to write the report (default advice.json)")


USAGE = ("python -m fairseq_hybrid.tools.advise DATA --arch hybrid_lstm --max-tokens N "
         "[--hybrid-devices cpu,cpu] [fairseq-train's options]; --help lists them")


def refuse(message: str) -> None:
    """argparse's errors (a usage text, then the message) as the one line."""
    raise HybridConfigError(f"{message} (usage: {USAGE})")


def parse(argv: Sequence[str]) -> argparse.Namespace:

    # --arch first: fairseq's parser fails on a missing one with a bare RuntimeError
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--arch", "-a")
    arch = first.parse_known_args(list(argv))[0].arch
    if "-h" not in argv and "--help" not in argv and (arch is None or "hybrid_lstm" not in arch):
        given = "is missing" if arch is None else f"{arch!r} is not allowed"
        raise HybridConfigError(f"--arch {given}: the advisor needs hybrid_lstm or one of its "
                                f"presets (usage: {USAGE})")
    parser = options.get_training_parser()
    add_advisor_args(parser)
    parser.error = refuse
    args = options.parse_args_and_arch(parser, list(argv))
    # the model's options are absent unless given (fairseq's model group suppresses
    # defaults): --hybrid-devices' default is the default device
    args.hybrid_devices = getattr(args, "hybrid_devices", None)
    if not args.link_gbps > 0:
        raise HybridConfigError(f"--link-gbps {args.link_gbps!r} is not allowed: a number > 0")
    if args.max_tokens is None:
        raise HybridConfigError("--max-tokens is required: the batch size to start the sweep from")
    return args


def load_task_and_model(args: argparse.Namespace) -> Tuple[Any, Any, Any]:

    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    torch.manual_seed(cfg.common.seed)
    model = task.build_model(cfg.model).float().train()
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def representative_batch(dataset: Any, max_tokens: int, args: argparse.Namespace) -> dict:
    """The batch of median target tokens among the training split's batches at
    ``max_tokens`` (fairseq's own batching, without the pairs fairseq-train skips: longer
    than the positions or ``max_tokens``), collated."""
    indices = dataset.ordered_indices()
    indices, _ = dataset.filter_indices_by_size(indices, utils.resolve_max_positions(
        (args.max_source_positions, args.max_target_positions), max_tokens))
    batches = dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=args.batch_size,
                                    required_batch_size_multiple=args.required_batch_size_multiple)
    tokens = [int(np.sum(dataset.tgt_sizes[b])) for b in batches]
    median_batch = batches[int(np.argsort(tokens)[len(tokens) // 2])]
    return dataset.collater([dataset[int(i)] for i in median_batch])


def model_size(model: Any, vocab: int) -> ModelSize:
    return ModelSize(model.encoder.num_layers, model.encoder.hidden_size,
                     model.encoder.embed_tokens.embedding_dim, vocab,
                     decoder_hidden=model.decoder.hidden_size)


def measure_batch(model: Any, task: Any, sample: dict, device: torch.device, threads: int) -> StageTimes:
    """Stage times of ``sample`` on ``device`` (cells at two chunk counts,
    extended to every candidate by the fit)."""
    src, tgt = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
    batch = BatchSize(src.size(0), src.size(1), tgt.size(1))
    layers = model.encoder.num_layers
    stage = measure_model_stage_times(
        model, task.target_dictionary, sample, model_size(model, len(task.target_dictionary)), batch,
        probe_chunks(batch.source_len, batch.target_len), list(range(1, layers + 1)), repeats=1,
        threads=threads, device=str(device))
    return with_fitted_cells(stage)


def time_real_steps(model: Any, criterion: Any, sample: dict, placement: PlacementOptions, chunks: int,
                    balance: Optional[Tuple[int, ...]], steps: int = CHECK_STEPS) -> float:
    """Median seconds of ``steps`` real training steps (forward, backward, clip, Adam)
    through the engine on ``placement``'s devices, after one warm-up step."""
    model.runtime.configure(placement, chunks=chunks, balance=balance)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1e-9)
    samples: List[float] = []
    try:
        for index in range(steps + 1):
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            for device in model.runtime.engine.plan.devices:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            if index > 0:
                samples.append(time.perf_counter() - start)
    finally:
        model.runtime.close()
    return statistics.median(samples)


def compare_schemes(model: Any, task: Any, dataset: Any, args: argparse.Namespace,
                    devices: Devices, threads: int, link: Link, schedule: str, given: int,
                    given_tokens: int, stage: StageTimes, hybrid: Prediction) -> Dict[str, Any]:
    """Every way to train this model on the plan's N devices at the same global batch
    (``planning.compare``: hybrid, fairseq DDP with and without a sharded optimizer, hybrid
    groups inside DDP), each from stage times measured here at its per-process batch
    (--max-tokens over the processes), and the fastest with the command that runs it.
    The hybrid row is the recommended configuration (its balance and K)."""
    n, full = len(devices), stage.batch
    measured: Dict[int, StageTimes] = {}

    def stage_for(batch: BatchSize, chunks: Sequence[int], counts: Sequence[int]) -> StageTimes:
        if batch.sentences >= full.sentences:
            return stage
        share = max(1, round(given * batch.sentences / full.sentences))
        if share not in measured:
            measured[share] = measure_batch(model, task, representative_batch(dataset, share, args),
                                            devices[0], threads)
        return measured[share]

    rows = compare(stage_for, model.encoder.num_layers, full, [n], sorted(stage.cells), link, schedule)
    base_tokens_per_s = given_tokens / predict(stage, 1, 1, schedule, link).step_s
    table = []
    for name in SAME_BATCH:
        for row in rows[name]:
            if row.devices != n or (name == "ddp_sharded" and not SHARDED_OPTIMIZER):
                continue
            tokens_per_s = hybrid.tokens_per_s if name == "hybrid" else row.speedup * base_tokens_per_s
            table.append({"scheme": name, "processes": row.replicas, "devices_per_process": row.stages,
                          "chunks": hybrid.chunks if name == "hybrid" else row.chunks,
                          "max_tokens_per_process": max(1, given // row.replicas),
                          "predicted_tokens_per_s": round(tokens_per_s, 1)})
    # within the tie tolerance of the fastest, the simpler (earlier) scheme
    winner = simplest_within(table, lambda item: 1 / item["predicted_tokens_per_s"])
    return {"devices": n, "rows": table, "fastest": winner["scheme"],
            "note": "CPU devices: the all-reduce is free in the model (shared memory)"
                    if schedule == "cycle" else f"link {link.bandwidth_bytes_per_s / 1e9:g} GB/s"}


def advise(args: argparse.Namespace, progress=lambda message: None) -> Dict[str, Any]:
    started = time.perf_counter()
    placement = placement_options(args)
    placed = placement.all_devices()
    devices = args.hybrid_devices or str(placed[0])
    schedule = "dataflow" if any(d.type == "cuda" for d in placed) else "cycle"
    link = GPU_LINK if schedule == "dataflow" else Link()
    threads = cpu_threads_per_worker(sum(1 for d in placed if d.type == "cpu"))
    task, model, criterion = load_task_and_model(args)
    dataset = task.dataset(args.train_subset)
    longest = int(max(np.max(dataset.src_sizes), np.max(dataset.tgt_sizes)))
    given = args.max_tokens
    sweep = sorted({int(given * f) for f in SWEEP if int(given * f) >= longest} | {given})
    progress(f"loaded {len(dataset)} training pairs; --max-tokens sweep {sweep}")

    stages: Dict[int, StageTimes] = {}
    samples: Dict[int, dict] = {}
    for max_tokens in sweep:
        samples[max_tokens] = representative_batch(dataset, max_tokens, args)
        stages[max_tokens] = measure_batch(model, task, samples[max_tokens], placed[0], threads)
        progress(f"measured --max-tokens {max_tokens}")
    n = len(placed)

    def tokens_of(max_tokens: int) -> int:
        return int(samples[max_tokens]["ntokens"])

    at_given = {m: best_balance(stages[m], n, schedule, link, tokens_of(m))[0] for m in sweep}
    throughput = {m: p.tokens_per_s for m, p in at_given.items()}
    knee = batch_knee(throughput)
    stage = stages[given]
    balanced, is_even = best_balance(stage, n, schedule, link, tokens_of(given))
    capacity = 0
    if placed[0].type == "cuda":
        capacity = torch.cuda.get_device_properties(placed[0]).total_memory
    fits = memory_limit({m: s.peak_bytes for m, s in stages.items()}, capacity)
    by_devices = {count: best_chunks(stage, count, schedule, link, tokens=tokens_of(given))
                  for count in range(1, model.encoder.num_layers + 1)}
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    replicas = replica_knee(balanced, grad_bytes, args.link_gbps, args.link_latency_us * 1e-6,
                            limit=REPLICA_LIMIT, overlapped=n == 1)

    schemes = compare_schemes(model, task, dataset, args, placed, threads, link, schedule, given,
                              tokens_of(given), stage, balanced) if n > 1 else None
    progress(f"timing {CHECK_STEPS} real steps of the recommendation on {devices}")
    measured_step = time_real_steps(
        model, criterion, samples[given], placement, balanced.chunks,
        None if is_even else parse_balance(balanced.balance, n, model.encoder.num_layers))
    report: Dict[str, Any] = {
        "what": "python -m fairseq_hybrid.tools.advise: recommendations of the performance model "
                "from stage times measured on this machine",
        "devices": devices, "schedule": schedule, "measured_on": str(placed[0]),
        "threads_per_cpu_device": threads, "torch": torch.__version__,
        "given_max_tokens": given, "link_gbps": args.link_gbps,
        "link_latency_us": args.link_latency_us, "gradient_bytes": grad_bytes,
        "sweep": [{"max_tokens": m, "batch_sentences": stages[m].batch.sentences,
                   "batch_target_tokens": tokens_of(m), "chunks": at_given[m].chunks,
                   "predicted_step_s": round(at_given[m].step_s, 5),
                   "predicted_tokens_per_s": round(throughput[m], 1),
                   "peak_bytes": stages[m].peak_bytes} for m in sweep],
        "by_devices": [{"devices": c, "chunks": p.chunks, "predicted_step_s": round(p.step_s, 5),
                        "predicted_tokens_per_s": round(p.tokens_per_s, 1)}
                       for c, p in by_devices.items()],
        "check": {"devices": devices, "chunks": balanced.chunks, "max_tokens": given,
                  "predicted_step_s": round(balanced.step_s, 5),
                  "measured_step_s": round(measured_step, 5),
                  "error": round((balanced.step_s - measured_step) / measured_step, 4)},
        "schemes": schemes,
    }
    report["recommendations"] = recommendation_rows(
        report, balanced, is_even, knee, throughput, fits, capacity, device_knee(by_devices),
        by_devices, replicas, n)
    report["command"] = command_line(args.advisor_argv, report["recommendations"])
    if schemes and schemes["fastest"] != "hybrid":
        winner = next(row for row in schemes["rows"] if row["scheme"] == schemes["fastest"])
        report["command"] = scheme_command(winner, args.advisor_argv, placed, os.cpu_count() or 1)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    report["load_average"] = list(os.getloadavg())
    report["cores"] = os.cpu_count()
    return report


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr)
    args = parse(argv)
    args.advisor_argv = argv
    report = advise(args, progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
    print(format_report(report))
    write_json_atomic(report, args.advice_json)
    print(f"wrote {args.advice_json}")


if __name__ == "__main__":
    main()
