"""Tests of fairseq_hybrid/planning/rates.py."""
from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.step_time import predict_step


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
