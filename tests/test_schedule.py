"""The pipeline's schedule (fairseq_hybrid/parallel/schedule.py): time chunks and the
clock-cycle wavefront over (layer, chunk) cells."""
import pytest

from fairseq_hybrid.parallel.schedule import DECODER, ENCODER, chunk_bounds, clock_cycles, dependencies


def test_chunks_cover_every_step_once():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 5) == [(0, 1), (1, 2)]
    assert chunk_bounds(0, 3) == []


def test_clock_cycles_form_a_wavefront():
    cycles = clock_cycles(source_chunks=3, target_chunks=2, layers=2)
    when = {(c.side, c.layer, c.chunk): i for i, cycle in enumerate(cycles) for c in cycle}
    assert len(when) == 2 * 3 + 2 * 2
    for (side, layer, chunk), cycle in when.items():
        if chunk > 0:
            assert when[(side, layer, chunk - 1)] < cycle
        if layer > 0:
            assert when[(side, layer - 1, chunk)] < cycle
        if side == DECODER and chunk == 0:
            assert when[(ENCODER, layer, 2)] < cycle
    # layer 1 works on chunk 0 while layer 0 works on chunk 1
    assert {(c.layer, c.chunk) for c in cycles[1]} == {(0, 1), (1, 0)}


def test_dependencies_forward_and_backward_are_the_same_edges():
    layers, source_chunks, target_chunks = 2, 3, 2
    assert dependencies((DECODER, 1, 0), source_chunks, "forward", layers, target_chunks) == [
        ((DECODER, 0, 0), "output"), ((ENCODER, 1, 2), "state")]
    assert dependencies((ENCODER, 0, 0), source_chunks, "forward", layers, target_chunks) == []
    cells = [c.key for cycle in clock_cycles(source_chunks, target_chunks, layers) for c in cycle]
    forward_edges = {(dep, key, kind) for key in cells
                     for dep, kind in dependencies(key, source_chunks, "forward", layers, target_chunks)}
    backward_edges = {(key, dep, kind) for key in cells
                      for dep, kind in dependencies(key, source_chunks, "backward", layers, target_chunks)}
    # encoder: 4 state + 3 output edges; decoder: 2 state + 2 from the encoder + 2 output
    assert forward_edges == backward_edges and len(forward_edges) == 13
    # the encoder's last chunk of layer 0 feeds layer 1 and decoder layer 0's first chunk
    assert sorted(dependencies((ENCODER, 0, 2), source_chunks, "backward", layers, target_chunks)) == [
        ((DECODER, 0, 0), "state"), ((ENCODER, 1, 2), "output")]
    with pytest.raises(ValueError, match="sideways"):
        dependencies((ENCODER, 0, 0), source_chunks, "sideways", layers, target_chunks)
