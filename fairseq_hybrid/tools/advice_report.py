"""The advisor's output: the recommendation rows (what to set, the value, its predicted
tokens/s, the model's measured error where known, and why), the printed table, and the
``fairseq-train`` command line with the recommendations filled in."""
from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..planning.compare import SHARDED_OPTIMIZER
from ..planning.recommend import GAIN_THRESHOLD, MEMORY_HEADROOM, Prediction, ReplicaAdvice

ADVISOR_OPTIONS = ("--link-gbps", "--link-latency-us", "--advice-json")
# set by each scheme's command itself
PLACEMENT_OPTIONS = ("--hybrid-devices", "--hybrid-balance", "--distributed-world-size",
                     "--distributed-rank", "--distributed-init-method", "--distributed-backend")
PORT = 29500  # the first process's port for the others to meet at
REPLICA_LIMIT = 256  # replica counts tried
REPLACED_OPTIONS = ("--pipeline-chunks", "--hybrid-balance", "--max-tokens")


def recommendation_rows(
    report: Dict[str, Any], chosen: Prediction, is_even: bool, knee: int,
    throughput: Dict[int, float], fits: Optional[int], capacity: int, device_knee: int,
    by_devices: Dict[int, Prediction], replicas: ReplicaAdvice, devices: int,
) -> List[Dict[str, Any]]:
    check = report["check"]
    error = f"{check['error']:+.1%} (predicted {check['predicted_step_s']:.3f} s/step, " \
            f"measured {check['measured_step_s']:.3f})"
    best_m = max(throughput, key=throughput.get)
    rows = [
        {"setting": "--pipeline-chunks", "value": str(chosen.chunks),
         "tokens_per_s": chosen.tokens_per_s, "error": error,
         "why": f"the fastest K the model predicts for {devices} device(s) "
                f"(K = {chosen.chunks}: {chosen.step_s:.3f} s per step)"},
        {"setting": "--hybrid-balance", "value": chosen.balance if not is_even else "even (leave it out)",
         "option_value": None if is_even else chosen.balance,
         "tokens_per_s": chosen.tokens_per_s, "error": error,
         "why": "layers per device: every contiguous split predicted; the even one unless "
                "another is more than 2% faster"},
        {"setting": "--max-tokens (throughput)", "value": str(knee), "tokens_per_s": throughput[knee],
         "error": "-",
         "why": f"the smallest batch of the sweep within {GAIN_THRESHOLD:.0%} of the best predicted "
                f"throughput ({throughput[best_m]:,.0f} tok/s at {best_m}); larger batches mean "
                "fewer updates per epoch"},
    ]
    if capacity:
        rows.append({"setting": "--max-tokens (memory)", "value": str(fits) if fits else "-",
                     "tokens_per_s": None, "error": "-",
                     "why": f"peak GPU memory measured at each batch of the sweep, extrapolated to "
                            f"{1 - MEMORY_HEADROOM:.0%} of {capacity / 2**30:.1f} GiB (one device "
                            "holding the whole model: an upper bound for every device)"})
    else:
        rows.append({"setting": "--max-tokens (memory)", "value": "not limited here",
                     "tokens_per_s": None, "error": "-",
                     "why": "CPU devices use host memory (measured on GPUs only)"})
    counts = sorted(by_devices)
    following = by_devices.get(device_knee + 1)
    gain = (f"{device_knee + 1} would gain {following.tokens_per_s / by_devices[device_knee].tokens_per_s - 1:+.1%}"
            if following else f"at most {counts[-1]} (one device per layer)")
    rows.append({"setting": "devices (--hybrid-devices)", "value": str(device_knee),
                 "tokens_per_s": by_devices[device_knee].tokens_per_s, "error": "-",
                 "why": f"beyond it the predicted gain is under {GAIN_THRESHOLD:.0%}: {gain}"
                        + (" (CPU devices: independent cores assumed)"
                           if report["schedule"] == "cycle" else "")})
    at_limit = replicas.replicas >= REPLICA_LIMIT
    rows.append({"setting": "data-parallel replicas (machines)",
                 "value": f"{replicas.replicas}+" if at_limit else str(replicas.replicas),
                 "tokens_per_s": replicas.tokens_per_s, "error": "-",
                 "why": f"all-reduce of {report['gradient_bytes'] / 2**20:.1f} MiB of gradients at "
                        f"{report['link_gbps']:g} Gbit/s: {replicas.allreduce_s:.3f} s <= backward "
                        f"{replicas.backward_s:.3f} s; "
                        + ("it hides at every count tried " if at_limit else
                           f"one more replica: {replicas.next_allreduce_s:.3f} s ")
                        + ("(tok/s: all-reduce during backward, as torch DDP runs it with one device "
                           "per process)" if replicas.overlapped else
                           "(tok/s: all-reduce after backward, as legacy_ddp runs it with several "
                           "devices per process)")})
    schemes = report.get("schemes")
    if schemes:
        by_name = {row["scheme"]: row for row in schemes["rows"]}
        winner, hybrid = by_name[schemes["fastest"]], by_name["hybrid"]
        others = ", ".join(f"{scheme_title(row)} {row['predicted_tokens_per_s']:,.0f}"
                           for row in schemes["rows"] if row is not winner)
        rows.append({
            "setting": "parallelism", "value": scheme_title(winner),
            "tokens_per_s": winner["predicted_tokens_per_s"], "error": "-",
            "why": f"the fastest way predicted to train the same global batch on "
                   f"{schemes['devices']} devices ({others} tok/s; {schemes['note']})"
                   + ("" if winner is hybrid else "; the command below runs it")})
    recommended = knee if fits is None else min(knee, fits)
    rows.append({"setting": "--max-tokens (recommended)", "value": str(recommended),
                 "option_value": str(recommended),
                 "tokens_per_s": throughput.get(recommended), "error": "-",
                 "why": "the throughput knee, within the memory limit"})
    rows[0]["option_value"] = rows[0]["value"]
    return rows


def without_options(argv: Sequence[str], names: Sequence[str]) -> List[str]:
    """``argv`` without the options ``names`` (``--name value`` or ``--name=value``)."""
    kept: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in names:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def command_line(argv: Sequence[str], rows: Sequence[Dict[str, Any]]) -> str:
    """``fairseq-train`` with the advisor's options removed and the recommendations set."""
    kept = without_options(argv, ADVISOR_OPTIONS + REPLACED_OPTIONS)
    by_setting = {row["setting"]: row for row in rows}
    for option in REPLACED_OPTIONS:
        row = by_setting.get(option) or by_setting.get(option + " (recommended)", {})
        value = row.get("option_value")
        if value is not None:
            kept += [option, value]
    return "fairseq-train " + shlex.join(kept)


def scheme_command(row: Dict[str, Any], argv: Sequence[str], devices: Sequence[torch.device],
                   cores: int) -> str:
    """The command that trains as ``row`` (a ``schemes`` row of the report: DDP or hybrid
    groups) on ``devices``: fairseq-train's own launch for DDP on GPUs; on CPU devices
    torchrun with gloo, the cores split over the processes; hybrid groups as one process
    per group of GPUs (``CUDA_VISIBLE_DEVICES``), meeting at a TCP port."""
    processes, stages = row["processes"], row["devices_per_process"]
    kept = without_options(argv, ADVISOR_OPTIONS + REPLACED_OPTIONS + PLACEMENT_OPTIONS)
    kept += ["--max-tokens", str(row["max_tokens_per_process"])]
    if row["scheme"] == "ddp_sharded":
        kept += list(SHARDED_OPTIMIZER or ())
        if "--fp16" in kept and "--fp16-no-flatten-grads" not in kept:
            kept.append("--fp16-no-flatten-grads")  # fairseq shards per-parameter fp32 copies only
    cuda = devices[0].type == "cuda"
    if stages > 1:
        kept += ["--hybrid-devices", ",".join(["cpu"] * stages if not cuda else map(str, range(stages))),
                 "--pipeline-chunks", str(row["chunks"])]
    args = shlex.join(kept)
    if cuda and stages == 1:
        return f"fairseq-train {args} --distributed-world-size {processes}"
    if cuda:
        first = devices[0].index or 0
        visible = " ".join(",".join(str(first + r * stages + s) for s in range(stages))
                           for r in range(processes))
        return (f"r=0; for gpus in {visible}; do CUDA_VISIBLE_DEVICES=$gpus fairseq-train {args} "
                f"--distributed-world-size {processes} --distributed-rank $r --distributed-init-method "
                f"tcp://localhost:{PORT} --distributed-no-spawn & r=$((r + 1)); done; wait")
    threads = max(1, cores // (processes * stages))
    return (f"OMP_NUM_THREADS={threads} torchrun --standalone --nproc_per_node {processes} "
            f"$(which fairseq-train) {args} --distributed-world-size {processes} "
            "--distributed-backend gloo")


SCHEME_TITLES = {"hybrid": "hybrid", "ddp_same_batch": "fairseq DDP",
                 "ddp_sharded": "DDP + sharded optimizer", "groups": "hybrid groups in DDP"}


def scheme_title(row: Dict[str, Any]) -> str:
    """e.g. ``hybrid groups in DDP (2 x 2 devices)``, ``fairseq DDP (4 processes)``."""
    shape = (f"{row['processes']} x {row['devices_per_process']} devices" if row["scheme"] == "groups"
             else f"{row['devices_per_process']} devices" if row["scheme"] == "hybrid"
             else f"{row['processes']} processes")
    return f"{SCHEME_TITLES[row['scheme']]} ({shape})"


def _tps(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_report(report: Dict[str, Any]) -> str:
    rows = report["recommendations"]
    width = max(len(row["setting"]) for row in rows)
    value_width = max(len(row["value"]) for row in rows)
    lines = [f"fairseq_hybrid advisor: {report['devices']} ({report['schedule']} schedule, "
             f"measured on {report['measured_on']}), --max-tokens {report['given_max_tokens']}, "
             f"{report['elapsed_s']:.0f} s, load average {report['load_average'][0]:.1f} on "
             f"{report['cores']} cores" + (" (a busy machine: timings are noisy)"
                                           if report["load_average"][0] > report["cores"] else ""), "",
             f"{'setting':<{width}}  {'recommended':<{value_width}}  {'pred. tok/s':>11}  "
             "model error (measured here)", "-" * (width + value_width + 60)]
    for row in rows:
        lines.append(f"{row['setting']:<{width}}  {row['value']:<{value_width}}  "
                     f"{_tps(row['tokens_per_s']):>11}  {row['error']}")
        lines.append(f"{'':<{width}}    {row['why']}")
    lines += ["", "--max-tokens sweep (predicted, each with its best K):"]
    for item in report["sweep"]:
        lines.append(f"  {item['max_tokens']:>7}  batch {item['batch_sentences']:>4} x "
                     f"{item['batch_target_tokens'] / item['batch_sentences']:.1f} tokens  K={item['chunks']:<2}  "
                     f"{item['predicted_step_s']:.3f} s/step  {item['predicted_tokens_per_s']:>9,.0f} tok/s")
    lines += ["", "devices (predicted, each with its best K):"]
    for item in report["by_devices"]:
        lines.append(f"  {item['devices']:>2}  K={item['chunks']:<2}  {item['predicted_step_s']:.3f} s/step  "
                     f"{item['predicted_tokens_per_s']:>9,.0f} tok/s")
    if report.get("schemes"):
        lines += ["", "ways to train the same global batch (predicted):"]
        for item in report["schemes"]["rows"]:
            k = f"K={item['chunks']}" if item["chunks"] else ""
            mark = "  <- fastest" if item["scheme"] == report["schemes"]["fastest"] else ""
            lines.append(f"  {scheme_title(item):<40} --max-tokens {item['max_tokens_per_process']:<6} "
                         f"{k:<5} {item['predicted_tokens_per_s']:>9,.0f} tok/s{mark}")
    lines += ["", "train with:", "  " + report["command"]]
    return "\n".join(lines)
