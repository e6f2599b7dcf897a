"""The host bound (planning/host_bound.py): one Python process issues every device's
tasks, serialised by the interpreter lock. Its counts of tasks against the engine's real
ones (benchmarks/host_time.py records them), its pacing against hand computations, and
the steps it applies to."""
from dataclasses import replace

import pytest

from benchmarks.host_time import KINDS, measure_host_times, task_kind
from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.host_bound import (
    PHASES, head_host_seconds, host_phases, host_wait, paced_step, pipeline_host_seconds,
)
from fairseq_hybrid.planning.planned import predict_planned_step
from fairseq_hybrid.planning.profiles import PROFILES
from fairseq_hybrid.planning.step_time import predict_step
from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.stage_times import HostTimes

MODEL, BATCH = ModelSize(2, 8, 6, 30), BatchSize(4, 5, 5)
LINK = Link(50e9, 10e-6)
SECOND_EACH = HostTimes(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # the host dwarfs the devices
DISTINCT = HostTimes(cell_forward=1e-3, cell_backward=2e-3, shard_forward=3e-3,
                     shard_backward=4e-3, round_trip=5e-3, collective=7e-3)


def stage_with(host, chunks=(1, 2), devices=(1, 2)):
    profile = replace(PROFILES["h100-sxm"], host=host)
    return stage_times_from_profile(MODEL, BATCH, profile, list(chunks), list(devices))


def test_paced_step_by_hand():
    # device 1; host issues phase 1 until 5 (> 1 + 2); then 3 more; 0; 1
    assert paced_step([1, 2, 3, 0, 1], [0, 5, 0, 0, 0]) == 9
    assert paced_step([1, 2, 3, 0, 1], [0.5] * 5) == 7  # the host always ahead
    assert paced_step([0] * 5, [1] * 5) == 5  # step >= the sum of the host's time


def test_the_pipelines_host_time_is_a_round_trip_per_cycle_and_a_task_per_cell():
    cells = stage_with(DISTINCT).cells[2]
    cycles, count = 2 + 2 + MODEL.layers - 1, 2 * MODEL.layers * 2  # K_s + K_t + L - 1; 2 L K
    for devices in (1, 2):
        assert pipeline_host_seconds(DISTINCT, cells, devices) == pytest.approx(
            (cycles * 5e-3 + count * 1e-3, cycles * 5e-3 + count * 2e-3))
    # the plain model (one device, one chunk): a call per layer, backward inside autograd
    plain = stage_with(DISTINCT).cells[1]
    assert pipeline_host_seconds(DISTINCT, plain, 1) == pytest.approx((2 * MODEL.layers * 1e-3, 0.0))
    assert head_host_seconds(DISTINCT, 1) == (3e-3, 0.0)
    assert head_host_seconds(DISTINCT, 4) == pytest.approx((5e-3 + 4 * 3e-3, 5e-3 + 4 * 4e-3))
    assert head_host_seconds(DISTINCT, 4, calls=3) == pytest.approx((12 * 3e-3, 12 * 4e-3))


def test_a_host_bound_step_by_hand():
    """One second per task: 2 devices, K = 1, 2 layers: 3 clock cycles of 4 cells each way,
    2 head shards, 2 collectives. The host issues: the broadcast (1), the pipeline forward
    (3 + 4), the head (1 + 2 + 1 + 2) and the reduction (1), the pipeline backward (3 + 4):
    22 s; the devices then run the embeddings' backward and the update."""
    stage = stage_with(SECOND_EACH)
    parts = predict_step(stage, 2, 1, "dataflow", LINK)
    assert parts["total"] == pytest.approx(22 + parts["embeddings_backward"] + parts["rest"])
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    # one device, the plain model: 4 layer calls, the head's forward; nothing per cell after
    one = predict_step(stage, 1, 1, "dataflow", LINK)
    assert one["total"] == pytest.approx(5 + one["pipeline_backward"] + one["embeddings_backward"]
                                         + one["rest"])


def test_without_host_times_the_step_is_the_devices_own():
    timed, untimed = stage_with(DISTINCT), replace(stage_with(DISTINCT), host=None)
    zero = stage_with(HostTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    for devices, chunks in ((1, 1), (2, 2)):
        bare = predict_step(untimed, devices, chunks, "dataflow", LINK)
        assert "host_wait" not in bare
        assert predict_step(zero, devices, chunks, "dataflow", LINK)["host_wait"] == 0.0
        paced = predict_step(timed, devices, chunks, "dataflow", LINK)
        assert paced["total"] == pytest.approx(bare["total"] + paced["host_wait"])
        assert paced["total"] >= sum(host_phases(timed, devices, chunks))
    assert "host_wait" not in predict_step(timed, 2, 2, "cycle")  # CPU devices: measured


def test_the_planned_steps_issue_their_own_collectives_and_head_tasks():
    stage = stage_with(DISTINCT, chunks=(1, 2), devices=(1, 2))
    # K_s + K_t + L - 1 = 5 clock cycles, 2 L K = 8 cells
    forward, backward = 5 * 5e-3 + 8 * 1e-3, 5 * 5e-3 + 8 * 2e-3
    head = (5e-3 + 2 * 3e-3) + (5e-3 + 2 * 4e-3)
    assert host_phases(stage, 2, 2) == pytest.approx((7e-3, forward, head + 7e-3, backward, 0.0))
    assert host_phases(stage, 2, 2, ["replicas", "balanced_optimizer"]) == pytest.approx(
        (0.0, forward, head, backward + 7e-3, 2 * 7e-3))
    # the head per target chunk (2) and shard (2), issued inside the pipeline's cycles
    assert host_phases(stage, 2, 2, ["head_in_wavefront"]) == pytest.approx(
        (7e-3, forward + 4 * 3e-3, 7e-3, backward + 4 * 4e-3, 0.0))
    slow = replace(stage, host=SECOND_EACH)
    for steps in ((), ["replicas"], ["balanced_optimizer"], ["head_in_wavefront"]):
        parts = predict_planned_step(slow, 2, 2, LINK, steps)
        assert parts["total"] >= sum(host_phases(slow, 2, 2, steps))
        assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match=r"parts \['mystery'\]: each one of"):
        host_wait({"mystery": 1.0}, (0.0,) * len(PHASES))


def test_the_models_task_counts_are_the_engines():
    """Two real training steps of a tiny model on 2 CPU devices, K = 2, each task the
    engine hands a worker recorded: as many cells, shards and round trips as the model
    charges."""
    report = measure_host_times("cpu", devices=2, chunks=2, steps=1)
    counts = report["tasks_per_step"]
    stage = stage_times_from_profile(ModelSize(4, 8, 8, 40), BatchSize(4, 16, 16),
                                     PROFILES["h100-sxm"], [2], [2])
    one = {kind: HostTimes(*(1.0 if field == kind else 0.0 for field in
                             ("cell_forward", "cell_backward", "shard_forward", "shard_backward",
                              "round_trip", "collective"))) for kind in (*KINDS, "round_trip")}
    for kind in KINDS:
        assert counts[kind] == pytest.approx(sum(host_phases(replace(stage, host=one[kind]), 2, 2)))
    assert report["round_trips_per_step"] == pytest.approx(
        sum(host_phases(replace(stage, host=one["round_trip"]), 2, 2)))
    assert all(report["seconds"][kind] > 0 for kind in KINDS)
    assert task_kind("backward of the bridge into decoder layer 1") == "other"
    with pytest.raises(ValueError, match="--devices 5: 2 to 4"):
        measure_host_times("cpu", devices=5)
