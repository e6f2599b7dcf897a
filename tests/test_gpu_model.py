"""The GPU performance model (planning/profiles.py, analytic.py, compare.py): stage times
from FLOPs and bytes against hand computations, parameter counts against a real model,
DDP against its own definition, and the profile report a user runs."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest


from fairseq_hybrid.planning.analytic import (
    head_seconds, lstm_cell_seconds, parameter_counts, recurrent_seconds, stage_times_from_profile,
)
from fairseq_hybrid.planning.compare import allreduce_seconds, compare_profile, ddp_step
from fairseq_hybrid.planning.lstm_published import (
    FP16_TENSOR_OP, V100_TIMINGS, SaturatingCurve, select,
)
from fairseq_hybrid.planning.profiles import (
    PROFILES, DeviceProfile, LstmCurves, rate, sensitivity_variants,
)
from fairseq_hybrid.planning.step_time import predict_step, step_shapes
from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.traffic import step_traffic
from helpers import make_dictionary, make_model

# round numbers: forward half rate at 10 sentences, training (3x the FLOPs) at 20
FORWARD, TRAINING = SaturatingCurve(1e11, 10, "flat forward"), SaturatingCurve(1.5e11, 20, "flat training")
FLAT = DeviceProfile("flat", "round numbers", gemm_flops=1e12,
                     lstm=(LstmCurves(5, FORWARD, TRAINING),), memory_bytes_per_s=1e9,
                     link=Link(1e9, 1e-6), cell_overhead_s=1e-3, kernel_overhead_s=0.0)


def test_an_lstm_cell_costs_its_recurrent_part_on_the_curves_and_its_input_projection_as_a_gemm():
    forward, backward = lstm_cell_seconds(FLAT, steps=3, sentences=20, inputs=4, hidden=5)
    recurrent = 2 * 4 * 5 * 5 * 3 * 20  # 4 gates x W_h h, per token (what the curves cover)
    recurrent_forward = recurrent / (1e11 * 20 / (20 + 10))
    recurrent_training = 3 * recurrent / (1.5e11 * 20 / (20 + 20))
    projection = 2 * 4 * 5 * 4 * 3 * 20 / 1e12  # 4 gates x W_i x, one matrix product
    extra = 3 * 5 * 3 * 20 * 2 / 1e9  # 4 pre-activations read (written) where 1 was
    assert forward == pytest.approx(1e-3 + recurrent_forward + projection + extra)
    assert backward == pytest.approx(
        1e-3 + (recurrent_training - recurrent_forward) + 2 * projection + extra)
    # no gate bytes beyond ``extra``: the published times already include the gates
    assert forward - 1e-3 - recurrent_forward - projection == pytest.approx(3 * 5 * 60 * 2 / 1e9)


def test_the_recurrent_part_reproduces_the_published_v100_times():
    """An independent reference: DeepBench's V100 fp16 hidden-1024 times (25 steps), which
    the v100 profile's curves were fitted to, within the fit's 1%."""
    for t in select(V100_TIMINGS, FP16_TENSOR_OP, 1024):
        forward, backward = recurrent_seconds(PROFILES["v100"], t.steps, t.batch, 1024)
        assert forward == pytest.approx(t.forward_s, rel=0.01)
        assert forward + backward == pytest.approx(t.training_s, rel=0.01)


def test_a_layer_takes_the_curves_of_the_nearest_published_hidden_size():
    profile = PROFILES["h100-sxm"]
    assert [profile.lstm_curves(h).hidden for h in (256, 600, 1000, 1400, 1500, 4096)] == \
        [512, 512, 1024, 1024, 2048, 2048]
    assert [c.hidden for c in profile.lstm] == [512, 1024, 2048]
    with pytest.raises(ValueError, match="hidden 0: at least 1"):
        profile.lstm_curves(0)


def test_curves_whose_backward_would_take_negative_time_are_refused():
    with pytest.raises(ValueError, match="hidden 5: the training curve is faster"):
        LstmCurves(5, FORWARD, SaturatingCurve(4e11, 20, "too fast"))


def test_sensitivity_variants_scale_the_curves_and_the_host():
    profile = PROFILES["h100-sxm"]
    variants = sensitivity_variants(profile)
    for label, peak, b_half in (("LSTM peak x0.5", 0.5, 1), ("LSTM peak x1.5", 1.5, 1),
                                ("LSTM b_half x0.5", 1, 0.5), ("LSTM b_half x2", 1, 2)):
        for mine, theirs in zip(variants[label].lstm, profile.lstm):
            for a, b in ((mine.forward, theirs.forward), (mine.training, theirs.training)):
                assert (a.peak_flops, a.b_half) == pytest.approx((b.peak_flops * peak, b.b_half * b_half))
    assert variants["host time x2"].host.cell_forward == pytest.approx(2 * profile.host.cell_forward)
    assert variants["host time x0.5"].host.round_trip == pytest.approx(0.5 * profile.host.round_trip)
    assert variants["host time x2"].lstm == profile.lstm


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


@pytest.mark.parametrize("bandwidth", [FLAT.link.bandwidth_bytes_per_s, 2e3])
def test_the_head_traffic_is_its_slices_one_by_one_and_two_overlapped_ring_collectives(bandwidth):
    model, batch = ModelSize(4, 8, 6, 30, decoder_hidden=10), BatchSize(7, 5, 4)
    link = Link(bandwidth, FLAT.link.latency_s)
    stage = stage_times_from_profile(model, batch, FLAT, [1, 2], [1, 4])
    routes = step_traffic((0, 1, 2, 3), 4, step_shapes(stage))
    params = stage.head_param_bytes
    slices = 0.0
    for (_, destination, phase), n in routes.items():
        if phase in ("head_forward", "head_backward"):  # the master head on device 3
            n -= params if (phase == "head_backward" and destination == 3) else 0
            slices += link.cost(n) if n > 0 else 0.0
    parts = predict_step(stage, 4, 2, "dataflow", link)
    assert parts["head_transfers"] == pytest.approx(slices)
    # the parameters' broadcast and the gradients' reduction: the bytes once, 3 hops each,
    # on side streams: only what outlasts the forward before the head / the backward after it
    collective = params / link.bandwidth_bytes_per_s + 3 * link.latency_s
    forward = parts["embeddings_forward"] + parts["pipeline_forward"]
    assert parts["head_broadcast"] == pytest.approx(max(0.0, collective - forward))
    assert parts["head_reduction"] == pytest.approx(max(0.0, collective - parts["pipeline_backward"]))
    one = predict_step(stage, 1, 1, "dataflow", link)
    assert one["head_transfers"] == one["head_broadcast"] == one["head_reduction"] == 0.0


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




def test_a_measured_profile_has_positive_rates_and_feeds_the_analytic_model():
    from fairseq_hybrid.planning.rates import measure_profile

    model, batch = ModelSize(2, 16, 16, 50), BatchSize(4, 3, 3)
    profile = measure_profile(model, batch, "cpu", threads=1, repeats=1)
    assert profile.name == "cpu" and profile.activation_bytes == 4
    recurrent = profile.lstm_curves(16)
    assert recurrent.forward.b_half == 0.0 and recurrent.forward == recurrent.training  # flat
    for value in (profile.gemm_flops, recurrent.forward.peak_flops, profile.memory_bytes_per_s,
                  profile.random_elements_per_s):
        assert value > 0
    assert 0 < profile.kernel_overhead_s < 0.1 and 0 < profile.cell_overhead_s < 1
    assert "measured on cpu with 1 thread(s)" in profile.lines()[0]
    stage = stage_times_from_profile(model, batch, profile, [1, 2], [1, 2])
    assert predict_step(stage, 2, 2, "cycle")["total"] > 0
