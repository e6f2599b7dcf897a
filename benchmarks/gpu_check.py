"""The one-command GPU check (``make gpu-check``): what a GPU runs, run on a GPU.

    python -m benchmarks.gpu_check [--device cuda:0] [--quick] [--out results/bench]

On ``cuda:0`` (one GPU; ``cuda:0,cuda:0`` with ``--hybrid-allow-repeated-devices`` runs the
multi-device code on it):

1. ``equivalence``: float64 loss and every gradient of ``hybrid_lstm`` on the device, on
   the device twice with 1-4 time chunks, and on the device mixed with ``cpu``, against the
   plain model on the CPU.
2. ``train-fp16`` / ``train-bf16`` / ``train-amp`` / ``train-fp32``: 30 ``fairseq-train``
   updates on the device twice (finite losses), then the checkpoint reloads on the CPU
   and ``fairseq-generate --cpu`` translates every test sentence.
3. ``generate``: ``fairseq-generate`` on the device gives the CPU's hypotheses.
4. ``speed``: fairseq ``lstm_luong_wmt_en_de`` vs ``hybrid_lstm_wmt_en_de`` (4+4 x 1000,
   vocab 32K, synthetic data, fp16) target tokens/s on one GPU, MFU against a matrix
   product measured here, peak memory.
5. ``pipeline-model``: the performance model's stage times measured on the device, and its
   predicted speedup on 4 GPUs.
6. ``lstm-sweep``: one LSTM layer's forward + backward time over 16-256 sentences (hidden
   1000, 32 steps, fp16 as ``--fp16`` trains), fitted as the published cuDNN timings are,
   printed beside each GPU profile's curve; then the pipeline model with the measured curve
   in place of the closest profile's (``lstm_sweep.py``).

Without CUDA the same checks run on CPU devices at small sizes (``cpu`` stands in for the
GPU, fp16 and AMP are skipped: they need CUDA), the report says plainly that no GPU was
present, and the exit status is 0 unless a check failed. Writes
``<out>/gpu-check-<device>.json`` (atomically) and prints a table.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from fairseq_hybrid.jsonio import write_json_atomic

from .fairseq_runs import BIN, ROOT, USER_DIR, BenchmarkError
from .gpu_speed import speed_check
from .lstm_sweep import lstm_sweep_check
from .pipeline_model import pipeline_model_check

SAMPLE = ROOT / "data" / "ende-sample"
PASS, FAIL, SKIP = "pass", "FAIL", "skip"
FLOAT64_RTOL = 1e-7  # GPU vs CPU float64: different kernels, same math; a bug is O(1)


@dataclass
class Check:
    name: str
    status: str
    detail: str
    seconds: float
    data: Dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    def __init__(self, detail: str, data: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(detail)
        self.data = data or {}


class Skipped(Exception):
    pass


def run_check(name: str, body: Callable[[], Tuple[str, Dict[str, Any]]]) -> Check:
    """Run one check; any exception is that check's failure, never the whole run's."""
    print(f"== {name}", flush=True)
    start = time.perf_counter()
    try:
        detail, data = body()
        status = PASS
    except Skipped as reason:
        status, detail, data = SKIP, str(reason), {}
    except CheckFailed as failure:
        status, detail, data = FAIL, str(failure), failure.data
    except Exception as error:  # noqa: BLE001 - reported as this check's failure
        status, detail = FAIL, f"{type(error).__name__}: {error}"
        data = {"traceback": traceback.format_exc()[-3000:]}
    check = Check(name, status, detail, round(time.perf_counter() - start, 1), data)
    print(f"   {status}: {detail}", flush=True)
    return check


# ---------------------------------------------------------------- 1. equivalence
def padded_batch(dictionary: Any, lengths: List[Tuple[int, int]], seed: int) -> dict:
    """A fairseq-collated batch of random sentences (left-padded sources)."""
    from fairseq.data import LanguagePairDataset

    generator = torch.Generator().manual_seed(seed)

    def sentence(n: int) -> torch.Tensor:
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=generator)
        return torch.cat([body, torch.tensor([dictionary.eos()])])

    src = [sentence(s) for s, _ in lengths]
    tgt = [sentence(t) for _, t in lengths]
    dataset = LanguagePairDataset(src, torch.tensor([len(s) for s in src]), dictionary,
                                  tgt, torch.tensor([len(t) for t in tgt]), dictionary)
    batch = dataset.collater([dataset[i] for i in range(len(src))])
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    return batch


def loss_and_grads(model: Any, criterion: Any, batch: dict) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, _, _ = criterion(model, batch)
    loss.backward()
    return loss.detach().cpu(), {n: p.grad.detach().cpu() for n, p in model.named_parameters()
                                 if p.grad is not None}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().item() or 1.0
    return (actual - expected).abs().max().item() / scale


def equivalence(device: str) -> Tuple[str, Dict[str, Any]]:
    from fairseq import utils

    from fairseq_hybrid.planning import ModelSize
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
    from fairseq_hybrid.plugin.placement_options import parse_devices

    from .models import build_model

    model, task = build_model(ModelSize(layers=4, hidden=24, embed=16, vocab=60, dropout=0.0,
                                        decoder_hidden=20))  # with the encoder->decoder bridge
    model = model.double()
    criterion = HybridCrossEntropyCriterion(task, False, 0.1, softmax_chunk_tokens=7)
    generator = torch.Generator().manual_seed(3)
    lengths = [tuple(int(v) for v in torch.randint(2, 14, (2,), generator=generator))
               for _ in range(11)]
    batch = padded_batch(task.target_dictionary, lengths, seed=3)
    ref_loss, ref_grads = loss_and_grads(model, criterion, batch)
    cases = [(device, 1), (f"{device},{device}", 1), (f"{device},{device}", 2),
             (f"{device},{device}", 3), (f"{device},{device}", 4), (f"{device},cpu", 3)]
    rows, worst = [], 0.0
    for devices, chunks in cases:
        twin = copy.deepcopy(model)
        twin.runtime.configure(devices=parse_devices(devices, allow_repeated=True), chunks=chunks)
        master = twin.runtime.plan().master
        on_device = batch
        if master.type == "cuda":  # what fairseq's Trainer does with a sample
            on_device = utils.move_to_cuda(batch, device=master)
        loss, grads = loss_and_grads(twin, criterion, on_device)
        twin.runtime.close()
        if grads.keys() != ref_grads.keys():
            raise CheckFailed(f"{devices} K={chunks}: gradients of {sorted(ref_grads.keys() - grads.keys())} missing")
        errors = {"loss": relative_error(loss, ref_loss),
                  **{name: relative_error(grads[name], ref) for name, ref in ref_grads.items()}}
        name, error = max(errors.items(), key=lambda item: item[1])
        rows.append({"devices": devices, "chunks": chunks, "max_relative_error": error,
                     "worst": name})
        worst = max(worst, error)
        if error > FLOAT64_RTOL:
            raise CheckFailed(f"{devices} K={chunks}: {name} differs by {error:.2e} relative "
                              f"(allowed {FLOAT64_RTOL:g})", {"cases": rows})
    return (f"{len(cases)} placements, loss and all {len(ref_grads)} gradients within "
            f"{worst:.1e} relative of the CPU's", {"cases": rows})


def equivalence_in_subprocess(device: str, timeout: float = 300) -> Tuple[str, Dict[str, Any]]:
    """``equivalence`` in a fresh process, so a hang (a deadlock between the workers and
    autograd's device threads would be one) is reported as this check's failure."""
    code = ("import json; from benchmarks import gpu_check as g\n"
            "try:\n    detail, data = g.equivalence(%r); failed = False\n"
            "except g.CheckFailed as e:\n    detail, data, failed = str(e), e.data, True\n"
            "print(json.dumps({'detail': detail, 'data': data, 'failed': failed}))" % device)
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"no result within {timeout:.0f} s: the multi-device step hangs") from None
    if proc.returncode != 0:
        raise CheckFailed(f"exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}",
                          {"log_tail": proc.stderr[-3000:]})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["failed"]:
        raise CheckFailed(result["detail"], result["data"])
    return result["detail"], result["data"]


# ---------------------------------------------------------------- 2.-3. fairseq CLIs
def tool(name: str, args: List[str], cwd: Path, env: Dict[str, str],
         timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / name), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise CheckFailed(f"{name} exited {proc.returncode}: "
                          f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}",
                          {"log_tail": (proc.stdout + proc.stderr)[-3000:]})
    return proc


def sample_subset(work: Path, env: Dict[str, str], train: int, test: int) -> Path:
    """The first lines of the bundled corpus, whitespace-tokenised and binarized."""
    raw, out = work / "raw", work / "bin"
    raw.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("valid", test), ("test", test)):
        for lang in ("en", "de"):
            lines = (SAMPLE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tool("fairseq-preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--trainpref", str(raw / "train"),
        "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
        "--destdir", str(out), "--joined-dictionary", "--nwordssrc", "3000", "--workers", "1",
    ], work, env)
    return out


@dataclass
class CliSetup:
    data: Path
    work: Path
    env: Dict[str, str]
    device: str  # "cuda:0" or "cpu"
    test_sentences: int
    model_options: List[str]
    # each checkpoint's fairseq-generate --cpu hypotheses, as a training check got them
    cpu_hypotheses: Dict[str, Dict[int, str]] = field(default_factory=dict)


def train_options(setup: CliSetup, save_dir: Path, precision: Optional[str], updates: int,
                  devices: Optional[str] = None) -> List[str]:
    """``updates`` of them, a loss logged every fifth (every second in the CPU's 4-update
    --quick: two logged losses either way)."""
    devices = devices or f"{setup.device},{setup.device}"
    return [
        str(setup.data), "--user-dir", USER_DIR, "--arch", "hybrid_lstm",
        *setup.model_options, "--hybrid-devices", devices, "--hybrid-allow-repeated-devices",
        "--pipeline-chunks", "2", "--criterion", "hybrid_cross_entropy",
        "--label-smoothing", "0.1", "--optimizer", "torch_adam", "--lr", "0.003", "--clip-norm", "1.0",
        "--max-tokens", "1500", "--max-update", str(updates), "--seed", "1",
        "--disable-validation", "--num-workers", "0", "--log-format", "json",
        "--log-interval", "2" if updates < 10 else "5", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        *([f"--{precision}"] if precision else []),
    ]


def logged_losses(log: str) -> List[float]:
    """The training loss of every ``train_inner`` record of a ``--log-format json`` log."""
    return [float(json.loads(line[line.index("{"):])["loss"])
            for line in log.splitlines() if "| train_inner |" in line and "{" in line]


HYPOTHESIS = re.compile(r"^H-(\d+)\t(\S+)\t(.*)$", re.M)


def generate(setup: CliSetup, checkpoint: Path, on_cpu: bool, extra: List[str] = ()) -> Dict[int, str]:
    proc = tool("fairseq-generate", [
        str(setup.data), "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", "test",
        "--beam", "5", "--batch-size", "16", "--required-batch-size-multiple", "1",
        "--num-workers", "0", *(["--cpu"] if on_cpu else []), *extra,
    ], setup.work, setup.env)
    return {int(m.group(1)): m.group(3) for m in HYPOTHESIS.finditer(proc.stdout)}


def train_check(setup: CliSetup, precision: Optional[str], updates: int) -> Tuple[str, Dict[str, Any]]:
    if precision in ("fp16", "amp") and not setup.device.startswith("cuda"):
        raise Skipped(f"--{precision} needs CUDA (no GPU here; --bf16 is the CPU's half precision)")
    save_dir = setup.work / f"ckpt-{precision or 'fp32'}"
    proc = tool("fairseq-train", train_options(setup, save_dir, precision, updates), setup.work,
                setup.env)
    losses = logged_losses(proc.stdout + proc.stderr)
    data: Dict[str, Any] = {"losses": losses}
    if not losses or not all(math.isfinite(v) for v in losses):
        raise CheckFailed(f"losses not all finite: {losses}", data)
    checkpoint = save_dir / "checkpoint_last.pt"
    if not checkpoint.is_file():
        raise CheckFailed(f"no {checkpoint.name} written", data)
    hypotheses = setup.cpu_hypotheses[str(checkpoint)] = generate(setup, checkpoint, on_cpu=True)
    data["cpu_hypotheses"] = len(hypotheses)
    if len(hypotheses) != setup.test_sentences:
        raise CheckFailed(f"reloaded on the CPU, generate translated {len(hypotheses)} of "
                          f"{setup.test_sentences} sentences", data)
    return (f"{updates} updates, losses finite ({losses[0]:.2f} -> {losses[-1]:.2f}); "
            f"reloaded on the CPU, {len(hypotheses)}/{setup.test_sentences} translated", data)


def mixed_devices_check(setup: CliSetup, updates: int) -> Tuple[str, Dict[str, Any]]:
    """fp32 training with --clip-norm on a GPU and the CPU: gradients on two devices, which
    fairseq's own clipping cannot scale (``plugin/clipping.py``)."""
    if not setup.device.startswith("cuda"):
        raise Skipped("needs a GPU: gradients on two device kinds (cuda:0,cpu)")
    save_dir = setup.work / "ckpt-mixed"
    proc = tool("fairseq-train", train_options(setup, save_dir, None, updates, f"{setup.device},cpu"),
                setup.work, setup.env)
    losses = logged_losses(proc.stdout + proc.stderr)
    if not losses or not all(math.isfinite(v) for v in losses):
        raise CheckFailed(f"losses not all finite: {losses}", {"losses": losses})
    return (f"{updates} updates on {setup.device},cpu with --clip-norm 1.0, losses finite "
            f"({losses[0]:.2f} -> {losses[-1]:.2f})", {"losses": losses})


def generate_check(setup: CliSetup) -> Tuple[str, Dict[str, Any]]:
    checkpoint = setup.work / "ckpt-fp32" / "checkpoint_last.pt"
    if not checkpoint.is_file():
        raise CheckFailed("needs the fp32 training check's checkpoint, which is missing")
    # the fp32 check's translation on the CPU (the same command on the same file), if it got that far
    cpu = setup.cpu_hypotheses.get(str(checkpoint))
    cpu = cpu if cpu is not None else generate(setup, checkpoint, on_cpu=True)
    if setup.device.startswith("cuda"):
        other, label = generate(setup, checkpoint, on_cpu=False), setup.device
    else:  # no GPU: the model's layers spread over two CPU devices while translating
        other = generate(setup, checkpoint, on_cpu=True,
                         extra=["--model-overrides", "{'hybrid_devices': 'cpu,cpu'}"])
        label = "cpu,cpu"
    differing = sorted(i for i in cpu if other.get(i) != cpu[i])
    data = {"sentences": len(cpu), "differing_ids": differing[:20]}
    if differing or len(other) != len(cpu):
        raise CheckFailed(f"{len(differing)} of {len(cpu)} hypotheses on {label} differ from "
                          "the CPU's", data)
    return f"{len(cpu)}/{len(cpu)} hypotheses on {label} equal the CPU's", data


# ---------------------------------------------------------------- the run
def run(device: Optional[str], quick: bool, work: Path) -> Dict[str, Any]:
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchmarkError(f"--device {device}: this machine has no CUDA device")
    if device != "cpu" and not re.fullmatch(r"cuda:\d+", device):
        raise BenchmarkError(f"--device {device!r}: cpu or cuda:N")
    on_gpu = device.startswith("cuda")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if on_gpu:  # one visible GPU, so fairseq starts one process
        env["CUDA_VISIBLE_DEVICES"] = device[5:]
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["OMP_NUM_THREADS"] = "1"
    cli_device = "cuda:0" if on_gpu else "cpu"
    checks: List[Check] = [run_check("equivalence", lambda: equivalence_in_subprocess(device))]
    test_sentences = 40
    data = sample_subset(work / "sample", env, train=500 if quick else 3000, test=test_sentences)
    setup = CliSetup(data, work, env, cli_device, test_sentences,
                     ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
                      "--encoder-hidden-size", "64", "--decoder-embed-dim", "64",
                      "--decoder-hidden-size", "64", "--decoder-out-embed-dim", "64"])
    updates = 4 if quick and not on_gpu else 30
    for precision in ("fp16", "bf16", "amp", None):
        checks.append(run_check(f"train-{precision or 'fp32'}",
                                lambda p=precision: train_check(setup, p, updates)))
    checks.append(run_check("train-mixed-devices", lambda: mixed_devices_check(setup, updates)))
    checks.append(run_check("generate", lambda: generate_check(setup)))
    checks.append(run_check("speed", lambda: speed_check(device, work, quick)))
    checks.append(run_check("pipeline-model", lambda: pipeline_model_check(device, quick)))
    checks.append(run_check("lstm-sweep", lambda: lstm_sweep_check(device, quick)))
    gpu_name = torch.cuda.get_device_name(torch.device(device)) if on_gpu else None
    return {
        "device": device,
        "gpu": gpu_name,
        "note": (f"ran on {gpu_name}" if on_gpu else
                 "NO GPU WAS PRESENT: every check ran on CPU devices at small sizes (cpu "
                 "stands in for cuda:0); this verifies the check itself and the CPU paths, "
                 "not the GPU"),
        "quick": quick,
        "command": " ".join(["python -m benchmarks.gpu_check", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "cuda": torch.version.cuda},
        "checks": [asdict(c) for c in checks],
        "passed": all(c.status != FAIL for c in checks),
    }


def table(report: Dict[str, Any]) -> str:
    lines = [f"GPU check on {report['device']}" + (f" ({report['gpu']})" if report["gpu"] else ""),
             "", "| check | result | seconds | detail |", "|---|---|---:|---|"]
    for check in report["checks"]:
        lines.append(f"| {check['name']} | {check['status']} | {check['seconds']} | {check['detail']} |")
    if not report["gpu"]:
        lines += ["", report["note"]]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="cuda:N (default: cuda:0 when CUDA is present, else cpu)")
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer updates")
    parser.add_argument("--out", default=str(ROOT / "results" / "bench"),
                        help="folder for gpu-check-<device>.json")
    parser.add_argument("--work", help="scratch folder (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    logging.getLogger("fairseq_hybrid").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        work = Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        report = run(args.device, args.quick, work)
    print(table(report))
    path = Path(args.out) / f"gpu-check-{report['device'].replace(':', '')}.json"
    write_json_atomic(report, path)
    print(f"wrote {path}")
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
