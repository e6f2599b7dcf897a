"""Queued dropout masks in the engine: drawn while the pipeline's workers run — only what
the first clock cycle needs is drawn before it is handed out (the queue itself:
tests/test_dropout.py)."""
import torch

from fairseq_hybrid.model.dropout import MaskQueue
from fairseq_hybrid.parallel.worker import DeviceWorkers
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import setup, use_devices


def test_the_engine_draws_masks_while_the_pipeline_runs(monkeypatch):
    """cpu,cpu, 3 chunks, dropout on: the first forward cycle is handed out after one
    draw (the source embeddings' dropout: the only mask encoder layer 0's first chunk
    needs), and each cycle is followed by a draw while the workers run it (a cycle that
    needs a mask not drawn yet draws it, and those before it, first)."""
    _, task, model, batch = setup(torch.float64, seed=13, dropout=0.3)
    use_devices(model, "cpu,cpu", 3)
    events = []
    real_draw, real_run_all = MaskQueue.draw_next, DeviceWorkers.run_all

    def draw_next(self):
        drew = real_draw(self)
        if drew:
            events.append("draw")
        return drew

    def run_all(self, tasks, inline_device=None, while_waiting=None):
        events.append("cycle" if while_waiting is not None else "other")
        return real_run_all(self, tasks, inline_device, while_waiting)

    monkeypatch.setattr(MaskQueue, "draw_next", draw_next)
    monkeypatch.setattr(DeviceWorkers, "run_all", run_all)
    criterion = HybridCrossEntropyCriterion(task, False, 0.1)
    loss, _, _ = criterion(model, batch)
    forward = events[:events.index("other")] if "other" in events else events
    layers = model.encoder.num_layers
    # per side the embeddings' mask and one per upper layer, and the encoder's top mask
    assert forward.count("draw") == 2 * layers + 1
    assert forward[:3] == ["draw", "cycle", "draw"]
    # while masks are pending, each cycle is followed by a draw made while it runs
    for i, event in enumerate(forward):
        if event == "cycle" and "draw" in forward[i + 1:]:
            assert forward[i + 1] == "draw", forward
    loss.backward()
