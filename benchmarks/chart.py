"""The scaling report as a PNG: training throughput per configuration (median bar, min-max
whiskers over the repeats, each bar labelled with its ratio to (a) and (b)) and, when
measured, beam-search throughput of (a) and (b)."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Dict

import matplotlib

matplotlib.use("Agg")
logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
import matplotlib.pyplot as plt  # noqa: E402


def draw(report: Dict[str, object], path: Path) -> None:
    training = report["training"]
    generation = report.get("generation") or {}
    panels = 2 if generation else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 + 3 * panels, 4.8),
                             gridspec_kw={"width_ratios": [3, 1][:panels]}, squeeze=False)
    ax = axes[0][0]
    keys = list(training)
    medians = [training[k]["target_tokens_per_s"] for k in keys]
    lows = [m - min(r["target_wps"] for r in training[k]["runs"]) for k, m in zip(keys, medians)]
    highs = [max(r["target_wps"] for r in training[k]["runs"]) - m for k, m in zip(keys, medians)]
    colors = ["#888888" if k == "a" else "#4C72B0" if k.startswith("b") else "#DD8452" for k in keys]
    bars = ax.bar(range(len(keys)), medians, yerr=[lows, highs], capsize=4, color=colors)
    for bar, key in zip(bars, keys):
        labels = []
        for base in ("a", "b"):
            if base in training and key != base:
                ratio = training[key]["target_tokens_per_s"] / training[base]["target_tokens_per_s"]
                labels.append(f"{ratio:.2f}x {base}")
        ax.annotate("\n".join(labels), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 6), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"({k})\n{training[k]['name']}".replace(", ", "\n", 1) for k in keys], fontsize=7)
    ax.set_ylabel("target tokens/s (median of repeats)")
    ax.set_ylim(0, max(m + h for m, h in zip(medians, highs)) * 1.3)
    devices = ",".join(report["devices"])
    ax.set_title(f"training, preset {report['preset']}, devices {devices}, same total batch", fontsize=10)
    if generation:
        gx = axes[0][1]
        values = [generation["median_tokens_per_s"][k] for k in ("a", "b")]
        gbars = gx.bar([0, 1], values, color=["#888888", "#4C72B0"])
        gx.annotate(f"{generation['ratio_b_over_a_tokens_per_s']:.2f}x a",
                    (gbars[1].get_x() + gbars[1].get_width() / 2, values[1]), xytext=(0, 6),
                    textcoords="offset points", ha="center", fontsize=8)
        gx.set_xticks([0, 1])
        gx.set_xticklabels(["(a) fairseq\nlstm", "(b) hybrid\nlstm"], fontsize=7)
        gx.set_ylabel("generated tokens/s")
        gx.set_ylim(0, max(values) * 1.25)
        gx.set_title(f"beam {generation['beam']}", fontsize=10)
    machine = report["machine"]
    fig.text(0.01, 0.01, f"{machine['platform']}, {machine['cpus']} CPUs, torch {machine['torch']}"
             + (f", {', '.join(machine['cuda'])}" if machine["cuda"] else ""), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as tmp:
        fig.savefig(tmp.name, dpi=110)
    plt.close(fig)
    os.replace(tmp.name, path)
