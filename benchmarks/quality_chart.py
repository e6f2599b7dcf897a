"""The quality study as a PNG: validation loss against updates and against training
seconds (one line per run, the best checkpoint marked), BLEU by source-length bucket and on
the made-up probe (bar = mean over seeds, dots = seeds), and validation BLEU against the
length penalty."""
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
import numpy as np  # noqa: E402

COLORS = {"lstm": "#888888", "hybrid": "#4C72B0", "hybrid_if": "#DD8452"}


def _curves(ax, report: Dict[str, object], axis: str, title: str) -> None:
    for key, model in report["models"].items():
        runs = [r for r in report["runs"] if r["model"] == key]
        for n, run in enumerate(runs):
            x = [p[axis] for p in run["curve"]]
            ax.plot(x, [p["nll_loss"] for p in run["curve"]], color=COLORS.get(key), linewidth=1, alpha=0.8,
                    label=f"{model['name']} ({len(runs)} seeds)" if n == 0 else None)
            best = next(p for p in run["curve"] if p["updates"] == run["stop"]["best_updates"])
            ax.scatter([best[axis]], [best["nll_loss"]], color=COLORS.get(key), s=12, zorder=3)
    unigram = report["unigram"]["bits_per_token"]
    ax.axhline(unigram, color="#AA3333", linestyle=":", linewidth=1)
    ax.set_xlabel("updates" if axis == "updates" else "training seconds (sum of fairseq train_wall)")
    ax.set_ylabel("validation nll loss (bits/token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def _measures(ax, report: Dict[str, object]) -> None:
    summary = report["summary"]
    labels = [k for k in next(iter(summary.values()))["measures"] if k.startswith("BLEU") and "best lenpen" not in k]
    width = 0.8 / max(1, len(summary))
    for m, key in enumerate(summary):
        runs = [r for r in report["runs"] if r["model"] == key]
        per_seed = np.array([[r["measures"][label] for label in labels] for r in runs])
        x = np.arange(len(labels)) + (m - (len(summary) - 1) / 2) * width
        ax.bar(x, per_seed.mean(0), width, color=COLORS.get(key), alpha=0.8, label=report["models"][key]["name"])
        for row in per_seed:
            ax.scatter(x, row, s=8, color="black", zorder=3)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([label.replace("BLEU, ", "").replace(" (", "\n(") for label in labels], fontsize=7)
    ax.set_ylabel("sacreBLEU (lenpen 1.0)")
    ax.set_title("test BLEU: all, by source length, made-up long probe", fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def _lenpen(ax, report: Dict[str, object]) -> None:
    for key, model in report["models"].items():
        runs = [r for r in report["runs"] if r["model"] == key]
        if not runs:
            continue
        lenpens = sorted(runs[0]["lenpen_valid_bleu"], key=float)
        values = np.array([[r["lenpen_valid_bleu"][lp] for lp in lenpens] for r in runs])
        ax.errorbar([float(lp) for lp in lenpens], values.mean(0), yerr=values.std(0), color=COLORS.get(key),
                    marker="o", markersize=3, capsize=2, label=model["name"])
    ax.set_xlabel("--lenpen")
    ax.set_ylabel("validation BLEU (mean ± sd over seeds)")
    ax.set_title("length penalty sweep on the validation set", fontsize=9)
    ax.grid(alpha=0.3)


def draw(report: Dict[str, object], path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _curves(axes[0][0], report, "updates", "validation loss per run (dots: best checkpoint; dotted: unigram level)")
    _curves(axes[0][1], report, "train_seconds", "the same against training time (a shared machine: indicative)")
    axes[0][0].legend(fontsize=8)
    _measures(axes[1][0], report)
    axes[1][0].legend(fontsize=8)
    _lenpen(axes[1][1], report)
    fig.text(0.01, 0.005, f"{report['name']}: {report['date']}" + (f"; PARTIAL: {report['partial']}"
                                                                   if report.get("partial") else ""),
             fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as tmp:
        fig.savefig(tmp.name, dpi=100)
    plt.close(fig)
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)
