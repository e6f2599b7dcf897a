"""Tests of fairseq_hybrid/chunking/cell_timing.py."""
import time

import torch

from fairseq_hybrid.chunking.cell_timing import TimingWorkers, device_clock, time_cells
from fairseq_hybrid.parallel.pipeline import pipeline_inputs
from fairseq_hybrid.parallel.placement import build_plan
from fairseq_hybrid.parallel.schedule import DECODER, ENCODER
from helpers import make_batch, make_dictionary, make_model


class TickingClock:
    """A clock that moves one second each time it is read."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_the_stand_in_times_each_task_alone_in_issue_order_and_the_draw_outside_them():
    now = [0.0]

    def task(seconds, result):
        def run():
            now[0] += seconds
            return result
        return run

    def draw():
        now[0] += 100.0

    workers = TimingWorkers(clock=lambda: now[0])
    results = workers.run_all([(0, "a", task(2.0, "x")), (1, "b", task(0.5, "y"))], while_waiting=draw)
    assert results == ["x", "y"] and workers.records == [("a", 2.0), ("b", 0.5)]
    assert now[0] == 102.5
    assert device_clock(torch.device("cpu")) is time.perf_counter


def test_every_cell_is_timed_once_and_a_bridges_backward_counts_with_its_decoder_cell():
    """With a clock that moves 1 s per reading every cell takes 1 s, forward and backward,
    except a decoder layer's chunk 0 backward, which adds its bridge's (encoder hidden 16,
    decoder 14); the bytes are the cells' outputs and one (h, c) state."""
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=torch.float32, encoder_hidden_size=16,
                       decoder_hidden_size=14).train()
    batch = make_batch(dictionary, [(7, 5), (5, 4), (3, 2)])
    net = batch["net_input"]
    with torch.no_grad():
        draws = model.draw_step(net["src_tokens"], net["prev_output_tokens"])
    source, target, masks = pipeline_inputs(draws)
    plan = build_plan((torch.device("cpu"),), None, 3, 2, 2)
    times = time_cells(model, plan, TimingWorkers(TickingClock()), source, net["src_lengths"], target, masks)
    cells = {(side, layer, chunk) for side in (ENCODER, DECODER) for layer in range(2) for chunk in range(3)}
    assert (times.chunks, times.source_chunks, times.target_chunks, times.layers) == (3, 3, 3, 2)
    assert times.forward == {key: 1.0 for key in cells}
    assert times.backward == {key: 2.0 if key[0] == DECODER and key[2] == 0 else 1.0 for key in cells}
    # chunks of 3, 2, 2 source steps (3 sentences, encoder hidden 16) and 2, 2, 1 target steps (14)
    steps = {ENCODER: (3, 2, 2), DECODER: (2, 2, 1)}
    hidden = {ENCODER: 16, DECODER: 14}
    assert times.output_bytes == {key: steps[key[0]][key[2]] * 3 * hidden[key[0]] * 4 for key in cells}
    assert times.state_bytes == 2 * 3 * 16 * 4  # the first cell's: encoder layer 0, chunk 0
