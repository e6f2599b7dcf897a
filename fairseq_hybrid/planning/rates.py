"""The ``cpu`` profile (and a ``measured`` one on any device): the rates a
``DeviceProfile`` is made of, measured on the machine at hand — a large matrix product,
an LSTM layer at the batch's shape, a streaming elementwise pass, the launch of a tiny
kernel and of a tiny LSTM call. Stage times computed from these rates
(``analytic.stage_times_from_profile``) against stage times measured directly
(``measure.measure_model_stage_times``) is the check of the FLOP and byte model."""
from __future__ import annotations

import statistics
from typing import Callable

import torch
from fairseq.modules import FairseqDropout

from ..model.dropout import dropout_mask
from ..model.initialized_layers import lstm_layer
from ..model.lstm_stack import run_layer
from .analytic import PRE_ACTIVATION_EXTRA_ELEMENTS, lstm_flops_per_token
from ..chunking.cell_timing import device_clock
from ..chunking.wavefront import Link
from .lstm_published import SaturatingCurve
from .profiles import DeviceProfile, LstmCurves
from .sizes import BatchSize, ModelSize


def _median_seconds(fn: Callable[[], None], clock: Callable[[], float], repeats: int,
                    inner: int = 1) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = clock()
        for _ in range(inner):
            fn()
        samples.append((clock() - start) / inner)
    return statistics.median(samples)


def measure_profile(model: ModelSize, batch: BatchSize, device: str = "cpu", threads: int = 1,
                    repeats: int = 5) -> DeviceProfile:
    """A profile of ``device`` with ``threads`` torch threads (CPU), its rates measured at
    ``model``'s widths and ``batch``'s sentences, float32."""
    dev = torch.device(device)
    clock = device_clock(dev)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            size = 1024
            a, b = torch.randn(size, size, device=dev), torch.randn(size, size, device=dev)
            gemm = 2 * size ** 3 / _median_seconds(lambda: torch.mm(a, b), clock, repeats)
            big = torch.randn(8 * 2**20, device=dev)  # 32 MiB: beyond the caches
            other = torch.randn_like(big)
            # an in-place add: read two, write one (no allocation inside the timing)
            stream = 3 * big.numel() * 4 / _median_seconds(lambda: big.add_(other), clock, repeats)
            dropout = FairseqDropout(0.1).train()  # the model's own draw (``dropout_mask``)
            random = big.numel() / _median_seconds(lambda: dropout_mask(dropout, big.shape, big),
                                                   clock, repeats)
            tiny = torch.randn(4, device=dev)
            kernel = _median_seconds(lambda: torch.add(tiny, tiny), clock, repeats, inner=200)
        layer = lstm_layer(model.hidden, model.hidden).to(dev)
        x = torch.randn(batch.source_len, batch.sentences, model.hidden, device=dev)
        with torch.no_grad():
            lstm_s = _median_seconds(lambda: run_layer(layer, x, None, None), clock, repeats)
            one = x[:1, :1]
            cell = _median_seconds(lambda: run_layer(layer, one, None, None), clock, repeats, inner=20)
        # the recurrent part: the call less its overhead, its input projection at the
        # matrix-product rate and the pre-activations' extra reads (what ``analytic``
        # charges apart); at least a tenth of the call, should those exceed it
        tokens = batch.source_tokens
        apart = (2 * 4 * model.hidden * model.hidden * tokens / gemm
                 + PRE_ACTIVATION_EXTRA_ELEMENTS * model.hidden * tokens * 4 / stream)
        seconds = max(lstm_s - cell - apart, 0.1 * max(lstm_s - cell, 1e-9))
        recurrent = SaturatingCurve(
            lstm_flops_per_token(0, model.hidden) * tokens / seconds, 0.0,
            f"measured on {device} at {batch.sentences} sentences (flat: no batch sweep)")
    finally:
        torch.set_num_threads(saved)
    return DeviceProfile(
        "cpu" if dev.type == "cpu" else "measured",
        f"measured on {device} with {threads} thread(s) at {model.hidden} wide x "
        f"{batch.sentences} sentences, float32",
        gemm_flops=gemm, lstm=(LstmCurves(model.hidden, recurrent, recurrent),),
        memory_bytes_per_s=stream, link=Link(), cell_overhead_s=cell, kernel_overhead_s=kernel,
        activation_bytes=4, optimizer_bytes_per_param=40, optimizer_kernels_per_tensor=8,
        random_elements_per_s=random,
    )
