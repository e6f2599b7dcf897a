"""Small models and batches built the way fairseq builds them (dictionary, collater), and
hand-made stage times and device profiles for the performance model's tests."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from fairseq.data import Dictionary, LanguagePairDataset

import fairseq_hybrid  # noqa: F401  (registers the model and criterion)
from fairseq_hybrid.plugin.config import HybridLSTMConfig
from fairseq_hybrid.plugin.hybrid_lstm import HybridLSTMModel
from fairseq_hybrid.chunking.chunk_choice import LinearCost
from fairseq_hybrid.chunking.wavefront import CellTimes, Link
from fairseq_hybrid.planning.lstm_published import SaturatingCurve
from fairseq_hybrid.planning.profiles import DeviceProfile, LstmCurves
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.stage_times import StageTimes
from fairseq_hybrid.plugin.placement_options import placement_options


def make_dictionary(size: int = 40) -> Dictionary:
    dictionary = Dictionary()
    for i in range(size):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def make_task(dictionary: Dictionary) -> Any:
    return SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)


def make_model(dictionary: Dictionary, seed: int = 0, dtype=torch.float64, **overrides) -> HybridLSTMModel:
    options = dict(
        encoder_embed_dim=12, encoder_hidden_size=16, encoder_layers=2,
        decoder_embed_dim=12, decoder_hidden_size=14, decoder_layers=2,
        decoder_out_embed_dim=12, dropout=0.0,
        max_source_positions=1024, max_target_positions=1024,
    )
    options.update(overrides)
    torch.manual_seed(seed)
    model = HybridLSTMModel.build_model(HybridLSTMConfig(**options), make_task(dictionary))
    return model.to(dtype)


def make_batch(dictionary: Dictionary, lengths, seed: int = 1) -> dict:
    """A collated batch of random sentences with the given (src_len, tgt_len) pairs:
    left-padded sources, right-padded targets, sorted by source length like fairseq."""
    generator = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)

    def sentence(n: int) -> torch.Tensor:
        body = torch.randint(low, high, (n - 1,), generator=generator)
        return torch.cat([body, torch.tensor([dictionary.eos()])])

    src = [sentence(s) for s, _ in lengths]
    tgt = [sentence(t) for _, t in lengths]
    dataset = LanguagePairDataset(
        src, torch.tensor([len(s) for s in src]), dictionary,
        tgt, torch.tensor([len(t) for t in tgt]), dictionary,
    )
    return dataset.collater([dataset[i] for i in range(len(src))])


def random_lengths(count: int, seed: int, max_len: int = 9):
    generator = torch.Generator().manual_seed(seed)
    return [
        tuple(int(v) for v in torch.randint(2, max_len + 1, (2,), generator=generator))
        for _ in range(count)
    ]


def loss_and_grads(criterion, model, batch):
    """(loss, sample_size, logging output, {name: grad}) of one forward/backward."""
    model.zero_grad()
    loss, sample_size, logging = criterion(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, logging, grads


# ---- comparing the hybrid engine with the plain model
def use_devices(model, devices: str, chunks: int, balance=None, head_on_master=False):
    """Train ``model`` on ``devices`` with ``chunks`` time chunks from now on, the options
    given as on the command line (through the plugin's gate)."""
    options = SimpleNamespace(hybrid_devices=devices, pipeline_chunks=chunks, hybrid_balance=balance,
                              hybrid_head_on_master=head_on_master)
    layers = (model.encoder.num_layers, model.decoder.num_layers)
    model.runtime.configure(placement_options(options, layers))
    return model


def assert_same(actual, expected, rtol, atol):
    """Loss, nll and every gradient of ``loss_and_grads`` results agree."""
    loss, _, logging, grads = actual
    ref_loss, _, ref_logging, ref_grads = expected
    assert grads.keys() == ref_grads.keys()
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=0)
    torch.testing.assert_close(logging["nll_loss"], ref_logging["nll_loss"], rtol=rtol, atol=0)
    assert logging["ntokens"] == ref_logging["ntokens"]
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{name}: {m}")


def setup(dtype, seed, sentences=9, **model_options):
    """A 4+4-layer model in train mode and a random batch of ``sentences`` sentences."""
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=dtype, encoder_layers=4, decoder_layers=4,
                       **model_options).train()
    batch = make_batch(dictionary, random_lengths(sentences, seed=seed, max_len=12), seed=seed)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    return dictionary, make_task(dictionary), model, batch


# ---- hand-made timings for the performance model (chunking/, planning/)
ENC, DEC = "encoder", "decoder"


def uniform(t, layers, source_chunks, target_chunks=0):
    times = {(ENC, layer, k): t for layer in range(layers) for k in range(source_chunks)}
    times.update({(DEC, layer, k): t for layer in range(layers) for k in range(target_chunks)})
    return times


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


# round numbers: forward half rate at 10 sentences, training (3x the FLOPs) at 20
FORWARD, TRAINING = SaturatingCurve(1e11, 10, "flat forward"), SaturatingCurve(1.5e11, 20, "flat training")
FLAT = DeviceProfile("flat", "round numbers", gemm_flops=1e12,
                     lstm=(LstmCurves(5, FORWARD, TRAINING),), memory_bytes_per_s=1e9,
                     link=Link(1e9, 1e-6), cell_overhead_s=1e-3, kernel_overhead_s=0.0)


def uniform_costs(layers: int, overhead: float, per_step: float, backward_factor: float = 2.0):
    return {(side, layer, direction): LinearCost(overhead * (backward_factor if direction == "backward" else 1),
                                                 per_step * (backward_factor if direction == "backward" else 1))
            for side in ("encoder", "decoder") for layer in range(layers)
            for direction in ("forward", "backward")}


def traced_steps(monkeypatch, size, batch, devices="cpu,cpu", chunks=3):
    """``benchmarks.step_trace`` of two steps (after one warm-up) of ``size`` on ``batch``:
    its report and each step's record as the tracer kept it."""
    from benchmarks import step_trace

    records = []
    real_row = step_trace.step_row

    def keep(step, seconds, update, workers):
        records.append(step)
        return real_row(step, seconds, update, workers)

    monkeypatch.setattr(step_trace, "step_row", keep)
    trace = step_trace.trace_steps(size, batch, devices, chunks, steps=2, warm_up=1)
    return trace, records
