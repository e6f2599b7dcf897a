"""Tests of fairseq_hybrid/planning/stage_times.py."""
import pytest

from helpers import fake_stage


def test_head_times_are_measured_interpolated_or_scaled():
    stage = fake_stage(sentences=8)  # measured shards of 2, 4, 8 sentences: 1 ms per sentence forward
    assert stage.head_times(0) == (0.0, 0.0)
    assert stage.head_times(4) == (0.004, 0.008)
    forward, backward = stage.head_times(6)  # between 4 and 8
    assert forward == pytest.approx(0.006) and backward == pytest.approx(0.012)
    forward, backward = stage.head_times(16)  # beyond the largest: in proportion to 8
    assert forward == pytest.approx(0.016) and backward == pytest.approx(0.032)
    forward, _ = stage.head_times(1)  # below the smallest: in proportion to 2
    assert forward == pytest.approx(0.001)


def test_optimizer_share_is_the_largest_share_of_parameters_on_one_device():
    stage = fake_stage()
    assert stage.rest_share((0, 1)) == 1.0  # no parameter counts: the whole step
    stage.param_bytes_master, stage.param_bytes_layer = 500, (300, 200)
    stage.head_param_bytes = 100  # of the 500: with the top layer's device
    assert stage.rest_share((0, 1)) == pytest.approx(0.7)  # device 0: 400 + 300 of 1000
    assert stage.rest_share((1, 1)) == pytest.approx(0.6)  # device 1: 100 + 500
    assert stage.rest_share((0, 0)) == pytest.approx(1.0)


def test_host_times_scale_every_task_and_layer_bytes_add_up_per_device():
    from fairseq_hybrid.planning.stage_times import HostTimes

    host = HostTimes(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert host.scaled(0.5) == HostTimes(0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
    stage = fake_stage(layers=3)
    stage.param_bytes_layer = (100, 20, 3)
    # layers 0, 1 on device 1 and layer 2 on device 2: device 0 holds no layer, but is listed
    assert stage.layer_bytes_per_device((1, 1, 2)) == {0: 0.0, 1: 120.0, 2: 3.0}
    assert stage.layer_bytes_per_device((0, 0, 0)) == {0: 123.0}
