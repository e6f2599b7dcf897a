"""Tests of fairseq_hybrid/chunking/wavefront.py."""
import pytest

from fairseq_hybrid.chunking.wavefront import Link, simulate_pipeline
from fairseq_hybrid.planning.sizes import layer_map
from helpers import DEC, ENC, uniform


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
