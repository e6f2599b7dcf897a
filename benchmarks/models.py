"""The benchmarks' model and batch factories: a ``HybridLSTMModel`` of a
``planning.ModelSize`` built through the plugin's registration (as fairseq builds it), a
synthetic batch of a ``planning.BatchSize``, and the stage times of such a model measured
on one device (``planning.measure.measure_model_stage_times``)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Sequence, Tuple

import torch
from fairseq.data import Dictionary

import fairseq_hybrid  # noqa: F401  (registers model and criterion)
from fairseq_hybrid.planning.measure import measure_model_stage_times
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize
from fairseq_hybrid.planning.stage_times import StageTimes
from fairseq_hybrid.plugin.config import HybridLSTMConfig
from fairseq_hybrid.plugin.hybrid_lstm import HybridLSTMModel


def build_model(size: ModelSize, seed: int = 0) -> Tuple[HybridLSTMModel, Any]:
    """A ``HybridLSTMModel`` (float32, train mode) and its fairseq-like task."""
    dictionary = Dictionary()
    for index in range(size.vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{index}")
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    options = dict(
        encoder_embed_dim=size.embed, encoder_hidden_size=size.hidden,
        encoder_layers=size.layers, decoder_embed_dim=size.embed,
        decoder_hidden_size=size.decoder_hidden or size.hidden, decoder_layers=size.layers,
        decoder_out_embed_dim=size.embed, dropout=size.dropout,
        max_source_positions=1024, max_target_positions=1024,
    )
    if size.dropout_out is not None:
        options.update(encoder_dropout_out=size.dropout_out, decoder_dropout_out=size.dropout_out)
    torch.manual_seed(seed)
    model = HybridLSTMModel.build_model(HybridLSTMConfig(**options), task)
    return model.float().train(), task


def synthetic_sample(dictionary: Any, batch: BatchSize, seed: int = 1) -> dict:
    """A collated batch of random tokens, every sentence of the same lengths (no padding)."""
    generator = torch.Generator().manual_seed(seed)
    low, high, eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def tokens(length: int) -> torch.Tensor:
        body = torch.randint(low, high, (batch.sentences, length), generator=generator)
        body[:, -1] = eos
        return body

    source, target = tokens(batch.source_len), tokens(batch.target_len)
    prev = torch.cat([torch.full((batch.sentences, 1), eos), target[:, :-1]], dim=1)
    return {
        "id": torch.arange(batch.sentences),
        "nsentences": batch.sentences,
        "ntokens": batch.target_tokens,
        "net_input": {
            "src_tokens": source,
            "src_lengths": torch.full((batch.sentences,), batch.source_len),
            "prev_output_tokens": prev,
        },
        "target": target,
    }


def measure_stage_times(
    size: ModelSize,
    batch: BatchSize,
    chunk_counts: Sequence[int],
    device_counts: Sequence[int],
    repeats: int = 3,
    threads: int = 1,
    progress: Callable[[str], None] = lambda message: None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> StageTimes:
    """Measure the stage times of ``size`` on ``batch`` on one ``device`` ("cpu": this
    machine's CPU with ``threads`` torch threads, the thread count of one CPU device
    worker; or e.g. "cuda:0", timed with ``torch.cuda.synchronize``) in ``dtype``."""
    model, task = build_model(size)
    sample = synthetic_sample(task.target_dictionary, batch)
    return measure_model_stage_times(model, task.target_dictionary, sample, size, batch, chunk_counts,
                                     device_counts, repeats, threads, progress, device, dtype)


