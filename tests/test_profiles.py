"""Tests of fairseq_hybrid/planning/profiles.py."""
import pytest

from fairseq_hybrid.planning.lstm_published import SaturatingCurve
from fairseq_hybrid.planning.profiles import PROFILES, LstmCurves, sensitivity_variants
from helpers import FORWARD


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
