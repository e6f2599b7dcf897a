"""The planned schedule's model (planning/planned.py): its dataflow simulation against hand
computations and against the simulator of today's schedule, and each step's charges."""
import dataclasses

import pytest

from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.compare import allreduce_seconds, compare_profile
from fairseq_hybrid.planning.planned import (
    STEPS, finish_times, planned_speedups, predict_planned_step,
    wavefront_with_head,
)
from fairseq_hybrid.planning.profiles import PROFILES
from fairseq_hybrid.planning.step_time import collective_seconds, head_slice_seconds, predict_step, step_shapes
from fairseq_hybrid.chunking.wavefront import Link, pipeline_makespans
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize, layer_map
from fairseq_hybrid.planning.stage_times import HostTimes
from fairseq_hybrid.planning.traffic import step_traffic

# the devices' side of each step; the host's pace is tests/test_host_bound.py's
PROFILE = dataclasses.replace(PROFILES["h100-sxm"], host=HostTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
MODEL = ModelSize(4, 256, 256, 4000)
BATCH = BatchSize(24, 12, 14)
LINK = Link(50e9, 10e-6)


@pytest.fixture(scope="module")
def stage():
    return stage_times_from_profile(MODEL, BATCH, PROFILE, [1, 2, 3], [1, 2, 4])


def test_finish_times_follow_issue_order_per_device_and_waits():
    tasks = [("a", 0, 2.0, ()), ("b", 1, 1.0, ("a",)), ("c", 0, 1.0, ()), ("d", 1, 0.5, ("c",)),
             ("e", 0, 4.0, ("d",))]
    # a 0-2 on 0; b waits for a: 2-3 on 1; c after a on 0: 2-3; d after b on 1: 3-3.5; e 3.5-7.5
    assert finish_times(tasks) == {"a": 2.0, "b": 3.0, "c": 3.0, "d": 3.5, "e": 7.5}


def test_low_priority_tasks_run_only_when_no_cell_is_ready():
    tasks = [("cell a", 0, 1.0, ()), ("head x", 0, 2.0, ()), ("cell b", 1, 1.0, ("cell a",)),
             ("cell c", 0, 1.0, ("cell b",)), ("head y", 1, 1.0, ())]
    # device 0: a 0-1, then only the head is ready: x 1-3, c (ready at 2) waits for x: 3-4;
    # device 1: y is ready at 0 and no cell is: y 0-1, b 1-2
    assert finish_times(tasks, "head") == {"cell a": 1.0, "head x": 3.0, "head y": 1.0,
                                           "cell b": 2.0, "cell c": 4.0}
    # one stream in issue order: x waits for nothing but runs after a; c after x
    assert finish_times(tasks)["cell c"] == 4.0 and finish_times(tasks)["head y"] == 3.0


def test_no_steps_is_todays_prediction_part_for_part(stage):
    for devices in (1, 2, 4):
        for chunks in (1, 3):
            assert predict_planned_step(stage, devices, chunks, LINK, ()) == pytest.approx(
                predict_step(stage, devices, chunks, "dataflow", LINK))


def test_a_free_head_inside_the_wavefront_is_the_pipeline_alone(stage):
    """With head times of zero, the cells-and-head simulation is today's dataflow
    simulation of the pipeline (a separate implementation)."""
    free = dataclasses.replace(stage, head_forward={s: 0.0 for s in stage.head_forward},
                               head_backward={s: 0.0 for s in stage.head_backward})
    for devices, chunks in ((2, 1), (2, 3), (4, 2)):
        forward, backward, _ = wavefront_with_head(free, devices, chunks, LINK)
        expected = pipeline_makespans(free.cells[chunks], layer_map(devices, MODEL.layers),
                                      "dataflow", link=LINK, bridge=False)
        assert (forward, backward) == pytest.approx(expected)


def test_the_head_inside_the_wavefront_costs_at_least_its_share_of_work(stage):
    forward, backward, heads_done = wavefront_with_head(stage, 2, 3, LINK)
    head_f, head_b = stage.head_times(BATCH.sentences // 2)
    alone_f, alone_b = pipeline_makespans(stage.cells[3], layer_map(2, MODEL.layers), "dataflow",
                                          link=LINK, bridge=False)
    assert forward >= max(alone_f, head_f) and backward >= max(alone_b, head_b)
    assert 0 < heads_done < backward


def test_replicas_drop_the_parameter_copies_and_charge_an_overlapped_allreduce(stage):
    mapping = layer_map(4, MODEL.layers)
    routes = step_traffic(mapping, 4, step_shapes(stage))
    kept = 0.0
    for (src, dst, phase), n in routes.items():
        if phase in ("head_forward", "head_backward"):
            n -= stage.head_param_bytes if (dst == 3 and phase == "head_backward") else 0
            kept += LINK.cost(n) if n > 0 else 0.0
    assert head_slice_seconds(stage, mapping, 4, LINK) == pytest.approx(kept)
    parts = predict_planned_step(stage, 4, 2, LINK, ["replicas"])
    ring = allreduce_seconds(stage.head_param_bytes, 4, LINK)
    assert ring / 1 >= parts["head_allreduce"] >= max(0.0, ring - parts["pipeline_backward"])
    assert parts["head_transfers"] == pytest.approx(kept)
    assert parts["head_broadcast"] == parts["head_reduction"] == 0.0  # no collectives left


@pytest.mark.parametrize("link", [LINK, Link(0.2e9, 10e-6)])  # hidden; longer than the pipeline
def test_todays_collectives_charge_only_what_outlasts_the_pipeline(stage, link):
    """Today's engine overlaps its two collectives (parallel/collective_worker.py): the
    broadcast with the embeddings' and the pipeline's forward, the reduction with the
    pipeline's backward; with the head inside the wavefront the broadcast is charged whole
    and the reduction hides behind the backward left after the head's last gradient."""
    mapping = layer_map(4, MODEL.layers)
    parts = predict_step(stage, 4, 2, "dataflow", link)
    collective = collective_seconds(stage.head_param_bytes, 4, link)
    assert parts["head_transfers"] == pytest.approx(head_slice_seconds(stage, mapping, 4, link))
    hidden = parts["embeddings_forward"] + parts["pipeline_forward"]
    assert parts["head_broadcast"] == pytest.approx(max(0.0, collective - hidden))
    assert parts["head_reduction"] == pytest.approx(max(0.0, collective - parts["pipeline_backward"]))
    if link is not LINK:
        assert parts["head_broadcast"] > 0 and parts["head_reduction"] > 0
    wavefront = predict_planned_step(stage, 4, 2, link, ["head_in_wavefront"])
    _, backward, heads_done = wavefront_with_head(stage, 4, 2, link)
    assert wavefront["head_broadcast"] == pytest.approx(collective)
    assert wavefront["head_reduction"] == pytest.approx(max(0.0, collective - (backward - heads_done)))


def test_the_optimizer_share_by_hand(stage):
    """4 layers on 2 devices: device 0 holds layers 0-1, the embeddings and bridges;
    device 1 layers 2-3 and the master head."""
    master, layer = stage.param_bytes_master, stage.param_bytes_layer
    total = master + sum(layer)
    head = stage.head_param_bytes
    today_share = max(master - head + layer[0] + layer[1], head + layer[2] + layer[3]) / total
    replicas = max(master + layer[0] + layer[1], head + layer[2] + layer[3]) / total
    balanced = max(master / 2 + layer[0] + layer[1], master / 2 + layer[2] + layer[3]) / total
    for steps, share in (((), today_share), (["replicas"], replicas),
                         (["replicas", "balanced_optimizer"], balanced)):
        assert predict_planned_step(stage, 2, 1, LINK, steps)["rest"] == pytest.approx(stage.rest * share)
    spread = 2 * LINK.cost(master / 2)
    parts = predict_planned_step(stage, 2, 1, LINK, ["balanced_optimizer"])
    assert parts["optimizer_transfers"] == pytest.approx(spread)
    # with the replicas the head's gradients are on both devices already (all-reduced):
    # only the rest of device 0's parameters are scattered; every value is gathered back
    parts = predict_planned_step(stage, 2, 1, LINK, ["replicas", "balanced_optimizer"])
    assert parts["optimizer_transfers"] == pytest.approx(
        LINK.cost((master - head) / 2) + LINK.cost(master / 2))
    assert spread - parts["optimizer_transfers"] == pytest.approx(head / 2 / LINK.bandwidth_bytes_per_s)


def test_today_in_the_ladder_is_the_comparison_s_hybrid_row():
    rows = compare_profile(PROFILE, MODEL, BATCH, [4], [1, 2, 3], LINK)
    hybrid = next(r for r in rows["hybrid"] if r.devices == 4)
    stage = stage_times_from_profile(MODEL, BATCH, dataclasses.replace(PROFILE, link=LINK), [1, 2, 3], [1, 4])
    best = planned_speedups(stage, 4, [1, 2, 3], LINK, [(), STEPS])
    assert best[()] == (hybrid.chunks, pytest.approx(hybrid.speedup))
    assert set(best) == {(), STEPS}


def test_an_unknown_step_is_refused():
    with pytest.raises(ValueError, match=r"\['faster'\].*each one of"):
        predict_planned_step(None, 2, 1, LINK, ["faster"])
