"""The benchmark's parts: the analytic FLOP count against torch's FlopCounterMode on the
real models, fairseq log parsing, the chart, the head-memory measurement, and the
scaling CLI end to end on a tiny corpus (JSON and PNG written and readable)."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.fairseq_runs import interval_speed
from benchmarks.flops import ModelShape, decoder_flops_per_token, encoder_flops_per_token, \
    training_flops_per_target_token
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import make_batch, make_dictionary, make_model, make_task, traced_steps

ROOT = Path(__file__).resolve().parent.parent
SIZES = dict(encoder_embed_dim=12, encoder_hidden_size=16, decoder_embed_dim=12,
             decoder_hidden_size=16, decoder_out_embed_dim=10)


def shape_of(dictionary, layers, input_feeding=False, out_embed=10, decoder_embed=12):
    return ModelShape(layers, 12, 16, decoder_embed, 16, out_embed, len(dictionary), input_feeding)


@pytest.mark.parametrize("layers,input_feeding", [(1, False), (3, False), (2, True)])
def test_hybrid_flop_count_matches_torch_flop_counter(layers, input_feeding):
    dictionary = make_dictionary()
    model = make_model(dictionary, encoder_layers=layers, decoder_layers=layers,
                       input_feeding=input_feeding, **SIZES).train()
    sentences, source_length, target_length = 5, 7, 6
    batch = make_batch(dictionary, [(source_length, target_length)] * sentences)
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1)
    shape = shape_of(dictionary, layers, input_feeding)
    forward = sentences * (source_length * encoder_flops_per_token(shape)
                           + target_length * decoder_flops_per_token(shape, source_length))
    with FlopCounterMode(display=False) as counter:
        loss, _, _ = criterion(model, batch)
    assert counter.get_total_flops() == forward
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    per_target = training_flops_per_target_token(shape, source_length / target_length, source_length)
    # backward = 2 x forward, except that the encoder's zero initial states need no
    # gradient: 2 x 4H x H per layer and sentence fewer (the count's convention ignores it)
    initial_state_grads = layers * sentences * 2 * 4 * 16 * 16
    assert counter.get_total_flops() + forward + initial_state_grads == pytest.approx(
        per_target * sentences * target_length, rel=1e-12)


def test_chunked_head_counts_the_output_layer_recompute():
    shape = ModelShape(2, 8, 8, 8, 8, 8, 100, False)
    chunked = ModelShape(2, 8, 8, 8, 8, 8, 100, False, head_recompute=True)
    extra = training_flops_per_target_token(chunked, 1.0, 5) - training_flops_per_target_token(shape, 1.0, 5)
    assert extra == 2 * 8 * 100


def test_fairseq_lstm_flop_count_matches_torch_flop_counter_up_to_its_elementwise_attention():
    from fairseq.models.lstm import LSTMModel, base_architecture

    dictionary = make_dictionary()
    args = argparse.Namespace(
        encoder_embed_dim=12, encoder_hidden_size=16, encoder_layers=2,
        decoder_embed_dim=12, decoder_hidden_size=16, decoder_layers=2,
        decoder_out_embed_dim=16, dropout=0.0, max_source_positions=1024,
        max_target_positions=1024, criterion="cross_entropy",
    )
    base_architecture(args)
    torch.manual_seed(0)
    model = LSTMModel.build_model(args, make_task(dictionary)).double()
    sentences, source_length, target_length = 4, 7, 5
    batch = make_batch(dictionary, [(source_length, target_length)] * sentences)
    with FlopCounterMode(display=False) as counter:
        model(**batch["net_input"])
    shape = ModelShape(2, 12, 16, 12, 16, 16, len(dictionary), True)
    counted = sentences * (source_length * encoder_flops_per_token(shape)
                           + target_length * decoder_flops_per_token(shape, source_length))
    # fairseq computes attention scores and context as elementwise product + sum, which
    # FlopCounterMode (matrix products only) does not see: 2 x 2 x H x S per target token
    elementwise = sentences * target_length * 4 * 16 * source_length
    assert counter.get_total_flops() == counted - elementwise


def test_interval_speed_drops_the_warm_up_interval_and_weights_by_time():
    def record(updates, wps, wpb, bsz):
        return ("2026-12-02 | INFO | train_inner | "
                + json.dumps({"num_updates": str(updates), "wps": str(wps), "wpb": str(wpb), "bsz": str(bsz)}))

    log = "\n".join([
        "some startup line",
        record(4, 100.0, 1000.0, 50.0),  # warm-up: dropped
        record(8, 4000.0, 1000.0, 50.0),  # 4000 tokens in 1 s
        record(12, 2000.0, 1000.0, 50.0),  # 4000 tokens in 2 s
    ])
    wps, sentences_per_s, updates, per_update = interval_speed(log, 4)
    assert wps == pytest.approx(8000 / 3)
    assert sentences_per_s == pytest.approx(400 / 3)
    assert (updates, per_update) == (8, 1000.0)


def test_interval_speed_needs_a_timed_interval():
    with pytest.raises(SystemExit, match="fewer than two train_inner records"):
        interval_speed('x | train_inner | {"num_updates": "4", "wps": "1", "wpb": "1", "bsz": "1"}', 4)


def test_head_memory_chunking_lowers_the_peak():
    from benchmarks.head_memory import measure

    # vocab 16K: the logits (128 MB) dominate the step's other memory (~55 MB here), so the
    # chunked peak is well under half (0.31x measured) rather than near it (8K: 0.47x)
    unchunked = measure(16000, 2000, 64, 0, "cpu")["peak_bytes"]
    chunked = measure(16000, 2000, 64, 200, "cpu")["peak_bytes"]
    logits = 2000 * 16000 * 4
    assert unchunked >= logits  # at least the full logits existed at once
    assert chunked < 0.5 * unchunked


def run_scaling(*args: str, cwd: Path = ROOT):
    return subprocess.run([sys.executable, "-m", "benchmarks.scaling", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("args,message", [
    (["--devices", "cuda:0"], "names CUDA devices but this machine has none"),
    (["--devices", "cpu,gpu"], "'gpu' is not cpu or cuda:N"),
    (["--skip", "train,colour"], "unknown part(s) ['colour']"),
    (["--only", "a,z"], "unknown configuration(s) ['z']"),
    (["--largest-batch"], "--largest-batch needs CUDA devices"),
    (["--matmul-size", "0"], "--matmul-size 0: must be >= 1"),
])
def test_scaling_rejects_bad_input_in_one_line(tmp_path, capsys, args, message):
    """In this process (each a process start of ~3 s otherwise); the command's own output
    is checked once below."""
    from benchmarks import scaling

    with pytest.raises(SystemExit) as stopped:
        scaling.main([*args, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")])
    assert stopped.value.code not in (0, None)
    assert message in f"{stopped.value.code}\n{capsys.readouterr().err}"
    assert not (tmp_path / "out").exists()


def test_the_scaling_command_prints_a_bad_value_as_one_line(tmp_path):
    proc = run_scaling("--devices", "cpu,gpu", "--out", str(tmp_path / "out"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "'gpu' is not cpu or cuda:N" in line]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_scaling_end_to_end_writes_json_and_png(tmp_path):
    from cli import prepared_sample

    # 20 pairs: an update of --max-tokens 4000 (the preset's) takes the whole set (~400 target
    # tokens), a tenth of the work of a full batch; and the MFU's peak from a 512² matrix
    # product instead of 2048² (1/64 of the work): the checks are of the report, not the speed
    data = prepared_sample(tmp_path / "sample", train=20, valid=10, test=10) / "bin"
    proc = run_scaling("--quick", "--repeats", "1", "--only", "a,b", "--skip", "memory,model",
                       "--matmul-size", "512", "--data", str(data), "--work", str(tmp_path / "work"),
                       "--out", str(tmp_path / "out"), "--name", "tiny")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out/tiny.json").read_text())
    assert report["matmul_size"] == 512 and report["schedule"]["updates_per_run"] == 12
    assert set(report["training"]) == {"a", "b"}
    for row in report["training"].values():
        assert row["target_tokens_per_s"] > 0 and len(row["runs"]) == 1
        assert 0 < row["mfu"] and row["peak_rss_bytes_per_process"][0] > 100 * 2**20
    assert report["ratios"]["b/a"]["value"] == pytest.approx(
        report["training"]["b"]["target_tokens_per_s"] / report["training"]["a"]["target_tokens_per_s"])
    assert report["generation"]["median_tokens_per_s"]["b"] > 0
    from PIL import Image

    with Image.open(tmp_path / "out/tiny.png") as image:
        assert image.format == "PNG" and image.size[0] > 500
    assert "| (b) hybrid_lstm, 1 device |" in proc.stdout


def test_step_trace_splits_a_two_device_step_into_its_phases(monkeypatch, capsys):
    """Every worker task is counted in its phase: the pipeline's cells (3 chunks x 2
    sides x 2 layers = 12 forward, 12 backward), one head shard per worker each way; each
    worker's busy time in a phase is within that phase's wall time, and the phases, the
    serial part and the update add up to the step."""
    from benchmarks import step_trace
    from fairseq_hybrid.planning import BatchSize, ModelSize

    trace, records = traced_steps(monkeypatch, ModelSize(2, 8, 8, 40), BatchSize(6, 7, 5))
    counts = {phase: sum(1 for _, p, _, _ in records[0].tasks if p == phase) for phase in step_trace.PHASES}
    assert counts == {"pipeline forward": 12, "head forward": 2, "head backward": 2,
                      "pipeline backward": 12}
    times = trace["median_s"]
    for phase in step_trace.PHASES:
        for worker in (0, 1):
            assert 0 < times[f"{phase} busy w{worker}"] <= times[f"{phase} wall"] * 1.01 + 1e-4
    row = step_trace.step_row(records[0], 1.0, 0.1, 2)
    walls = sum(row[f"{phase} wall"] for phase in step_trace.PHASES)
    assert row["serial (outside the workers' phases, without the update)"] == pytest.approx(1.0 - walls - 0.1)
    with pytest.raises(SystemExit):
        step_trace.main(["--chunks", "0"])
    assert "--chunks 0" in capsys.readouterr().err


def test_ab_interleaves_the_two_plugins_and_reports_each_rounds_ratio(monkeypatch):
    """Round 1 runs before then after, round 2 after then before; medians and ratios are
    the hand-computed ones."""
    from benchmarks import ab
    from benchmarks.fairseq_runs import TrainConfig, TrainResult

    speeds = {"old": iter([100.0, 110.0, 90.0]), "new": iter([120.0, 121.0, 99.0])}
    calls = []

    def fake_training(data, config, updates, log_interval, user_dir, env):
        calls.append((config.key, user_dir))
        return TrainResult(next(speeds[user_dir]), 1.0, updates, 1.0, [], {})

    monkeypatch.setattr(ab, "run_training", fake_training)
    config = TrainConfig("e", "hybrid, 2 devices", "--arch hybrid_lstm", 2)
    report = ab.compare("data", [config], {"before": ab.Side("old"), "after": ab.Side("new")},
                        rounds=3, updates=8, log_interval=2, progress=lambda message: None)
    assert [d for _, d in calls] == ["old", "new", "new", "old", "old", "new"]
    entry = report["e"]
    assert entry["median"] == {"before": 100.0, "after": 120.0}
    assert entry["ratio_after_over_before"] == pytest.approx(1.2)
    assert entry["round_ratios"] == pytest.approx([1.2, 121 / 110, 99 / 90])
    assert "120 / 100 = 1.200x" in ab.format_report(report, "abc123")


def test_ab_switch_sets_the_before_sides_environment_and_prints_the_commands(monkeypatch, capsys, tmp_path):
    """--switch inline-collectives: both sides this checkout's plugin, the before side's
    runs with FAIRSEQ_HYBRID_INLINE_COLLECTIVES=1 (the variable the collective worker
    reads), interleaved; the command and each side's fairseq-train command printed."""
    from benchmarks import ab
    from benchmarks.fairseq_runs import USER_DIR, TrainResult
    from fairseq_hybrid.parallel.collective_worker import INLINE_VARIABLE

    calls = []

    def fake_training(data, config, updates, log_interval, user_dir, env):
        calls.append((user_dir, env))
        return TrainResult(1000.0 if env else 1100.0, 1.0, updates, 1.0, [], {})

    monkeypatch.setattr(ab, "run_training", fake_training)
    report = tmp_path / "ab.json"
    ab.main(["--switch", "inline-collectives", "--configs", "e", "--rounds", "2", "--updates", "4",
             "--log-interval", "2", "--data", str(tmp_path), "--json", str(report)])
    assert calls == [(USER_DIR, {INLINE_VARIABLE: "1"}), (USER_DIR, {}), (USER_DIR, {}),
                     (USER_DIR, {INLINE_VARIABLE: "1"})]
    out = capsys.readouterr().out
    command = "python -m benchmarks.ab --switch inline-collectives --configs e --rounds 2"
    assert out.startswith(f"command: {command}")
    assert f"(e) before: {INLINE_VARIABLE}=1 " in out and "fairseq-train" in out
    assert "1,100 / 1,000 = 1.100x" in out
    saved = json.loads(report.read_text())
    assert saved["command"].startswith(command) and saved["configs"]["e"]["median"]["after"] == 1100.0
    with pytest.raises(SystemExit):
        ab.main(["--switch", "faster", "--data", str(tmp_path)])
    assert "--switch: invalid choice: 'faster'" in capsys.readouterr().err


def test_ab_worktree_holds_the_base_plugin_and_fairseq_loads_it_from_there(tmp_path):
    """The base side really is the other commit's code: fairseq's --user-dir import takes
    the worktree's package, not the editable install of this checkout."""
    from benchmarks import ab
    from benchmarks.fairseq_runs import BenchmarkError

    with ab.worktree("HEAD") as path:
        assert (path / "fairseq_hybrid" / "__init__.py").is_file()
        probe = subprocess.run(
            [sys.executable, "-c", "import argparse; from fairseq import utils; "
             f"utils.import_user_module(argparse.Namespace(user_dir={str(path / 'fairseq_hybrid')!r})); "
             "import fairseq_hybrid; print(fairseq_hybrid.__file__)"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)  # as fairseq-train runs
        assert probe.returncode == 0, probe.stderr[-2000:]
        assert probe.stdout.strip().splitlines()[-1].startswith(str(path))
    assert not path.exists()
    with pytest.raises(BenchmarkError, match="--base 'no-such-commit': not a commit"):
        with ab.worktree("no-such-commit"):
            pass


def test_every_benchmarks_and_tools_module_imports():
    """A module nobody runs in the suite still has to import (a moved function once broke
    one silently), including the imports inside its functions."""
    import ast
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for folder in ("benchmarks", "fairseq_hybrid/tools"):
        for path in sorted((root / folder).glob("*.py")):
            module = importlib.import_module(f"{folder.replace('/', '.')}.{path.stem}")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("fairseq_hybrid"):
                    imported = importlib.import_module(node.module)
                    for alias in node.names:
                        assert hasattr(imported, alias.name), f"{module.__name__}: {node.module}.{alias.name}"
