"""Tests of fairseq_hybrid/planning/step_time.py."""
import pytest

from fairseq_hybrid.chunking.wavefront import Link, simulate_pipeline
from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.step_time import predict_speedups, predict_step, step_shapes
from fairseq_hybrid.planning.traffic import step_traffic
from helpers import FLAT, fake_stage, uniform


@pytest.mark.parametrize("schedule", ["cycle", "dataflow"])
def test_speedup_is_one_on_one_device_with_one_chunk(schedule):
    stage = fake_stage()
    table = predict_speedups(stage, [1, 2], [1, 2], schedule, Link(1e9, 1e-5))
    assert table[(1, 1)]["speedup"] == 1.0
    parts = predict_step(stage, 1, 1, schedule)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert parts["pipeline_forward"] == pytest.approx(sum(stage.cells[1].forward.values()))


def test_step_parts_follow_the_code_on_cpu_devices():
    """cycle schedule, N = 2: head shards forward and backward in parallel on the workers
    (max, plus a run_all round trip each); cuda: both in parallel, plus transfers when bandwidth > 0."""
    stage = fake_stage()
    cpu = predict_step(stage, 2, 2, "cycle")
    assert cpu["head_forward"] == pytest.approx(0.004 + 2e-5)
    assert cpu["head_backward"] == pytest.approx(0.008 + 2e-5)
    assert cpu["head_transfers"] == 0
    gpu = predict_step(stage, 2, 2, "dataflow", Link(1e9, 1e-5))
    assert gpu["head_backward"] == pytest.approx(0.008)
    assert gpu["head_transfers"] > 0
    assert predict_step(stage, 2, 2, "dataflow", Link())["head_transfers"] == 0
    # uniform cells, 2 layers on 2 devices, K = 2 per side: 2K + L - 1 = 5 cycles of 0.005
    assert cpu["pipeline_forward"] == pytest.approx(5 * 0.005 + 5 * 2e-5)
    assert gpu["pipeline_forward"] > 5 * 0.005  # plus the transfers between the devices


def test_optimizer_step_splits_by_parameter_share_only_on_gpus():
    stage = fake_stage()
    stage.param_bytes_master, stage.param_bytes_layer = 600, (200, 200)
    stage.head_param_bytes = 100
    assert predict_step(stage, 2, 1, "cycle")["rest"] == pytest.approx(0.003)
    # device 0: embeddings 600 - 100 + layer 0 200 = 700 of 1000 (the head is on device 1)
    assert predict_step(stage, 2, 1, "dataflow")["rest"] == pytest.approx(0.003 * 0.7)
    assert predict_step(stage, 1, 1, "dataflow")["rest"] == pytest.approx(0.003)


def test_head_contention_can_differ_from_the_cells():
    stage = fake_stage()
    slowed = predict_step(stage, 2, 2, "cycle", slowdown={2: 1.0}, head_slowdown={2: 1.5})
    assert slowed["head_forward"] == pytest.approx(1.5 * 0.004 + 2e-5)
    assert slowed["pipeline_forward"] == predict_step(stage, 2, 2, "cycle")["pipeline_forward"]


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


def test_contention_slows_cycles_with_several_busy_devices_only():
    """2 layers on 2 devices, K = 2, t = 1, slowdown 1.5 with 2 busy devices:
    c0 one busy = 1, c1 two busy = 1.5, c2 one busy = 1 -> 3.5."""
    times = uniform(1.0, 2, 2)
    assert simulate_pipeline(times, (0, 1), 2, 0, "forward", "cycle",
                             slowdown={2: 1.5}) == pytest.approx(3.5)
    stage = fake_stage()
    plain = predict_step(stage, 2, 2, "cycle")
    slowed = predict_step(stage, 2, 2, "cycle", slowdown={2: 2.0})
    assert slowed["head_forward"] == pytest.approx(2 * 0.004 + 2e-5)
    assert slowed["head_backward"] == pytest.approx(2 * 0.008 + 2e-5)  # shards on the workers
    assert slowed["total"] > plain["total"]
