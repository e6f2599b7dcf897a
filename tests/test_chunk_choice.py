"""Tests of fairseq_hybrid/chunking/chunk_choice.py."""
import pytest

from fairseq_hybrid.chunking.chunk_choice import (
    cell_times_for, choose_chunks, fit_cell_costs, fit_linear,
)
from helpers import uniform_costs


def test_fit_recovers_a_line_and_never_goes_negative():
    points = [(steps, 0.004 + 0.0005 * steps) for steps in (1, 2, 3, 25)]
    fit = fit_linear(points)
    assert fit.overhead_s == pytest.approx(0.004) and fit.per_step_s == pytest.approx(0.0005)
    # a decreasing cloud (noise) is not a negative cost
    noisy = fit_linear([(1, 0.01), (10, 0.002)])
    assert noisy.overhead_s >= 0 and noisy.per_step_s >= 0


def test_cell_costs_fitted_from_two_chunk_counts_predict_a_third():
    truth = uniform_costs(2, overhead=0.003, per_step=0.0007)
    cells = {k: cell_times_for(truth, k, 25, 23, 2) for k in (1, 16)}
    fitted = fit_cell_costs(cells, 25, 23)
    predicted, expected = cell_times_for(fitted, 4, 25, 23, 2), cell_times_for(truth, 4, 25, 23, 2)
    for key, seconds in expected.forward.items():
        assert predicted.forward[key] == pytest.approx(seconds)
        assert predicted.backward[key] == pytest.approx(expected.backward[key])


@pytest.mark.parametrize("schedule", ["cycle", "dataflow"])
def test_a_larger_per_chunk_overhead_lowers_k(schedule):
    layer_device = (0, 1, 2, 3)
    chosen = [choose_chunks(uniform_costs(4, overhead, 0.001), 30, 30, layer_device, schedule).chunks
              for overhead in (0.0, 0.002, 0.01, 0.2)]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1] == 1, chosen


def test_a_larger_barrier_cost_per_cycle_lowers_k():
    costs = uniform_costs(2, 0.0005, 0.001)
    cheap = choose_chunks(costs, 30, 30, (0, 1), "cycle", cycle_overhead=0.0)
    dear = choose_chunks(costs, 30, 30, (0, 1), "cycle", cycle_overhead=0.05)
    assert dear.chunks < cheap.chunks
    # every candidate is reported with its prediction, and the choice is the fastest
    assert min(cheap.predicted_s, key=cheap.predicted_s.get) == cheap.chunks
    assert set(cheap.predicted_s) == {1, 2, 3, 4, 6, 8, 12, 16}
