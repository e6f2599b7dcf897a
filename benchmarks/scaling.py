"""The scaling benchmark: every configuration (a)-(f) below at one total batch,
with each ratio's denominator named.

    python -m benchmarks.scaling --preset small --devices cpu,cpu --quick

(a) fairseq ``lstm`` (input feeding), 1 device   (b) ``hybrid_lstm``, 1 device
(c) data parallel only: fairseq's DDP over N processes, the whole model in each
(d) model parallel only: the layer pipeline over N devices, head unsplit on one device
(e) hybrid: pipeline + head split by sentences      (f) HybridNMT-IF (``--input-feeding``)
On CPU devices also (b1): ``hybrid_lstm`` on 1 device with 1 thread (the per-worker budget).

Each configuration trains with ``fairseq-train`` from scratch; the first log interval is
warm-up, the rest are timed (fairseq's own wps); configurations run interleaved, repeat by
repeat, and the medians are reported. Also: model FLOP utilisation against a matrix
product measured in the same run, peak memory, the head's memory chunked vs unchunked,
beam-search speed of (a) and (b)'s checkpoints, and (when ``benchmarks.pipeline_model``
is present) the pipeline performance model. Writes ``<out>/<name>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import chart
from .data import length_stats, sample_data, synthetic_data
from .fairseq_runs import MALLOC_CACHE_ENV, ROOT, BenchmarkError, OutOfMemory, TrainConfig, run_generation, run_training
from .flops import ModelShape, matmul_flops_per_second, training_flops_per_target_token
from .head_memory import measure as measure_head_memory
from fairseq_hybrid.jsonio import write_json_atomic
from fairseq_hybrid.model.presets import preset_options, preset_values
from fairseq_hybrid.planning.sizes import BENCHMARK_PRESETS


@dataclass(frozen=True)
class Preset:
    hybrid_arch: str
    lstm_arch: str
    model_options: str  # sizes shared by both architectures
    shape: ModelShape  # vocab filled in from the data
    vocab: int
    data: str  # "sample" or "synthetic"
    max_tokens: int
    head_memory_dim: int


def setup(name: str, lstm_arch: str, lstm_needs_sizes: bool, data: str) -> Preset:
    """The scaling runs of benchmark preset ``name`` (``planning.sizes.BENCHMARK_PRESETS``:
    the architecture and vocabulary; the sizes from the architecture's preset table)."""
    spec = BENCHMARK_PRESETS[name]
    values = preset_values(spec.arch)
    shape = ModelShape(values["encoder_layers"], values["encoder_embed_dim"], values["encoder_hidden_size"],
                       values["decoder_embed_dim"], values["decoder_hidden_size"],
                       values["decoder_out_embed_dim"], 0, False)
    sizes = " ".join(preset_options(spec.arch)) if lstm_needs_sizes else ""
    return Preset(spec.arch, lstm_arch, sizes, shape, spec.vocab, data, 4000, shape.out_embed)


# fairseq's lstm has other default sizes (given explicitly); lstm_luong_wmt_en_de has these
PRESETS = {
    "small": setup("small", "lstm", lstm_needs_sizes=True, data="sample"),
    "wmt": setup("wmt", "lstm_luong_wmt_en_de", lstm_needs_sizes=False, data="synthetic"),
}
QUICK = {"log_interval": 4, "intervals": 2, "repeats": 3, "generate_subset": "valid"}
FULL = {"log_interval": 10, "intervals": 5, "repeats": 3, "generate_subset": "test"}
GENERATE_LENGTH = 20


def parse_devices(spec: str) -> List[str]:
    devices = [d.strip() for d in spec.split(",")]
    for device in devices:
        if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise BenchmarkError(f"--devices {spec!r}: {device!r} is not cpu or cuda:N")
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        raise BenchmarkError(f"--devices {spec!r} names CUDA devices but this machine has none")
    return devices


def configurations(preset: Preset, devices: List[str]) -> List[TrainConfig]:
    n = len(devices)
    threads = os.cpu_count() or 1
    on_cpu = devices[0] == "cpu"
    one = "--hybrid-devices cpu" if on_cpu else "--hybrid-devices cuda:0"
    one_env = {} if on_cpu else {"CUDA_VISIBLE_DEVICES": devices[0][5:]}
    many = f"--hybrid-devices {','.join(devices)}"
    hybrid = f"--arch {preset.hybrid_arch} {preset.model_options}"
    configs = [
        TrainConfig("a", "fairseq lstm (input feeding), 1 device",
                    f"--arch {preset.lstm_arch} {preset.model_options}", threads, env=one_env),
        TrainConfig("b", "hybrid_lstm, 1 device", f"{hybrid} {one}", threads, env=one_env),
    ]
    if on_cpu:
        configs.append(TrainConfig("b1", "hybrid_lstm, 1 device, 1 thread", f"{hybrid} {one}", 1))
    if n > 1:
        configs += [
            TrainConfig("c", f"data parallel only, {n} processes", f"{hybrid} {one}",
                        max(1, threads // n), processes=n, max_tokens=preset.max_tokens // n,
                        env={} if on_cpu else {"CUDA_VISIBLE_DEVICES": ",".join(d[5:] for d in devices)}),
            TrainConfig("d", f"model parallel only, {n} devices", f"{hybrid} {many} --hybrid-head-on-master", threads),
            TrainConfig("e", f"hybrid, {n} devices", f"{hybrid} {many}", threads),
            TrainConfig("f", f"HybridNMT-IF, {n} devices", f"{hybrid} {many} --input-feeding", threads),
        ]
    else:
        configs.append(TrainConfig("f", "HybridNMT-IF, 1 device", f"{hybrid} {one} --input-feeding",
                                   threads, env=one_env))
    return [replace(c, max_tokens=c.max_tokens if c.processes > 1 else preset.max_tokens) for c in configs]


RATIOS = [
    ("b/a", "b", "a", "hybrid_lstm / fairseq lstm (IF), both 1 device"),
    ("e/b", "e", "b", "parallel speedup: hybrid on N devices / hybrid_lstm on 1 device"),
    ("e/a", "e", "a", "the paper's kind: hybrid on N devices / fairseq lstm (IF) on 1 device"),
    ("e/b1", "e", "b1", "hybrid on N CPU devices / hybrid_lstm on 1 device with 1 thread"),
    ("e/c", "e", "c", "hybrid / data parallel only"),
    ("e/d", "e", "d", "hybrid / model parallel only"),
    ("f/a", "f", "a", "HybridNMT-IF / fairseq lstm (IF)"),
    ("f/e", "f", "e", "HybridNMT-IF / hybrid (the cost of input feeding)"),
]


def shape_for(preset: Preset, config: TrainConfig, vocab: int) -> ModelShape:
    feeding = config.key in ("a", "f")
    return replace(preset.shape, vocab=vocab, input_feeding=feeding)


def dictionary_size(data: Path) -> int:
    target_dict = sorted(data.glob("dict.*.txt"))[-1]
    with open(target_dict) as handle:
        return sum(1 for _ in handle) + 4  # fairseq adds <s> <pad> </s> <unk>


def peak_flops(devices: List[str], config: TrainConfig, matmul: Dict[str, float]) -> float:
    if devices[0] == "cpu":
        return matmul[f"cpu_{config.threads * config.processes}_threads"]
    used = devices[:1] if config.key in ("a", "b") else devices
    return sum(matmul[d] for d in used)


def median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> Dict[str, object]:
    preset = PRESETS[args.preset]
    devices = parse_devices(args.devices)
    schedule = dict(QUICK if args.quick else FULL)
    if args.repeats:
        schedule["repeats"] = args.repeats
    work = Path(args.work)
    started = time.time()
    print(f"preparing data ({preset.data}, vocab {preset.vocab})", flush=True)
    if args.data:
        data = Path(args.data)
    elif preset.data == "sample":
        data = sample_data(preset.vocab, work / f"sample-v{preset.vocab}")
    else:
        data = synthetic_data(preset.vocab, 20000 if args.quick else 100000, 15, 40,
                              work / f"synthetic-v{preset.vocab}")
    stats = length_stats(data)
    vocab = dictionary_size(data)
    configs = configurations(preset, devices)
    if args.only:
        configs = [c for c in configs if c.key in args.only.split(",")]

    threads = os.cpu_count() or 1
    matmul: Dict[str, float] = {}
    process_env = dict(MALLOC_CACHE_ENV) if args.malloc_cache else {}

    def measure_matmul() -> None:
        if devices[0] == "cpu":
            for count in sorted({1, threads // max(1, len(devices)), threads}):
                matmul.setdefault(f"cpu_{count}_threads_runs", []).append(
                    matmul_flops_per_second(count, args.matmul_size))
        else:
            for device in dict.fromkeys(devices):
                matmul.setdefault(f"{device}_runs", []).append(
                    matmul_flops_per_second(1, args.matmul_size, device=torch.device(device)))

    measure_matmul()
    updates = schedule["log_interval"] * (1 + schedule["intervals"])
    runs: Dict[str, List[Dict[str, object]]] = {c.key: [] for c in configs}
    checkpoints: Dict[str, str] = {}
    ckpt_root = Path(tempfile.mkdtemp(prefix="ckpt-", dir=work))
    if "train" not in args.skip:
        for repeat in range(schedule["repeats"]):
            for config in configs:
                save_dir = None
                if repeat == schedule["repeats"] - 1 and config.key in ("a", "b"):
                    save_dir = str(ckpt_root / config.key)
                    checkpoints[config.key] = f"{save_dir}/checkpoint_last.pt"
                result = run_training(str(data), config, updates, schedule["log_interval"], save_dir,
                                      optimizer=args.optimizer, env=process_env)
                runs[config.key].append(asdict(result))
                print(f"repeat {repeat + 1}/{schedule['repeats']} ({config.key}) {config.name}: "
                      f"{result.target_wps:,.0f} target tokens/s", flush=True)
            measure_matmul()
    for key in list(matmul):
        if key.endswith("_runs"):
            matmul[key[: -len("_runs")]] = median(matmul[key])

    training: Dict[str, Dict[str, object]] = {}
    for config in configs:
        if not runs[config.key]:
            continue
        wps = median([r["target_wps"] for r in runs[config.key]])
        flops = training_flops_per_target_token(
            shape_for(preset, config, vocab), stats.source_per_target, stats.attended_source_length)
        training[config.key] = {
            "name": config.name, "options": config.options, "threads": config.threads,
            "processes": config.processes, "max_tokens_per_process": config.max_tokens,
            "target_tokens_per_s": wps,
            "source_tokens_per_s": wps * stats.source_per_target,
            "sentences_per_s": median([r["sentences_per_s"] for r in runs[config.key]]),
            "target_tokens_per_update": median([r["target_tokens_per_update"] for r in runs[config.key]]),
            "model_flops_per_target_token": flops,
            "mfu": flops * wps / peak_flops(devices, config, matmul),
            "peak_rss_bytes_per_process": max((r["peak_rss_bytes"] for r in runs[config.key]), key=sum),
            "peak_cuda_bytes": runs[config.key][-1]["peak_cuda_bytes"],
            "runs": runs[config.key],
        }
    ratios = {
        label: {"value": training[num]["target_tokens_per_s"] / training[den]["target_tokens_per_s"],
                "meaning": meaning}
        for label, num, den, meaning in RATIOS if num in training and den in training
    }

    largest: Dict[str, object] = {}
    if args.largest_batch:
        largest = largest_batches(data, configs, schedule, args.optimizer, process_env)

    generation: Dict[str, object] = {}
    if "generation" not in args.skip and {"a", "b"} <= checkpoints.keys():
        # barely trained models stop at different lengths; --min-len = --max-len-b makes
        # every hypothesis exactly GENERATE_LENGTH tokens, so both do the same work
        gen_options = (f"--max-len-a 0 --max-len-b {GENERATE_LENGTH} --min-len {GENERATE_LENGTH} "
                       f"--batch-size 64")
        if devices[0] == "cpu":
            gen_options += " --cpu"
        gen_runs: Dict[str, List[Dict[str, float]]] = {"a": [], "b": []}
        for repeat in range(schedule["repeats"]):
            for key in ("a", "b"):
                result = run_generation(str(data), checkpoints[key], 5, schedule["generate_subset"],
                                        gen_options, threads, env=process_env)
                gen_runs[key].append(result)
                print(f"repeat {repeat + 1} generate ({key}): {result['tokens_per_s']:,.0f} tokens/s",
                      flush=True)
        generation = {
            "beam": 5, "subset": schedule["generate_subset"], "options": gen_options,
            "checkpoints": f"(a) and (b) after {updates} training updates",
            "length": f"every hypothesis {GENERATE_LENGTH} tokens (+ EOS)",
            "median_tokens_per_s": {k: median([r["tokens_per_s"] for r in v]) for k, v in gen_runs.items()},
            "median_sentences_per_s": {k: median([r["sentences_per_s"] for r in v]) for k, v in gen_runs.items()},
            "runs": gen_runs,
        }
        generation["ratio_b_over_a_tokens_per_s"] = (
            generation["median_tokens_per_s"]["b"] / generation["median_tokens_per_s"]["a"])

    memory: Dict[str, object] = {}
    if "memory" not in args.skip:
        device = devices[0]
        unchunked = measure_head_memory(32000, 8000, preset.head_memory_dim, 0, device)
        chunked = measure_head_memory(32000, 8000, preset.head_memory_dim, args.chunk_tokens, device)
        memory = {"unchunked": unchunked, "chunked": chunked,
                  "ratio_chunked_over_unchunked": chunked["peak_bytes"] / unchunked["peak_bytes"]}
        print(f"head memory at vocab 32K, 8K tokens: unchunked {unchunked['peak_bytes'] / 2**20:,.0f} MiB, "
              f"chunked ({args.chunk_tokens} tokens) {chunked['peak_bytes'] / 2**20:,.0f} MiB", flush=True)

    model: Dict[str, object] = {}
    if "model" not in args.skip:
        try:
            from . import pipeline_model
        except ImportError:
            model = {"skipped": "benchmarks.pipeline_model is not available"}
        else:
            model = pipeline_model.run(args.preset, quick=args.quick, validate=devices[0] == "cpu")

    report: Dict[str, object] = {
        "name": args.name, "command": " ".join(["python -m benchmarks.scaling", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "torch_threads": torch.get_num_threads(),
                    "cuda": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]},
        "preset": args.preset, "devices": devices, "data": str(data), "vocab": vocab,
        "lengths": asdict(stats), "optimizer": args.optimizer, "process_env": process_env,
        "schedule": {**schedule, "updates_per_run": updates},
        "matmul_size": args.matmul_size,
        "matmul_flops_per_s": {k: v for k, v in matmul.items() if not k.endswith("_runs")},
        "matmul_runs": {k: v for k, v in matmul.items() if k.endswith("_runs")},
        "training": training, "ratios": ratios, "largest_batch": largest, "generation": generation,
        "head_memory": memory, "pipeline_model": model,
        "seconds": time.time() - started,
    }
    if args.preset == "small" and devices == ["cpu", "cpu"]:
        report["targets"] = targets(report)
    return report


def largest_batches(data: Path, configs: List[TrainConfig], schedule: Dict[str, int],
                    optimizer: str, env: Dict[str, str]) -> Dict[str, object]:
    """GPU only: each configuration at the largest --max-tokens (doubling from its own)
    that trains without running out of memory, one run each."""
    out: Dict[str, object] = {}
    updates = schedule["log_interval"] * (1 + schedule["intervals"])
    for config in configs:
        best, tokens = None, config.max_tokens
        while True:
            try:
                result = run_training(str(data), replace(config, max_tokens=tokens), updates,
                                      schedule["log_interval"], optimizer=optimizer, env=env)
            except OutOfMemory:
                break
            best = {"max_tokens_per_process": tokens, "target_tokens_per_s": result.target_wps,
                    "peak_cuda_bytes": result.peak_cuda_bytes}
            print(f"largest batch ({config.key}): --max-tokens {tokens} fits, "
                  f"{result.target_wps:,.0f} target tokens/s", flush=True)
            tokens *= 2
        out[config.key] = best
    return out


def targets(report: Dict[str, object]) -> Dict[str, Dict[str, object]]:
    training, ratios = report["training"], report["ratios"]
    checks = {
        "hybrid_lstm / fairseq lstm (b/a) >= 1.35": (ratios.get("b/a", {}).get("value"), 1.35, ">="),
        "model FLOP utilisation of (b) >= 0.80": (training.get("b", {}).get("mfu"), 0.80, ">="),
        "cpu,cpu hybrid / cpu 1 thread (e/b1) >= 1.7": (ratios.get("e/b1", {}).get("value"), 1.7, ">="),
        "cpu,cpu hybrid / cpu 2 threads (e/b) >= 1.0": (ratios.get("e/b", {}).get("value"), 1.0, ">="),
        "head peak memory chunked / unchunked <= 0.3":
            (report["head_memory"].get("ratio_chunked_over_unchunked"), 0.3, "<="),
        "generation tokens/s hybrid / lstm >= 1.0":
            (report["generation"].get("ratio_b_over_a_tokens_per_s"), 1.0, ">="),
    }
    out = {}
    for label, (value, bound, op) in checks.items():
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        out[label] = {"value": value, "met": met}
    return out


def summary(report: Dict[str, object]) -> str:
    lines = ["| config | target tok/s | source tok/s | MFU | peak RSS/process |", "|---|---:|---:|---:|---:|"]
    for key, row in report["training"].items():
        rss = "+".join(f"{b / 2**30:.2f}" for b in row["peak_rss_bytes_per_process"])
        lines.append(f"| ({key}) {row['name']} | {row['target_tokens_per_s']:,.0f} | "
                     f"{row['source_tokens_per_s']:,.0f} | {row['mfu']:.2f} | {rss} GiB |")
    lines.append("")
    for label, ratio in report["ratios"].items():
        lines.append(f"- {label} = {ratio['value']:.2f}x — {ratio['meaning']}")
    if report["generation"]:
        gen = report["generation"]
        lines.append(f"- generation, beam 5: (a) {gen['median_tokens_per_s']['a']:,.0f} tokens/s, "
                     f"(b) {gen['median_tokens_per_s']['b']:,.0f} tokens/s = "
                     f"{gen['ratio_b_over_a_tokens_per_s']:.2f}x")
    if report["head_memory"]:
        mem = report["head_memory"]
        lines.append(f"- head at vocab 32K, 8K tokens: chunked/unchunked peak = "
                     f"{mem['ratio_chunked_over_unchunked']:.2f}")
    for label, target in report.get("targets", {}).items():
        if target["value"] is None:
            lines.append(f"- target {label}: not measured in this run")
        else:
            lines.append(f"- target {label}: {target['value']:.3f} ({'met' if target['met'] else 'MISSED'})")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--devices", default="cpu,cpu", help="e.g. cpu,cpu or cuda:0,cuda:1")
    parser.add_argument("--quick", action="store_true",
                        help="short timed runs (5-update intervals), the validation split for generation")
    parser.add_argument("--repeats", type=int, default=0, help="override the preset's repeats (>= 1)")
    parser.add_argument("--data", help="use this fairseq-preprocess directory instead of the preset's data")
    parser.add_argument("--only", help="comma-separated configuration keys, e.g. a,b,e")
    parser.add_argument("--skip", default="", help="comma-separated: train,generation,memory,model")
    parser.add_argument("--optimizer", default="torch_adam", choices=["torch_adam", "adam"],
                        help="for every configuration alike (torch_adam: the plugin's fused Adam)")
    parser.add_argument("--largest-batch", action="store_true",
                        help="GPU only: also train each configuration at the largest --max-tokens that fits")
    parser.add_argument("--malloc-cache", action="store_true",
                        help="every process keeps freed memory (glibc MALLOC_MMAP_MAX_=0) instead of "
                        "page-faulting large tensors in each step")
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="head chunk for the memory comparison")
    parser.add_argument("--matmul-size", type=int, default=2048,
                        help="side of the square matrix product whose FLOP/s is the MFU's peak (a "
                        "smaller one is faster to measure and has a lower peak: only for checking the run)")
    parser.add_argument("--work", default=str(ROOT / "work/bench"))
    parser.add_argument("--out", default=str(ROOT / "results/bench"))
    parser.add_argument("--name", help="report name (default scaling-<preset>-<devices>)")
    args = parser.parse_args(argv)
    if args.repeats < 0:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    unknown = set(filter(None, args.skip.split(","))) - {"train", "generation", "memory", "model"}
    if unknown:
        parser.error(f"--skip {args.skip!r}: unknown part(s) {sorted(unknown)}; allowed: train,generation,memory,model")
    keys = {"a", "b", "b1", "c", "d", "e", "f"}
    unknown = set(filter(None, (args.only or "").split(","))) - keys
    if unknown:
        parser.error(f"--only {args.only!r}: unknown configuration(s) {sorted(unknown)}; "
                     f"allowed: {','.join(sorted(keys))}")
    for option, value in (("--chunk-tokens", args.chunk_tokens), ("--matmul-size", args.matmul_size)):
        if value < 1:
            parser.error(f"{option} {value}: must be >= 1")
    devices = parse_devices(args.devices)
    if args.largest_batch and devices[0] == "cpu":
        parser.error("--largest-batch needs CUDA devices (on the CPU the batch is bounded by time, not memory)")
    args.name = args.name or f"scaling-{args.preset}-{args.devices.replace(',', '-').replace(':', '')}"
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = run(args)
    out = Path(args.out)
    write_json_atomic(report, out / f"{args.name}.json")
    if report["training"]:
        chart.draw(report, out / f"{args.name}.png")
    print(summary(report))
    print(f"wrote {out / (args.name + '.json')}" + (f" and {args.name}.png" if report["training"] else ""))


if __name__ == "__main__":
    main()
