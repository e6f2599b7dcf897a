"""``make gpu-check`` on a machine without CUDA: the same checks on CPU devices at small
sizes, exit 0, a JSON report that says no GPU was present; and its checks can fail. Its
LSTM sweep (``benchmarks/lstm_sweep.py``): the fit recovers a known curve from synthetic
times, the sweep runs on the CPU at small sizes (the gpu check's run) with output that
parses and that ``pipeline_model --lstm-sweep`` reads, and its command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check, lstm_sweep
from cli import made_once
from fairseq_hybrid.jsonio import write_json_atomic
from fairseq_hybrid.planning.profiles import PROFILES

slow = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check_run(tmp_path_factory, worker_id):
    """``python -m benchmarks.gpu_check --quick`` without CUDA, run once per test run for the
    tests that read it (pytest-xdist workers share it: the first runs it under a lock): its
    JSON report and its output."""
    def run(out: Path) -> None:
        env = dict(os.environ, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (out / "stdout.txt").write_text(proc.stdout)

    out = made_once(tmp_path_factory, worker_id, "gpu-check", run)
    return json.loads((out / "gpu-check-cpu.json").read_text()), (out / "stdout.txt").read_text()


@slow
def test_gpu_check_without_cuda_runs_every_check_on_cpu_devices(gpu_check_run):
    report, stdout = gpu_check_run
    status = {check["name"]: check["status"] for check in report["checks"]}
    assert status == {
        "equivalence": "pass", "train-fp16": "skip", "train-bf16": "pass", "train-amp": "skip",
        "train-fp32": "pass", "train-mixed-devices": "skip", "generate": "pass", "speed": "pass",
        "pipeline-model": "pass", "lstm-sweep": "pass",
    }
    assert report["gpu"] is None and "NO GPU WAS PRESENT" in report["note"]
    assert "NO GPU WAS PRESENT" in stdout and "| equivalence | pass |" in stdout
    checks = {check["name"]: check for check in report["checks"]}
    cases = checks["equivalence"]["data"]["cases"]
    assert [(c["devices"], c["chunks"]) for c in cases] == [
        ("cpu", 1), ("cpu,cpu", 1), ("cpu,cpu", 2), ("cpu,cpu", 3), ("cpu,cpu", 4), ("cpu,cpu", 3)]
    assert all(c["max_relative_error"] < 1e-12 for c in cases)
    losses = checks["train-bf16"]["data"]["losses"]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert checks["train-fp32"]["data"]["cpu_hypotheses"] == 40
    rows = checks["speed"]["data"]["rows"]
    assert rows["hybrid"]["target_tokens_per_s"] > 0 and rows["hybrid"]["mfu"] > 0
    # MFU is the model's FLOP/s over the matrix product's measured peak; on a loaded CPU the
    # quick check's short peak measurement can come out below the training's rate (MFU > 1
    # seen beside other work), so the test checks the arithmetic, not a bound on the machine
    peak = checks["speed"]["data"]["matmul_flops_per_s"]
    for row in rows.values():
        assert row["mfu"] == pytest.approx(
            row["model_flops_per_target_token"] * row["target_tokens_per_s"] / peak, rel=1e-9)
    host = checks["pipeline-model"]["data"]["host_times"]  # 4+4 layers, 4 chunks: 32 cells
    assert host["tasks_per_step"]["cell_forward"] == 32 and host["seconds"]["cell_forward"] > 0
    sweep = checks["lstm-sweep"]["data"]
    assert [p["batch"] for p in sweep["points"]] == [16, 32, 64, 128, 256]
    assert sweep["settings"]["dtype"] == "float32" and "NO GPU" in sweep["note"]
    assert "| 256 |" in stdout and "LSTM curves measured" in stdout


@slow
def test_the_equivalence_check_fails_when_the_engine_loses_sentences(monkeypatch):
    import fairseq_hybrid.parallel.engine

    real = fairseq_hybrid.parallel.engine.plan_shards
    monkeypatch.setattr(fairseq_hybrid.parallel.engine, "plan_shards",
                        lambda tokens, devices: real(tokens, devices)[:-1])
    check = gpu_check.run_check("equivalence", lambda: gpu_check.equivalence("cpu"))
    assert check.status == gpu_check.FAIL
    assert "cpu,cpu K=1" in check.detail and "relative" in check.detail


@slow
def test_a_check_that_raises_is_that_checks_failure_only():
    def broken():
        raise RuntimeError("boom")

    check = gpu_check.run_check("x", broken)
    assert (check.status, check.detail) == (gpu_check.FAIL, "RuntimeError: boom")
    assert "boom" in check.data["traceback"]


@slow
def test_bad_devices_are_one_line_before_any_work(tmp_path):
    with pytest.raises(gpu_check.BenchmarkError, match="'gpu7': cpu or cuda:N"):
        gpu_check.run("gpu7", True, tmp_path)
    if not gpu_check.torch.cuda.is_available():
        with pytest.raises(gpu_check.BenchmarkError, match="cuda:0: this machine has no CUDA"):
            gpu_check.run("cuda:0", True, tmp_path)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the LSTM sweep
SETTINGS = lstm_sweep.SweepSettings("cpu", "float32", hidden=40, steps=6, batches=(8, 16, 64, 256))


def synthetic_point(batch, forward, backward, projection_forward, projection_backward):
    """A sweep point whose layer is the recurrent part plus the projection, each t0 + B t1."""
    rf, rb = forward[0] + batch * forward[1], backward[0] + batch * backward[1]
    pf, pb = projection_forward * batch, projection_backward * batch
    return lstm_sweep.SweepPoint(batch, rf + pf, rf + rb + pf + pb, pf, pf + pb)


def test_the_sweeps_fit_recovers_a_known_curve_from_synthetic_times():
    forward, backward = (2e-4, 3e-6), (5e-4, 7e-6)  # (floor s, s per sentence)
    points = [synthetic_point(b, forward, backward, 4e-7, 9e-7) for b in SETTINGS.batches]
    timings = [lstm_sweep.recurrent_timing(p, SETTINGS, "synthetic") for p in points]
    curves, fits = lstm_sweep.fit_curves(timings)
    flops_per_sentence = 2 * 4 * 40 * 40 * 6  # the recurrent part, forward, one sentence
    expected = {  # rate = peak B / (B + b_half) with peak = FLOPs / t1, b_half = t0 / t1
        "forward": (flops_per_sentence / forward[1], forward[0] / forward[1]),
        "training": (3 * flops_per_sentence / (forward[1] + backward[1]),
                     (forward[0] + backward[0]) / (forward[1] + backward[1])),
    }
    for phase, (peak, b_half) in expected.items():
        curve = getattr(curves, phase)
        assert curve.peak_flops == pytest.approx(peak, rel=1e-9)
        assert curve.b_half == pytest.approx(b_half, rel=1e-9)
        assert fits[phase].max_relative_error < 1e-9
    assert curves.hidden == 40
    # the curves survive the report's JSON (what pipeline_model --lstm-sweep reads)
    report = {"settings": {"hidden": 40}, "fits": {phase: lstm_sweep.curve_json(getattr(curves, phase))
                                                   for phase in ("forward", "training")}}
    assert lstm_sweep.curves_from_report(json.loads(json.dumps(report))) == curves
    with pytest.raises(ValueError, match="not an LSTM sweep report"):
        lstm_sweep.curves_from_report({"fits": {}})


def test_a_sweep_with_no_recurrent_time_left_or_bad_settings_is_one_line():
    slow_projection = lstm_sweep.SweepPoint(16, 1e-3, 3e-3, 1e-3, 2e-3)
    with pytest.raises(ValueError, match="at 16 sentences the input projection alone took as long"):
        lstm_sweep.recurrent_timing(slow_projection, SETTINGS, "x")
    bad = [(dict(dtype="float16"), "--dtype float16 on cpu: fp16 training needs CUDA"),
           (dict(batches=(16, 16)), "--batches 16,16: at least two different sizes"),
           (dict(device="gpu"), "--device 'gpu': cpu or cuda:N"),
           (dict(hidden=0), "--hidden 0: at least 1")]
    for change, message in bad:
        fields = {**SETTINGS.__dict__, **change}
        with pytest.raises(ValueError, match=message):
            lstm_sweep.check_settings(lstm_sweep.SweepSettings(**fields))
    from benchmarks.pipeline_model import main as pipeline_model

    with pytest.raises(SystemExit, match="--lstm-sweep x.json: only with --profile h100-sxm or"):
        pipeline_model(["--lstm-sweep", "x.json"])
    with pytest.raises(SystemExit, match="--lstm-sweep missing.json: .*No such file"):
        pipeline_model(["--profile", "v100", "--lstm-sweep", "missing.json"])


@slow
def test_the_sweep_runs_on_the_cpu_and_the_pipeline_model_reads_its_curves(gpu_check_run, tmp_path):
    """The gpu check's CPU sweep is ``lstm_sweep --device cpu --hidden 32 --steps 8 --repeats
    7 --profiles h100-sxm`` on one torch thread; its report, written as ``--json`` writes it,
    is what ``pipeline_model --lstm-sweep`` reads. The sweep's own command line: below."""
    gpu_report, stdout = gpu_check_run
    report = next(c for c in gpu_report["checks"] if c["name"] == "lstm-sweep")["data"]
    assert report["settings"] == {"device": "cpu", "dtype": "float32", "hidden": 32, "steps": 8,
                                  "batches": [16, 32, 64, 128, 256], "repeats": 7}
    assert [p["batch"] for p in report["points"]] == [16, 32, 64, 128, 256]
    for point in report["points"]:
        assert 0 < point["projection_forward_s"] < point["layer_forward_s"] < point["layer_training_s"]
        assert point["recurrent_flops"] == 2 * 4 * 32 * 32 * 8 * point["batch"]
    training = report["fits"]["training"]
    assert training["peak_flops"] > 0 and training["b_half"] >= 0
    assert [r[0] for r in training["residuals"]] == [16, 32, 64, 128, 256]
    assert set(report["profiles"]) == {"measured", *PROFILES}
    assert report["profiles"]["h100-sxm"]["hidden"] == 512  # nearest published to 32
    table_rows = [line for line in stdout.splitlines() if line.startswith("| 256 |")]
    assert len(table_rows) == 2  # training and forward
    assert len(table_rows[0].split("|")) == 2 + 5 + len(PROFILES)
    measured = report["pipeline"]["h100-sxm"]["rows"]["measured"]
    sweep_json, model_json = tmp_path / "sweep.json", tmp_path / "model.json"
    write_json_atomic(report, sweep_json)
    # the same curves through pipeline_model's --lstm-sweep give the same predictions (its
    # command line in this process; as a command: tests/test_gpu_model.py)
    from benchmarks.pipeline_model import main as pipeline_model

    pipeline_model(["--profile", "h100-sxm", "--preset", "wmt", "--devices", "1,2,4",
                    "--lstm-sweep", str(sweep_json), "--json", str(model_json)])
    model = json.loads(model_json.read_text())
    assert model["links"]["profile's link"]["rows"] == measured
    assert "LSTM curves: fitted to 5 CPU (1 torch thread(s)) float32 hidden 32" in model["profile"]["note"]


@slow
def test_the_sweeps_command_line_writes_the_settings_it_was_given(tmp_path, capsys):
    """``python -m benchmarks.lstm_sweep``'s options reach the sweep, its table is printed
    and its JSON written (in this process, on one torch thread as the gpu check runs it)."""
    out = tmp_path / "sweep.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lstm_sweep.main(["--device", "cpu", "--hidden", "32", "--steps", "6", "--batches",
                         "16,64,256", "--repeats", "7", "--profiles", "v100", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert report["settings"] == {"device": "cpu", "dtype": "float32", "hidden": 32, "steps": 6,
                                  "batches": [16, 64, 256], "repeats": 7}
    assert [p["recurrent_flops"] for p in report["points"]] == [2 * 4 * 32 * 32 * 6 * b for b in (16, 64, 256)]
    assert set(report["pipeline"]) == {"v100"}
    printed = capsys.readouterr().out
    assert len([line for line in printed.splitlines() if line.startswith("| 256 |")]) == 2
    assert f"wrote {out}" in printed
