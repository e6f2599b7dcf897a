"""``make gpu-check`` on a machine without CUDA: the same checks on CPU devices at small
sizes, exit 0, a JSON report that says no GPU was present; and its checks can fail."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_without_cuda_runs_every_check_on_cpu_devices(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check-cpu.json").read_text())
    status = {check["name"]: check["status"] for check in report["checks"]}
    assert status == {
        "equivalence": "pass", "train-fp16": "skip", "train-bf16": "pass", "train-amp": "skip",
        "train-fp32": "pass", "train-mixed-devices": "skip", "generate": "pass", "speed": "pass",
        "pipeline-model": "pass",
    }
    assert report["gpu"] is None and "NO GPU WAS PRESENT" in report["note"]
    assert "NO GPU WAS PRESENT" in proc.stdout and "| equivalence | pass |" in proc.stdout
    checks = {check["name"]: check for check in report["checks"]}
    cases = checks["equivalence"]["data"]["cases"]
    assert [(c["devices"], c["chunks"]) for c in cases] == [
        ("cpu", 1), ("cpu,cpu", 1), ("cpu,cpu", 2), ("cpu,cpu", 3), ("cpu,cpu", 4), ("cpu,cpu", 3)]
    assert all(c["max_relative_error"] < 1e-12 for c in cases)
    losses = checks["train-bf16"]["data"]["losses"]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert checks["train-fp32"]["data"]["cpu_hypotheses"] == 40
    rows = checks["speed"]["data"]["rows"]
    assert rows["hybrid"]["target_tokens_per_s"] > 0 and 0 < rows["hybrid"]["mfu"] < 1
    host = checks["pipeline-model"]["data"]["host_times"]  # 4+4 layers, 4 chunks: 32 cells
    assert host["tasks_per_step"]["cell_forward"] == 32 and host["seconds"]["cell_forward"] > 0


def test_the_equivalence_check_fails_when_the_engine_loses_sentences(monkeypatch):
    import fairseq_hybrid.parallel.engine

    real = fairseq_hybrid.parallel.engine.plan_shards
    monkeypatch.setattr(fairseq_hybrid.parallel.engine, "plan_shards",
                        lambda tokens, devices: real(tokens, devices)[:-1])
    check = gpu_check.run_check("equivalence", lambda: gpu_check.equivalence("cpu"))
    assert check.status == gpu_check.FAIL
    assert "cpu,cpu K=1" in check.detail and "relative" in check.detail


def test_a_check_that_raises_is_that_checks_failure_only():
    def broken():
        raise RuntimeError("boom")

    check = gpu_check.run_check("x", broken)
    assert (check.status, check.detail) == (gpu_check.FAIL, "RuntimeError: boom")
    assert "boom" in check.data["traceback"]


def test_bad_devices_are_one_line_before_any_work(tmp_path):
    with pytest.raises(gpu_check.BenchmarkError, match="'gpu7': cpu or cuda:N"):
        gpu_check.run("gpu7", True, tmp_path)
    if not gpu_check.torch.cuda.is_available():
        with pytest.raises(gpu_check.BenchmarkError, match="cuda:0: this machine has no CUDA"):
            gpu_check.run("cuda:0", True, tmp_path)
    assert list(tmp_path.iterdir()) == []
