"""The GPU performance model as a whole: DDP against its own definition, the comparison of
the schemes, and the profile report a user runs (benchmarks/pipeline_model.py). The parts
have their own files: tests/test_analytic.py, test_profiles.py, test_step_time.py."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.compare import allreduce_seconds, compare_profile, ddp_step
from fairseq_hybrid.planning.profiles import PROFILES, rate
from fairseq_hybrid.planning.step_time import predict_step
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from helpers import FLAT



def test_ddp_is_the_whole_model_per_device_plus_what_of_the_ring_outlasts_backward():
    assert allreduce_seconds(1e6, 1, FLAT.link) == 0.0
    assert allreduce_seconds(1e6, 4, FLAT.link) == pytest.approx(2 * 3 / 4 * 1e6 / 1e9 + 6 * 1e-6)
    model = ModelSize(2, 8, 6, 30)
    stage = stage_times_from_profile(model, BatchSize(4, 5, 5), FLAT, [1], [1])
    one = ddp_step(stage, 1, FLAT.link)
    assert one["total"] == pytest.approx(predict_step(stage, 1, 1, "dataflow", Link())["total"])
    # one bucket (a tiny model): it starts when backward has ended, nothing overlaps
    slow = ddp_step(stage, 4, Link(1e3, 0.0))
    assert slow["exposed_allreduce"] == slow["allreduce"] > 0
    assert slow["total"] == pytest.approx(slow["compute"] + slow["allreduce"])
    # many buckets (a 100M-parameter model) on a fast link: all but the last bucket hide
    big = stage_times_from_profile(ModelSize(4, 1000, 1000, 32000), BatchSize(64, 30, 30),
                                   PROFILES["h100-sxm"], [1], [1])
    fast = ddp_step(big, 4, PROFILES["h100-sxm"].link)
    buckets = -(-(big.param_bytes_master + sum(big.param_bytes_layer)) // (25 * 2**20))
    assert buckets > 4 and fast["exposed_allreduce"] == pytest.approx(fast["allreduce"] / buckets)


def test_the_comparison_agrees_at_one_device_and_never_beats_perfect_scaling():
    profile = PROFILES["h100-sxm"]
    model, batch = ModelSize(4, 64, 64, 1000), BatchSize(64, 12, 12)
    rows = compare_profile(profile, model, batch, [1, 2, 4], [1, 2, 4])
    for name in ("hybrid", "ddp_same_batch", "ddp_n_batch"):  # the schemes with one device
        first = rows[name][0]
        assert first.devices == 1 and first.speedup == pytest.approx(1.0)
    for name in rows:
        for p in rows[name]:
            assert p.speedup <= p.devices * 1.0001
    # a free link and no per-copy cost: the pure-compute bound of N x batch DDP is N
    free = replace(profile, link=Link(1e18, 0.0))
    n_batch = compare_profile(free, model, batch, [4], [1], free.link)["ddp_n_batch"]
    assert n_batch[-1].speedup == pytest.approx(4.0, rel=1e-3)


@pytest.mark.slow
def test_the_profile_report_prints_its_assumptions_ddp_and_a_pcie_row(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.pipeline_model", "--profile", "h100-sxm", "--preset",
         "wmt", "--devices", "1,2,4", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    at_64 = rate(PROFILES["h100-sxm"].lstm_curves(1000).training.rate(64), "FLOP/s")
    for text in ("600 TFLOP/s", f"hidden 1024: {at_64} at 64 sentences", "350 GB/s",
                 "25 GB/s (PCIe-class)", "180/150 us per cell fwd/bwd", "without the host bound",
                 "DDP, same global batch", "DDP, N x the batch", "range hybrid", "modelled"):
        assert text in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["links"]) == {"profile's link", "25 GB/s (PCIe-class)"}
    rows = report["links"]["profile's link"]["rows"]
    assert [r["devices"] for r in rows["hybrid"]] == [1, 2, 4]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_model", "--profile", "h100-sxm",
                          "--link", "fast"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--link 'fast'" in bad.stderr and "Traceback" not in bad.stderr


def test_sentences_sets_a_profiles_batch_and_is_refused_by_the_cpu_check(tmp_path, monkeypatch, capsys):
    """``--sentences`` was silently ignored with ``--profile``: now it sets the profile's
    batch (lengths kept) and the default JSON name says so; ``--profile cpu`` refuses it."""
    from benchmarks import pipeline_model

    monkeypatch.chdir(tmp_path)  # the default output path is relative
    (tmp_path / "results" / "bench").mkdir(parents=True)
    pipeline_model.main(["--profile", "h100-sxm", "--preset", "wmt", "--devices", "1,2",
                         "--chunks", "1,2", "--sentences", "500"])
    report = json.loads((tmp_path / "results/bench/pipeline-model-wmt-h100-sxm-500-sentences.json").read_text())
    assert report["batch"] == {"sentences": 500, "source_len": 32, "target_len": 32}
    assert "batch 500 sentences x 32 source" in capsys.readouterr().out
    with pytest.raises(SystemExit) as error:
        pipeline_model.main(["--profile", "cpu", "--preset", "small", "--sentences", "3"])
    assert "--sentences 3: --profile cpu checks the model at the preset's batch" in str(error.value)


@pytest.mark.parametrize("args,message", [
    (["--profile", "h100-sxm", "--bandwidth-gbs", "25"],
     "--bandwidth-gbs: not used with --profile h100-sxm (its link is --link"),
    (["--profile", "a100-sxm", "--validate", "--quick"], "--validate, --quick: not used with --profile a100-sxm"),
    (["--link", "pcie"], "--link pcie: only with --profile"),
])
def test_options_the_chosen_mode_would_ignore_are_one_line_errors(args, message):
    """A profile's link comes from --link: a --bandwidth-gbs beside it was silently
    ignored (the prediction then used NVLink while the user asked for 25 GB/s)."""
    from benchmarks import pipeline_model

    with pytest.raises(SystemExit) as error:
        pipeline_model.main(args)
    assert message in str(error.value) and "\n" not in str(error.value)
