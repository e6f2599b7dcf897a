"""The pipeline's schedule (fairseq_hybrid/parallel/pipeline.py): time chunks and the
clock-cycle wavefront over (layer, chunk) cells."""
from fairseq_hybrid.parallel.pipeline import DECODER, ENCODER, chunk_bounds, clock_cycles


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
