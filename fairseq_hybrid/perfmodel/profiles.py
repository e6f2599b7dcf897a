"""Device profiles: the handful of rates a GPU's stage times are modelled from, each an
assumption printed beside every prediction made with it (``DeviceProfile.assumptions``).

Rates are *achieved*, not peak: dense 16-bit matrix products at ~60-65% of the data
sheet's dense tensor-core peak, HBM at ~90% of its peak, the LSTM's own rate (cuDNN,
large batch) at ~20% of the dense peak (the range a user should expect, 10-30%, is the
sensitivity range: on an H100 100-300 TFLOP/s). Below ``lstm_saturation_sentences`` the
recurrent matrix products are bound by reading their weights every time step: the LSTM's
rate falls in proportion to the sentences (the small-batch slowdown, which data
parallelism's 1/N batch per device pays). Link: one direction between two GPUs of a box.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Dict, List

from .sizes import Link


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    note: str
    gemm_flops: float  # achieved dense matrix products, FLOP/s, 16-bit
    lstm_flops: float  # achieved LSTM FLOP/s at >= lstm_saturation_sentences
    lstm_saturation_sentences: int  # below it the LSTM's rate falls in proportion
    memory_bytes_per_s: float  # achieved device-memory bandwidth
    link: Link  # one direction between two devices of a box
    cell_overhead_s: float = 30e-6  # one pipeline cell: its nn.LSTM call, copies, launches
    kernel_overhead_s: float = 5e-6  # one small kernel launch (elementwise, optimizer)
    activation_bytes: int = 2  # --fp16/--bf16: activations, parameters and gradients
    optimizer_bytes_per_param: int = 52  # fp16 grads -> fp32 master, clip, Adam, copy back
    # per parameter tensor: fairseq's fp16 wrapper (grad to fp32, unscale, copy back) and
    # its clipping norm run per tensor; --optimizer torch_adam's step is fused (fairseq's
    # per-parameter adam adds ~6 more)
    optimizer_kernels_per_tensor: int = 6
    random_elements_per_s: float = 0.0  # dropout masks drawn (0: bound by writing them)

    def mask_seconds(self, elements: int) -> float:
        """Drawing ``elements`` dropout-mask elements and applying them (write the mask;
        read the input and the mask, write the output)."""
        draw = (elements / self.random_elements_per_s if self.random_elements_per_s > 0
                else elements * self.activation_bytes / self.memory_bytes_per_s)
        return draw + 3 * elements * self.activation_bytes / self.memory_bytes_per_s

    def lstm_rate(self, sentences: int) -> float:
        """The LSTM's FLOP/s at this many sentences per call (the small-batch slowdown)."""
        return self.lstm_flops * min(1.0, sentences / self.lstm_saturation_sentences)

    def assumptions(self) -> Dict[str, object]:
        values = asdict(self)
        values["link"] = {"bandwidth_gbs": self.link.bandwidth_bytes_per_s / 1e9,
                          "latency_us": self.link.latency_s * 1e6}
        return values

    def lines(self) -> List[str]:
        return [
            f"profile {self.name}: {self.note}",
            f"  matrix products {rate(self.gemm_flops, 'FLOP/s')}, LSTM "
            f"{rate(self.lstm_flops, 'FLOP/s')} from {self.lstm_saturation_sentences} "
            f"sentences (fewer: proportionally slower), memory "
            f"{rate(self.memory_bytes_per_s, 'B/s')}, {8 * self.activation_bytes}-bit",
            f"  link {rate(self.link.bandwidth_bytes_per_s, 'B/s') if self.link.bandwidth_bytes_per_s else 'free'}"
            f" + {self.link.latency_s * 1e6:.0f} us per copy; {self.cell_overhead_s * 1e6:.0f} us "
            f"per pipeline cell, {self.kernel_overhead_s * 1e6:.1f} us per small kernel",
            f"  optimizer {self.optimizer_bytes_per_param} bytes per parameter, "
            f"{self.optimizer_kernels_per_tensor} kernels per parameter tensor (--optimizer torch_adam)",
        ]


def rate(value: float, unit: str) -> str:
    """``value`` with the SI prefix that keeps it readable (T, G, M)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


NVLINK_LATENCY = 10e-6

PROFILES: Dict[str, DeviceProfile] = {
    "h100-sxm": DeviceProfile(
        "h100-sxm", "H100 SXM 80GB (data sheet: 989 TFLOP/s dense bf16, 3.35 TB/s, "
        "NVLink 4 450 GB/s per direction)",
        gemm_flops=600e12, lstm_flops=200e12, lstm_saturation_sentences=64,
        memory_bytes_per_s=3.0e12, link=Link(350e9, NVLINK_LATENCY)),
    "a100-sxm": DeviceProfile(
        "a100-sxm", "A100 SXM 80GB (data sheet: 312 TFLOP/s dense bf16, 2.0 TB/s, "
        "NVLink 3 300 GB/s per direction)",
        gemm_flops=200e12, lstm_flops=62e12, lstm_saturation_sentences=64,
        memory_bytes_per_s=1.8e12, link=Link(230e9, NVLINK_LATENCY)),
    "v100": DeviceProfile(
        "v100", "V100 SXM2 32GB (data sheet: 125 TFLOP/s fp16 tensor, 0.9 TB/s, NVLink 2 "
        "hybrid cube mesh: ~50 GB/s between a pair)",
        gemm_flops=80e12, lstm_flops=25e12, lstm_saturation_sentences=64,
        memory_bytes_per_s=0.8e12, link=Link(45e9, NVLINK_LATENCY)),
}

LINKS: Dict[str, Link] = {
    "nvlink": Link(),  # the profile's own
    "pcie": Link(25e9, 15e-6),  # PCIe 4.0 x16, achieved, through the host
    "ib": Link(12e9, 20e-6),  # between machines: 100 Gb/s InfiniBand, achieved
}


def with_link(profile: DeviceProfile, link: Link) -> DeviceProfile:
    return profile if link.bandwidth_bytes_per_s <= 0 else replace(profile, link=link)


def sensitivity_variants(profile: DeviceProfile) -> Dict[str, DeviceProfile]:
    """The profile with its least certain numbers at the ends of their ranges: the LSTM's
    rate at 0.5x and 1.5x (on an H100: 100 and 300 TFLOP/s) and the small-batch slowdown
    setting in at half and twice the sentences."""
    slow, fast = profile.lstm_flops * 0.5, profile.lstm_flops * 1.5
    few, many = max(1, profile.lstm_saturation_sentences // 2), profile.lstm_saturation_sentences * 2
    return {
        f"LSTM {slow / 1e12:.0f} TFLOP/s": replace(profile, lstm_flops=slow),
        f"LSTM {fast / 1e12:.0f} TFLOP/s": replace(profile, lstm_flops=fast),
        f"LSTM full rate from {few} sent.": replace(profile, lstm_saturation_sentences=few),
        f"LSTM full rate from {many} sent.": replace(profile, lstm_saturation_sentences=many),
    }
