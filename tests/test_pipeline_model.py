"""The pipeline performance model (chunking/wavefront.py, planning/): the simulator against
schedules worked out by hand, the step prediction's invariants, and the one-device
measurement on a tiny model. No timing assertions (speed lives in benchmarks/)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.models import measure_stage_times  # noqa: E402
from fairseq_hybrid.chunking.wavefront import CellTimes, Link, simulate_pipeline  # noqa: E402
from fairseq_hybrid.planning import (  # noqa: E402
    BatchSize, ModelSize, StageTimes, layer_map, predict_speedups, predict_step,
)

ENC, DEC = "encoder", "decoder"


def uniform(t, layers, source_chunks, target_chunks=0):
    times = {(ENC, layer, k): t for layer in range(layers) for k in range(source_chunks)}
    times.update({(DEC, layer, k): t for layer in range(layers) for k in range(target_chunks)})
    return times


@pytest.mark.parametrize("sync", ["cycle", "dataflow"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("layers,chunks", [(1, 1), (2, 3), (4, 4), (4, 16), (3, 1)])
def test_uniform_wavefront_one_side_takes_k_plus_l_minus_1_cells(sync, direction, layers, chunks):
    """L layers on L devices, K chunks of equal time t: the fill, K steady cycles and
    the drain take (K + L - 1) t."""
    times = uniform(0.5, layers, chunks)
    makespan = simulate_pipeline(times, tuple(range(layers)), chunks, 0, direction, sync)
    assert makespan == pytest.approx((chunks + layers - 1) * 0.5)


@pytest.mark.parametrize("sync", ["cycle", "dataflow"])
def test_uniform_wavefront_both_sides(sync):
    """Encoder cycles 0..K+L-2, decoder cycles K..2K+L-2: 2K + L - 1 cycles of t."""
    layers, chunks = 4, 3
    times = uniform(1.0, layers, chunks, chunks)
    makespan = simulate_pipeline(times, tuple(range(layers)), chunks, chunks, "forward", sync)
    assert makespan == pytest.approx(2 * chunks + layers - 1)


@pytest.mark.parametrize("sync", ["serial", "cycle", "dataflow"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_one_device_is_the_sum_of_all_cells(sync, direction):
    times = {key: 0.1 * (i + 1) for i, key in enumerate(sorted(uniform(1.0, 3, 4, 2)))}
    makespan = simulate_pipeline(times, (0, 0, 0), 4, 2, direction, sync)
    assert makespan == pytest.approx(sum(times.values()))


def test_cycle_barrier_and_dataflow_differ_on_a_hand_worked_case():
    """3 layers on 3 devices, 2 encoder chunks. Cell times (layer, chunk):
    (0,0)=1 (0,1)=5 (1,0)=1 (1,1)=1 (2,0)=5 (2,1)=1.
    Barrier per cycle: c0 {(0,0)}=1, c1 {(0,1),(1,0)}=5, c2 {(1,1),(2,0)}=5,
    c3 {(2,1)}=1 -> 12.
    Dataflow: (0,0) 0-1, (0,1) 1-6, (1,0) 1-2, (1,1) 6-7, (2,0) 2-7, (2,1) 7-8 -> 8."""
    times = {(ENC, 0, 0): 1, (ENC, 0, 1): 5, (ENC, 1, 0): 1, (ENC, 1, 1): 1,
             (ENC, 2, 0): 5, (ENC, 2, 1): 1}
    assert simulate_pipeline(times, (0, 1, 2), 2, 0, "forward", "cycle") == 12
    assert simulate_pipeline(times, (0, 1, 2), 2, 0, "forward", "dataflow") == 8
    # backward, reverse clock order; the same cells' times as backward times:
    # cycles c3 {(2,1)}=1, c2 {(1,1),(2,0)}=5, c1 {(0,1),(1,0)}=5, c0 {(0,0)}=1 -> 12
    # dataflow: (2,1) 0-1, (1,1) 1-2, (2,0) 1-6, (0,1) 2-7, (1,0) 6-7, (0,0) 7-8 -> 8
    assert simulate_pipeline(times, (0, 1, 2), 2, 0, "backward", "cycle") == 12
    assert simulate_pipeline(times, (0, 1, 2), 2, 0, "backward", "dataflow") == 8


def test_two_layers_per_device_serialise_within_a_cycle():
    """4 layers on 2 devices (layers 0,1 -> device 0; 2,3 -> device 1), K = 2, t = 1:
    cycles c0 {0/0}, c1 {0/1, 1/0: both device 0} = 2, c2 {1/1 on d0, 2/0 on d1} = 1,
    c3 {2/1, 3/0: both device 1} = 2, c4 {3/1} = 1 -> 1 + 2 + 1 + 2 + 1 = 7."""
    times = uniform(1.0, 4, 2)
    assert layer_map(2, 4) == (0, 0, 1, 1)
    assert simulate_pipeline(times, (0, 0, 1, 1), 2, 0, "forward", "cycle") == 7


def test_decoder_chunk_zero_waits_for_the_encoder_final_state():
    """Dataflow, 2 layers on 2 devices, one chunk: decoder (1, 0) needs
    encoder (1, last) which finishes late when the encoder top layer is slow."""
    times = {(ENC, 0, 0): 1, (ENC, 1, 0): 10, (DEC, 0, 0): 1, (DEC, 1, 0): 1}
    # enc (0,0) 0-1; enc (1,0) 1-11; dec (0,0) on d0: 1-2; dec (1,0) on d1: max(11, 2) -> 12
    assert simulate_pipeline(times, (0, 1), 1, 1, "forward", "dataflow") == 12


def test_transfers_cost_only_across_devices():
    layers, chunks = 2, 2
    times = uniform(1.0, layers, chunks)
    out_bytes = {key: 1000 for key in times}
    link = Link(bandwidth_bytes_per_s=1e6, latency_s=0.5)  # 1000 bytes -> 0.5 + 0.001 s
    free = simulate_pipeline(times, (0, 1), chunks, 0, "forward", "cycle", out_bytes, 0, link=Link())
    assert free == pytest.approx(3.0)
    # cycles: c0 {(0,0)} = 1; c1 {(0,1)=1, (1,0)=1+0.501} = 1.501; c2 {(1,1)} = 1.501
    costly = simulate_pipeline(times, (0, 1), chunks, 0, "forward", "cycle", out_bytes, 0, link=link)
    assert costly == pytest.approx(3.0 + 2 * 0.501)
    same_device = simulate_pipeline(times, (0, 0), chunks, 0, "forward", "cycle", out_bytes, 0, link=link)
    assert same_device == pytest.approx(4.0)  # no transfer, two layers share a device
    back = simulate_pipeline(times, (0, 1), chunks, 0, "backward", "dataflow", out_bytes, 0, link=link)
    assert back == pytest.approx(3.0 + 2 * 0.501)


def fake_stage(layers=2, chunk_counts=(1, 2), sentences=8, cell=0.01):
    cells = {}
    for k in chunk_counts:
        times = uniform(cell / k, layers, k, k)
        cells[k] = CellTimes(k, k, k, layers, dict(times), {key: 2 * t for key, t in times.items()},
                             {key: 4096 for key in times}, 512)
    head_f = {s: 0.001 * s for s in (sentences // 2, sentences // 4, sentences)}
    return StageTimes(
        ModelSize(layers, 16, 16, 50), BatchSize(sentences, 5, 5), 1, 1, cells, 0.002, 0.001,
        head_f, {s: 2 * v for s, v in head_f.items()}, 10_000, 320, 0.003, {1: 1e-5, 2: 2e-5},
    )


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


def test_measurement_gives_positive_times_for_every_cell_of_a_tiny_model():
    stage = measure_stage_times(ModelSize(2, 8, 6, 30), BatchSize(4, 5, 4), [1, 3], [1, 2],
                                repeats=1)
    for k, cells in stage.cells.items():
        expected = {(side, layer, c) for layer in range(2)
                    for side, count in ((ENC, cells.source_chunks), (DEC, cells.target_chunks))
                    for c in range(count)}
        assert cells.forward.keys() == cells.backward.keys() == expected
        assert len(expected) == 2 * 2 * k
        assert all(t > 0 for t in cells.forward.values())
        assert all(t > 0 for t in cells.backward.values())
        assert cells.state_bytes == 2 * 4 * 8 * 4  # (h, c) x batch x hidden x float32
        assert sum(cells.output_bytes[(DEC, 1, c)] for c in range(k)) == 4 * 4 * 8 * 4
    assert stage.embed_forward > 0 and stage.embed_backward > 0 and stage.rest > 0
    assert stage.param_bytes_master > 0 and len(stage.param_bytes_layer) == 2
    assert set(stage.head_forward) == {2, 4}
    assert all(t > 0 for t in list(stage.head_forward.values()) + list(stage.head_backward.values()))
    assert predict_speedups(stage, [1, 2], [1, 3])[(1, 1)]["speedup"] == 1.0


def test_optimizer_step_splits_by_parameter_share_only_on_gpus():
    stage = fake_stage()
    stage.param_bytes_master, stage.param_bytes_layer = 600, (200, 200)
    stage.head_param_bytes = 100
    assert predict_step(stage, 2, 1, "cycle")["rest"] == pytest.approx(0.003)
    # device 0: embeddings 600 - 100 + layer 0 200 = 700 of 1000 (the head is on device 1)
    assert predict_step(stage, 2, 1, "dataflow")["rest"] == pytest.approx(0.003 * 0.7)
    assert predict_step(stage, 1, 1, "dataflow")["rest"] == pytest.approx(0.003)


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


def test_head_contention_can_differ_from_the_cells():
    stage = fake_stage()
    slowed = predict_step(stage, 2, 2, "cycle", slowdown={2: 1.0}, head_slowdown={2: 1.5})
    assert slowed["head_forward"] == pytest.approx(1.5 * 0.004 + 2e-5)
    assert slowed["pipeline_forward"] == predict_step(stage, 2, 2, "cycle")["pipeline_forward"]


@pytest.mark.parametrize("workload", ["lstm", "head"])
def test_concurrency_probe_runs_both_workloads_and_names_a_bad_one(workload):
    """A smoke test of the probe's two workloads (the value is timing: benchmarks/ judges
    it, as the contention column of the pipeline model's validation)."""
    import math

    from fairseq_hybrid.planning import measure_concurrency

    ratio = measure_concurrency(ModelSize(1, 8, 8, 30), BatchSize(4, 3, 3), 2, 1, workload)
    assert math.isfinite(ratio) and ratio > 0
    with pytest.raises(ValueError, match="workload 'gpu': lstm or head"):
        measure_concurrency(ModelSize(1, 8, 8, 30), BatchSize(4, 3, 3), 2, 1, "gpu")


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
