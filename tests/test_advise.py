"""The configuration advisor: its recommendations react to their inputs (hand-made stage
times, so the answers are deterministic), its command line, its JSON, and one run of
``python -m fairseq_hybrid.tools.advise`` on the bundled sample."""
import json
import re
import subprocess

import pytest

from fairseq_hybrid.tools.advice_report import command_line, scheme_command, scheme_title
from fairseq_hybrid.jsonio import write_json_atomic
from fairseq_hybrid.chunking.chunk_choice import TIE_TOLERANCE, LinearCost, cell_times_for
from fairseq_hybrid.planning.recommend import (
    Prediction, allreduce_s, batch_knee, best_balance, best_chunks, device_knee, memory_limit, replica_knee,
    with_fitted_cells,
)
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.stage_times import StageTimes


def stage_from_costs(layers=4, overhead=0.001, per_step=0.002, layer_factor=None, sentences=64, length=30):
    """Stage times whose cells follow ``overhead + per_step * steps`` (x ``layer_factor[l]``),
    measured (as the advisor does) at K = 1 and K = 16."""
    factor = layer_factor or [1.0] * layers
    costs = {(side, layer, direction): LinearCost(overhead * factor[layer] * (2 if direction == "backward" else 1),
                                                  per_step * factor[layer] * (2 if direction == "backward" else 1))
             for side in ("encoder", "decoder") for layer in range(layers) for direction in ("forward", "backward")}
    cells = {k: cell_times_for(costs, k, length, length, layers) for k in (1, 16)}
    head = {s: 0.0005 * s for s in range(1, sentences + 1)}
    stage = StageTimes(ModelSize(layers, 32, 32, 100), BatchSize(sentences, length, length), 1, 1, cells,
                       0.002, 0.002, head, {s: 2 * v for s, v in head.items()}, 10_000, 320, 0.01,
                       {n: 1e-4 for n in range(1, layers + 1)})
    return with_fitted_cells(stage)


@pytest.mark.parametrize("schedule", ["cycle", "dataflow"])
def test_a_larger_per_chunk_overhead_lowers_the_recommended_k(schedule):
    chosen = [best_chunks(stage_from_costs(overhead=overhead), 4, schedule).chunks
              for overhead in (0.0, 0.003, 0.03, 0.3)]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1] == 1, chosen


def test_a_slower_link_lowers_the_replica_count():
    step = Prediction(2, 4, None, {"pipeline_backward": 0.25, "head_backward": 0.05,
                                   "embeddings_backward": 0.0, "total": 0.8}, 4000)
    counts = [replica_knee(step, 200 * 2**20, gbps, 50e-6).replicas for gbps in (400, 100, 25, 10, 1)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1] == 1, counts
    advice = replica_knee(step, 200 * 2**20, 10, 50e-6)
    assert advice.allreduce_s <= step.backward_s < advice.next_allreduce_s
    assert advice.tokens_per_s == pytest.approx(advice.replicas * 4000 / (0.8 + advice.allreduce_s))
    # torch DDP (one device per process) hides an all-reduce that fits in backward
    overlapped = replica_knee(step, 200 * 2**20, 10, 50e-6, overlapped=True)
    assert overlapped.replicas == advice.replicas
    assert overlapped.tokens_per_s == pytest.approx(advice.replicas * 4000 / 0.8)


def test_ring_allreduce_time():
    # 4 machines, 1 GB at 8 Gbit/s (1 GB/s): 6 steps of 0.25 s + 1 ms latency each
    assert allreduce_s(10**9, 4, 8.0, 1e-3) == pytest.approx(6 * (1e-3 + 0.25))
    assert allreduce_s(10**9, 1, 8.0, 1e-3) == 0.0


def test_balance_moves_layers_off_a_slower_layer():
    even, is_even = best_balance(stage_from_costs(), 2, "cycle")
    assert is_even and even.balance == "2,2"
    skewed, is_even = best_balance(stage_from_costs(layer_factor=[3.0, 1.0, 1.0, 1.0]), 2, "cycle")
    assert not is_even and skewed.balance == "1,3"


def test_device_knee_is_where_one_more_device_gains_under_5_percent():
    def at(n, tps):
        return Prediction(n, 1, None, {"total": 1000 / tps}, 1000)

    assert device_knee({1: at(1, 1000), 2: at(2, 1800), 3: at(3, 1850), 4: at(4, 2500)}) == 2
    assert device_knee({1: at(1, 1000), 2: at(2, 1800), 3: at(3, 2500)}) == 3
    # and from a stage: the predicted gain of the 4th device over the 3rd is what decides
    stage = stage_from_costs()
    by = {n: best_chunks(stage, n, "dataflow") for n in range(1, 5)}
    knee = device_knee(by)
    gains = [by[n + 1].tokens_per_s / by[n].tokens_per_s - 1 for n in range(1, 4)]
    assert knee == next((n for n, gain in zip(range(1, 4), gains) if gain < 0.05), 4)


def test_batch_knee_and_memory_limit():
    assert batch_knee({1000: 2000.0, 2000: 3000.0, 4000: 3100.0, 8000: 3150.0}) == 2000
    assert batch_knee({1000: 2000.0, 2000: 2500.0, 4000: 3100.0}) == 4000
    peaks = {m: int(1e9 + 1e5 * m) for m in (1000, 2000, 4000)}
    assert memory_limit(peaks, int(16e9)) == pytest.approx((14.4e9 - 1e9) / 1e5, abs=1)
    assert memory_limit({1000: 0, 2000: 0}, int(16e9)) is None  # CPU: nothing measured


def test_command_line_fills_in_the_recommendations():
    argv = ["data-bin/x", "--user-dir", "fairseq_hybrid", "--arch", "hybrid_lstm", "--hybrid-devices", "cpu,cpu",
            "--max-tokens", "4000", "--pipeline-chunks=3", "--link-gbps", "25", "--advice-json", "a.json"]
    rows = [{"setting": "--pipeline-chunks", "option_value": "4"},
            {"setting": "--hybrid-balance", "option_value": None},
            {"setting": "--max-tokens (recommended)", "option_value": "8000"}]
    assert command_line(argv, rows) == (
        "fairseq-train data-bin/x --user-dir fairseq_hybrid --arch hybrid_lstm --hybrid-devices cpu,cpu "
        "--pipeline-chunks 4 --max-tokens 8000")


ARGV = ["data-bin/x", "--user-dir", "fairseq_hybrid", "--arch", "hybrid_lstm", "--hybrid-devices",
        "cuda:0,cuda:1,cuda:2,cuda:3", "--pipeline-chunks", "4", "--max-tokens", "8000", "--link-gbps", "10"]
KEPT = "data-bin/x --user-dir fairseq_hybrid --arch hybrid_lstm"


def row(scheme, processes, stages, chunks=None, max_tokens=2000):
    return {"scheme": scheme, "processes": processes, "devices_per_process": stages, "chunks": chunks,
            "max_tokens_per_process": max_tokens}


def test_each_scheme_has_the_command_that_runs_it():
    import torch

    gpus, cpus = [torch.device("cuda", i) for i in range(4)], [torch.device("cpu")] * 4
    # DDP on GPUs: fairseq starts a process per GPU; the batch split over them
    assert scheme_command(row("ddp_same_batch", 4, 1), ARGV, gpus, 16) == \
        f"fairseq-train {KEPT} --max-tokens 2000 --distributed-world-size 4"
    # on CPUs: torchrun (fairseq reads its ranks only with the world size), the cores split
    assert scheme_command(row("ddp_same_batch", 4, 1), ARGV, cpus, 16) == (
        f"OMP_NUM_THREADS=4 torchrun --standalone --nproc_per_node 4 $(which fairseq-train) {KEPT} "
        "--max-tokens 2000 --distributed-world-size 4 --distributed-backend gloo")
    # hybrid groups: a process per pair of GPUs, each seeing its own two as 0,1
    groups = scheme_command(row("groups", 2, 2, chunks=2, max_tokens=4000), ARGV, gpus, 16)
    assert groups == (
        f"r=0; for gpus in 0,1 2,3; do CUDA_VISIBLE_DEVICES=$gpus fairseq-train {KEPT} --max-tokens 4000 "
        "--hybrid-devices 0,1 --pipeline-chunks 2 --distributed-world-size 2 --distributed-rank $r "
        "--distributed-init-method tcp://localhost:29500 --distributed-no-spawn & r=$((r + 1)); done; wait")
    assert "--hybrid-devices cpu,cpu --pipeline-chunks 2" in scheme_command(
        row("groups", 2, 2, chunks=2, max_tokens=4000), ARGV, cpus, 16)
    # the sharded optimizer: DDP with the options that shard it
    assert scheme_command(row("ddp_sharded", 4, 1), ARGV, gpus, 16) == \
        f"fairseq-train {KEPT} --max-tokens 2000 --zero-sharding os --distributed-world-size 4"
    assert scheme_command(row("ddp_sharded", 4, 1), ARGV + ["--fp16"], gpus, 16).endswith(
        "--fp16 --max-tokens 2000 --zero-sharding os --fp16-no-flatten-grads --distributed-world-size 4")
    assert scheme_title(row("groups", 2, 2)) == "hybrid groups in DDP (2 x 2 devices)"
    assert scheme_title(row("ddp_same_batch", 4, 1)) == "fairseq DDP (4 processes)"


def test_json_is_written_atomically(tmp_path):
    out = tmp_path / "deep" / "advice.json"
    write_json_atomic({"a": [1, 2]}, out)
    assert json.loads(out.read_text()) == {"a": [1, 2]}
    with pytest.raises(TypeError):
        write_json_atomic({"a": object()}, out)
    assert json.loads(out.read_text()) == {"a": [1, 2]}  # the old file stays whole
    assert [p.name for p in out.parent.iterdir()] == ["advice.json"]  # no temporary left


@pytest.mark.slow  # end to end on the bundled sample through fairseq's parser
def test_advise_cli_on_the_sample(sample_data, tmp_path):
    from cli import BIN, USER_DIR, model_args

    data = sample_data  # conftest: binarized once per session
    args = [str(data / "bin"), "--user-dir", USER_DIR, *model_args(32, 2), "--criterion", "hybrid_cross_entropy",
            "--hybrid-devices", "cpu,cpu", "--max-tokens", "400", "--link-gbps", "10",
            "--advice-json", str(tmp_path / "advice.json")]
    proc = subprocess.run([str(BIN / "python"), "-m", "fairseq_hybrid.tools.advise", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "advice.json").read_text())
    settings = [row["setting"] for row in report["recommendations"]]
    assert settings[:2] == ["--pipeline-chunks", "--hybrid-balance"]
    assert "data-parallel replicas (machines)" in settings
    chunks = report["recommendations"][0]["value"]
    assert re.search(rf"^--pipeline-chunks +{chunks} ", proc.stdout, re.M)  # the recommendation row
    assert "--link-gbps" not in report["command"]
    assert report["command"] in proc.stdout and "--pipeline-chunks" in proc.stdout
    assert [item["max_tokens"] for item in report["sweep"]] == sorted(item["max_tokens"] for item in report["sweep"])
    assert report["check"]["measured_step_s"] > 0
    schemes = report["schemes"]  # every way to train the same global batch on the 2 devices
    names = [item["scheme"] for item in schemes["rows"]]
    assert names[:2] == ["hybrid", "ddp_same_batch"] and "groups" not in names  # 2 devices: no groups
    ddp = schemes["rows"][1]
    assert (ddp["processes"], ddp["devices_per_process"], ddp["max_tokens_per_process"]) == (2, 1, 200)
    best = max(item["predicted_tokens_per_s"] for item in schemes["rows"])
    winner = next(item for item in schemes["rows"]
                  if item["predicted_tokens_per_s"] * (1 + TIE_TOLERANCE) >= best)  # the simpler of a tie
    assert schemes["fastest"] == winner["scheme"]
    row = next(r for r in report["recommendations"] if r["setting"] == "parallelism")
    assert row["tokens_per_s"] == winner["predicted_tokens_per_s"]
    if winner["scheme"] == "hybrid":
        assert report["command"].startswith("fairseq-train ") and f"--pipeline-chunks {chunks}" in report["command"]
    else:
        assert report["command"].startswith("OMP_NUM_THREADS=") and "--nproc_per_node 2" in report["command"]
    # a bad value stops the advisor in its parsing, before any work: in this process (the
    # command prints such an error as its one line on stderr, no traceback:
    # tests/test_one_line_errors.py::test_advisor_command_without_arguments)
    from fairseq_hybrid.errors import HybridConfigError
    from fairseq_hybrid.tools.advise import parse

    with pytest.raises(HybridConfigError) as error:
        parse([*args[:-4], "--link-gbps", "0"])
    assert str(error.value) == "fairseq_hybrid: error: --link-gbps 0.0 is not allowed: a number > 0"
