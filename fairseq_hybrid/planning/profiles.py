"""Device profiles: the handful of rates a GPU's stage times are modelled from, each an
assumption printed beside every prediction made with it (``DeviceProfile.assumptions``).

Rates are *achieved*, not peak: dense 16-bit matrix products at ~60-65% of the data
sheet's dense tensor-core peak, HBM at ~90% of its peak. The LSTM's recurrent part (the
hidden x hidden products, step after step, with the gates' elementwise work) follows the
saturating curves fitted to published cuDNN timings over sentences per call
(``lstm_published.py``: DeepBench's V100 fp16 points, carried over to the A100 and H100 by
a stated assumption): a profile holds the curves of every published hidden size, and a
layer takes those of the nearest one on a log scale (1000 -> 1024, 256 -> 512). Link: one
direction between two GPUs of a box.

The host: one Python process issues every device's work; ``host`` is the time it spends
per task (``stage_times.HostTimes``), serialised by the interpreter lock. GPU values are an
ASSUMPTION set from this project's CPU measurement of the same code with a tiny model
(``python -m benchmarks.host_time``; thread CPU time, an upper estimate of the lock-held
part; ``make gpu-check`` measures it on a GPU).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Tuple

from .lstm_published import PUBLISHED_HIDDEN, SaturatingCurve, lstm_curves
from ..chunking.wavefront import Link
from .stage_times import HostTimes


@dataclass(frozen=True)
class LstmCurves:
    """One hidden size's recurrent-part curves: ``forward`` and ``training`` (forward and
    both backwards, 3x the forward FLOPs). Backward is the training time less forward's,
    so both of its terms (the per-step floor and the per-sentence work) must be >= 0."""
    hidden: int
    forward: SaturatingCurve
    training: SaturatingCurve

    def __post_init__(self) -> None:
        per_sentence = 3 / self.training.peak_flops - 1 / self.forward.peak_flops
        floor = 3 * self.training.b_half / self.training.peak_flops - self.forward.b_half / self.forward.peak_flops
        if per_sentence < -1e-30 or floor < -1e-30:
            raise ValueError(f"LSTM curves at hidden {self.hidden}: the training curve is faster "
                             "than 3x the forward one somewhere, backward would take negative time")

    def scaled(self, peak: float = 1.0, b_half: float = 1.0) -> "LstmCurves":
        def scale(curve: SaturatingCurve) -> SaturatingCurve:
            return SaturatingCurve(curve.peak_flops * peak, curve.b_half * b_half,
                                   f"{curve.basis}; peak x {peak:g}, b_half x {b_half:g}")
        return LstmCurves(self.hidden, scale(self.forward), scale(self.training))


def published_curves(profile_name: str) -> Tuple[LstmCurves, ...]:
    """The profile's curves at every published hidden size (fp16 tensor-op math)."""
    return tuple(LstmCurves(hidden, lstm_curves(hidden, "forward")[profile_name],
                            lstm_curves(hidden, "training")[profile_name])
                 for hidden in PUBLISHED_HIDDEN)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    note: str
    gemm_flops: float  # achieved dense matrix products, FLOP/s, 16-bit
    lstm: Tuple[LstmCurves, ...]  # the recurrent part's curves, by hidden size
    memory_bytes_per_s: float  # achieved device-memory bandwidth
    link: Link  # one direction between two devices of a box
    cell_overhead_s: float = 30e-6  # one pipeline cell on its device: copies, small kernels
    kernel_overhead_s: float = 5e-6  # one small kernel launch (elementwise, optimizer)
    activation_bytes: int = 2  # --fp16/--bf16: activations, parameters and gradients
    optimizer_bytes_per_param: int = 52  # fp16 grads -> fp32 master, clip, Adam, copy back
    # per parameter tensor: fairseq's fp16 wrapper (grad to fp32, unscale, copy back) and
    # its clipping norm run per tensor; --optimizer torch_adam's step is fused (fairseq's
    # per-parameter adam adds ~6 more)
    optimizer_kernels_per_tensor: int = 6
    random_elements_per_s: float = 0.0  # dropout masks drawn (0: bound by writing them)
    host: HostTimes = HostTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # zeros: no host bound

    def mask_seconds(self, elements: int) -> float:
        """Drawing ``elements`` dropout-mask elements and applying them (write the mask;
        read the input and the mask, write the output)."""
        draw = (elements / self.random_elements_per_s if self.random_elements_per_s > 0
                else elements * self.activation_bytes / self.memory_bytes_per_s)
        return draw + 3 * elements * self.activation_bytes / self.memory_bytes_per_s

    def lstm_curves(self, hidden: int) -> LstmCurves:
        """The curves of the hidden size nearest ``hidden`` on a log scale (a tie: the
        larger)."""
        if hidden < 1:
            raise ValueError(f"hidden {hidden}: at least 1")
        return min(self.lstm, key=lambda c: (abs(math.log(hidden / c.hidden)), -c.hidden))

    def assumptions(self) -> Dict[str, object]:
        values = asdict(self)
        values["link"] = {"bandwidth_gbs": self.link.bandwidth_bytes_per_s / 1e9,
                          "latency_us": self.link.latency_s * 1e6}
        return values

    def lines(self) -> List[str]:
        curves = ", ".join(
            f"hidden {c.hidden}: {rate(c.training.rate(64), 'FLOP/s')} at 64 sentences, "
            f"{rate(c.training.rate(256), 'FLOP/s')} at 256" for c in self.lstm)
        host = self.host
        return [
            f"profile {self.name}: {self.note}",
            f"  matrix products {rate(self.gemm_flops, 'FLOP/s')} (the LSTM's input projection "
            f"too), memory {rate(self.memory_bytes_per_s, 'B/s')}, {8 * self.activation_bytes}-bit",
            f"  LSTM recurrent part, training (fwd+bwd): {curves}",
            f"    curve: {self.lstm_curves(1024).training.basis}",
            f"  link {rate(self.link.bandwidth_bytes_per_s, 'B/s') if self.link.bandwidth_bytes_per_s else 'free'}"
            f" + {self.link.latency_s * 1e6:.0f} us per copy; {self.cell_overhead_s * 1e6:.0f} us "
            f"per pipeline cell, {self.kernel_overhead_s * 1e6:.1f} us per small kernel",
            f"  optimizer {self.optimizer_bytes_per_param} bytes per parameter, "
            f"{self.optimizer_kernels_per_tensor} kernels per parameter tensor (--optimizer torch_adam)",
            f"  host (one process, serialised): {host.cell_forward * 1e6:.0f}/"
            f"{host.cell_backward * 1e6:.0f} us per cell fwd/bwd, {host.shard_forward * 1e6:.0f}/"
            f"{host.shard_backward * 1e6:.0f} us per head shard, {host.round_trip * 1e6:.0f} us "
            f"per round trip, {host.collective * 1e6:.0f} us per collective (ASSUMPTION)",
        ]


def rate(value: float, unit: str) -> str:
    """``value`` with the SI prefix that keeps it readable (T, G, M)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


NVLINK_LATENCY = 10e-6
# the host per task on a GPU box: ASSUMPTION. Measured here (benchmarks.host_time, thread CPU
# time, 4 CPU devices, K=8, a loaded 2-core EPYC VM): cell forward 176-386 us, backward
# 291-402 (CPU autograd computes on the worker; on a GPU the device's autograd thread
# launches the kernels outside the lock), shard 329-1262 / 295-955, round trip 96-138.
GPU_HOST = HostTimes(cell_forward=180e-6, cell_backward=150e-6, shard_forward=330e-6,
                     shard_backward=300e-6, round_trip=100e-6, collective=200e-6)

PROFILES: Dict[str, DeviceProfile] = {
    "h100-sxm": DeviceProfile(
        "h100-sxm", "H100 SXM 80GB (data sheet: 989 TFLOP/s dense bf16, 3.35 TB/s, "
        "NVLink 4 450 GB/s per direction)",
        gemm_flops=600e12, lstm=published_curves("h100-sxm"),
        memory_bytes_per_s=3.0e12, link=Link(350e9, NVLINK_LATENCY), host=GPU_HOST),
    "a100-sxm": DeviceProfile(
        "a100-sxm", "A100 SXM 80GB (data sheet: 312 TFLOP/s dense bf16, 2.0 TB/s, "
        "NVLink 3 300 GB/s per direction)",
        gemm_flops=200e12, lstm=published_curves("a100-sxm"),
        memory_bytes_per_s=1.8e12, link=Link(230e9, NVLINK_LATENCY), host=GPU_HOST),
    "v100": DeviceProfile(
        "v100", "V100 SXM2 32GB (data sheet: 125 TFLOP/s fp16 tensor, 0.9 TB/s, NVLink 2 "
        "hybrid cube mesh: ~50 GB/s between a pair)",
        gemm_flops=80e12, lstm=published_curves("v100"),
        memory_bytes_per_s=0.8e12, link=Link(45e9, NVLINK_LATENCY), host=GPU_HOST),
}

LINKS: Dict[str, Link] = {
    "nvlink": Link(),  # the profile's own
    "pcie": Link(25e9, 15e-6),  # PCIe 4.0 x16, achieved, through the host
    "ib": Link(12e9, 20e-6),  # between machines: 100 Gb/s InfiniBand, achieved
}


def with_link(profile: DeviceProfile, link: Link) -> DeviceProfile:
    return profile if link.bandwidth_bytes_per_s <= 0 else replace(profile, link=link)


def with_curves(profile: DeviceProfile, peak: float = 1.0, b_half: float = 1.0) -> DeviceProfile:
    return replace(profile, lstm=tuple(c.scaled(peak, b_half) for c in profile.lstm))


def sensitivity_variants(profile: DeviceProfile) -> Dict[str, DeviceProfile]:
    """The profile with its least certain numbers at the ends of their ranges: the LSTM
    curves' peak at 0.5x and 1.5x, their half-rate batch (b_half) at 0.5x and 2x, and the
    host's time per task at 0.5x and 2x."""
    return {
        "LSTM peak x0.5": with_curves(profile, peak=0.5),
        "LSTM peak x1.5": with_curves(profile, peak=1.5),
        "LSTM b_half x0.5": with_curves(profile, b_half=0.5),
        "LSTM b_half x2": with_curves(profile, b_half=2.0),
        "host time x0.5": replace(profile, host=profile.host.scaled(0.5)),
        "host time x2": replace(profile, host=profile.host.scaled(2.0)),
    }
