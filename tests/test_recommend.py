"""Tests of fairseq_hybrid/planning/recommend.py."""
from dataclasses import replace

import pytest

from fairseq_hybrid.chunking.chunk_choice import cell_times_for
from fairseq_hybrid.parallel.schedule import chunk_bounds
from fairseq_hybrid.planning.recommend import (
    Prediction, allreduce_s, balances, predict, replica_knee, with_fitted_cells,
)
from fairseq_hybrid.planning.step_time import predict_step
from helpers import fake_stage, uniform_costs


def test_every_contiguous_split_of_the_layers_the_even_one_first():
    assert balances(4, 2) == ["2,2", "1,3", "3,1"]
    assert balances(5, 2) == ["3,2", "1,4", "2,3", "4,1"]
    assert balances(3, 3) == ["1,1,1"]
    assert balances(2, 3) == []  # a device without a layer is no split


def test_a_prediction_reads_its_parts_and_its_batch():
    prediction = Prediction(2, 3, None, {"pipeline_forward": 1.0, "pipeline_backward": 0.5,
                                         "head_backward": 0.25, "embeddings_backward": 0.1,
                                         "total": 2.0}, tokens=100)
    assert (prediction.step_s, prediction.tokens_per_s) == (2.0, 50.0)
    assert prediction.backward_s == pytest.approx(0.85)
    stage = fake_stage()
    default = predict(stage, 2, 2, "cycle")
    assert default.tokens == stage.batch.target_tokens == 40
    assert default.parts == predict_step(stage, 2, 2, "cycle")
    assert predict(stage, 2, 2, "cycle", tokens=7).tokens == 7


@pytest.mark.parametrize("overlapped", [False, True])
def test_the_replica_count_is_the_last_whose_all_reduce_fits_in_backward(overlapped):
    """1 GB of gradients on a 80 Gbit/s ring without latency: 2 (R-1)/R x 0.1 s, which is
    0.15 s at R = 4 and 0.16 s at R = 5; the backward pass takes 0.155 s."""
    step = Prediction(1, 1, None, {"pipeline_backward": 0.155, "total": 0.5}, tokens=1000)
    assert allreduce_s(10**9, 4, 80, 0.0) == pytest.approx(0.15)
    assert allreduce_s(10**9, 1, 80, 1.0) == 0.0
    advice = replica_knee(step, 10**9, 80, 0.0, overlapped=overlapped)
    assert advice.replicas == 4 and advice.overlapped is overlapped
    assert advice.allreduce_s == pytest.approx(0.15) and advice.next_allreduce_s == pytest.approx(0.16)
    # torch DDP hides the whole all-reduce behind backward; legacy_ddp adds it after
    expected = 4 * 1000 / (0.5 if overlapped else 0.5 + 0.15)
    assert advice.tokens_per_s == pytest.approx(expected)
    assert replica_knee(step, 10**9, 80, 0.0, limit=3).replicas == 3
    assert replica_knee(replace(step, parts={"pipeline_backward": 0.05, "total": 0.5}), 10**9, 80, 0.0).replicas == 1


def test_cells_fitted_from_two_measured_chunk_counts_give_every_candidate_and_scale_the_bytes():
    truth = uniform_costs(2, overhead=0.003, per_step=0.0007)
    stage = fake_stage(layers=2)  # batch of 5 source and 5 target steps
    measured = {}
    for k in (1, 5):
        cells = cell_times_for(truth, k, 5, 5, 2)
        cells.output_bytes = {key: 200 * (5 // k) for key in cells.forward}  # 200 bytes a step
        cells.state_bytes = 64
        measured[k] = cells
    fitted = with_fitted_cells(replace(stage, cells=measured))
    assert sorted(fitted.cells) == [1, 2, 3, 4, 5]  # the candidates up to 5 steps, and the measured
    for k, cells in fitted.cells.items():
        expected = cell_times_for(truth, k, 5, 5, 2)
        assert cells.forward == pytest.approx(expected.forward)
        assert cells.backward == pytest.approx(expected.backward)
        steps = [end - start for start, end in chunk_bounds(5, k)]
        assert cells.output_bytes == {key: 200 * steps[key[2]] for key in expected.forward}
        assert cells.state_bytes == 64
