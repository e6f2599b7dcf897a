"""The GPU performance model (perfmodel/profiles.py, analytic.py, compare.py): stage times
from FLOPs and bytes against hand computations, parameter counts against a real model,
DDP against its own definition, and the profile report a user runs."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest


from fairseq_hybrid.perfmodel.analytic import (
    head_seconds, lstm_cell_seconds, parameter_counts, stage_times_from_profile,
)
from fairseq_hybrid.perfmodel.compare import allreduce_seconds, compare_profile, ddp_step
from fairseq_hybrid.perfmodel.profiles import PROFILES, DeviceProfile
from fairseq_hybrid.perfmodel.simulate import head_traffic_seconds, predict_step, step_shapes
from fairseq_hybrid.perfmodel.sizes import BatchSize, Link, ModelSize
from fairseq_hybrid.perfmodel.traffic import today
from helpers import make_dictionary, make_model

FLAT = DeviceProfile("flat", "round numbers", gemm_flops=1e12, lstm_flops=1e11,
                     lstm_saturation_sentences=10, memory_bytes_per_s=1e9, link=Link(1e9, 1e-6),
                     cell_overhead_s=1e-3, kernel_overhead_s=0.0)


def test_an_lstm_cell_costs_its_flops_at_the_lstm_rate_and_slows_below_saturation():
    forward, backward = lstm_cell_seconds(FLAT, steps=3, sentences=20, inputs=4, hidden=5)
    flops = 2 * 4 * 5 * (4 + 5) * 3 * 20  # 4 gates x (W_i x + W_h h), per token
    gates = 12 * 5 * 3 * 20 * 2  # gate elements x 16-bit
    assert forward == pytest.approx(1e-3 + flops / 1e11 + gates / 1e9)
    assert backward == pytest.approx(1e-3 + 2 * flops / 1e11 + 2 * gates / 1e9)
    half, _ = lstm_cell_seconds(FLAT, steps=3, sentences=5, inputs=4, hidden=5)
    flops5 = flops // 4
    assert half == pytest.approx(1e-3 + flops5 / (1e11 * 5 / 10) + gates / 4 / 1e9)


def test_the_head_costs_its_matrix_products_and_the_losss_passes_over_the_logits():
    model, batch = ModelSize(1, 6, 4, 50), BatchSize(8, 3, 2)
    forward, backward = head_seconds(FLAT, model, batch, 8)
    tokens = 8 * 2
    flops = 2 * tokens * (6 * 6 + 2 * 3 * 6 + 12 * 4 + 4 * 50)
    memory = tokens * 50 * 12 + tokens * 3 * 4 * 6  # LOGIT_BYTES_16BIT: 12 forward, 30 backward
    assert forward == pytest.approx(flops / 1e12 + memory / 1e9)
    assert backward == pytest.approx(2 * flops / 1e12 + (tokens * 50 * 30 + 2 * tokens * 3 * 24) / 1e9)
    assert head_seconds(FLAT, model, batch, 0) == (0.0, 0.0)


def test_parameter_counts_match_a_real_model():
    dictionary = make_dictionary(40)
    for hidden, decoder_hidden in ((16, 16), (16, 14)):  # without and with the bridge
        model = make_model(dictionary, encoder_hidden_size=hidden, decoder_hidden_size=decoder_hidden,
                           encoder_embed_dim=12, decoder_embed_dim=12, decoder_out_embed_dim=12,
                           encoder_layers=2, decoder_layers=2)
        counts = parameter_counts(ModelSize(2, hidden, 12, len(dictionary),
                                            decoder_hidden=decoder_hidden))
        head = sum(p.numel() for p in model.decoder.head.parameters())
        assert counts.head == head
        assert counts.total == sum(p.numel() for p in model.parameters())
        assert counts.tensors == len(list(model.parameters()))
        layer0 = sum(p.numel() for stack in (model.encoder.stack, model.decoder.stack)
                     for p in stack.layers[0].parameters())
        assert counts.layers[0] == layer0


def test_the_head_traffic_is_its_slices_one_by_one_and_two_ring_collectives():
    model, batch = ModelSize(4, 8, 6, 30, decoder_hidden=10), BatchSize(7, 5, 4)
    stage = stage_times_from_profile(model, batch, FLAT, [1, 2], [1, 4])
    routes = today((0, 1, 2, 3), 4, step_shapes(stage))
    params = stage.head_param_bytes
    expected = 0.0
    for (_, destination, phase), n in routes.items():
        if phase in ("head_forward", "head_backward"):  # the master head on device 3
            n -= params if (phase == "head_backward" and destination == 3) else 0
            expected += FLAT.link.cost(n) if n > 0 else 0.0
    # the parameters' broadcast and the gradients' reduction: the bytes once, 3 hops each
    expected += 2 * (params / FLAT.link.bandwidth_bytes_per_s + 3 * FLAT.link.latency_s)
    assert head_traffic_seconds(stage, (0, 1, 2, 3), 4, FLAT.link) == pytest.approx(expected)
    parts = predict_step(stage, 4, 2, "dataflow", FLAT.link)
    assert parts["head_transfers"] == pytest.approx(expected)
    assert predict_step(stage, 1, 1, "dataflow", FLAT.link)["head_transfers"] == 0.0


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
    for name in rows:
        first = rows[name][0]
        assert first.devices == 1 and first.speedup == pytest.approx(1.0)
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
    for text in ("600 TFLOP/s", "LSTM 200 TFLOP/s", "350 GB/s", "25 GB/s (PCIe-class)",
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




def test_a_measured_profile_has_positive_rates_and_feeds_the_analytic_model():
    from fairseq_hybrid.perfmodel.rates import measure_profile

    model, batch = ModelSize(2, 16, 16, 50), BatchSize(4, 3, 3)
    profile = measure_profile(model, batch, "cpu", threads=1, repeats=1)
    assert profile.name == "cpu" and profile.activation_bytes == 4
    for rate in (profile.gemm_flops, profile.lstm_flops, profile.memory_bytes_per_s,
                 profile.random_elements_per_s):
        assert rate > 0
    assert 0 < profile.kernel_overhead_s < 0.1 and 0 < profile.cell_overhead_s < 1
    assert "measured on cpu with 1 thread(s)" in profile.lines()[0]
    stage = stage_times_from_profile(model, batch, profile, [1, 2], [1, 2])
    assert predict_step(stage, 2, 2, "cycle")["total"] > 0
