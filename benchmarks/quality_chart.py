"""The quality study as a PNG: validation loss against updates and against training
seconds (mean over seeds, min-max band), and BLEU by source-length bucket (bar = mean over
seeds, dots = seeds) for the final and the averaged checkpoints."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"lstm": "#888888", "hybrid": "#4C72B0", "hybrid_if": "#DD8452"}


def _curves(ax, report: Dict[str, object], axis: str) -> None:
    for key, model in report["models"].items():
        runs = [r for r in report["runs"] if r["model"] == key]
        if not runs:
            continue
        points = min(len(r["curve"]) for r in runs)
        loss = np.array([[p["nll_loss"] for p in r["curve"][:points]] for r in runs])
        x = np.array([[p[axis] for p in r["curve"][:points]] for r in runs]).mean(0)
        color = COLORS.get(key)
        ax.plot(x, loss.mean(0), color=color, label=f"{model['name']} ({len(runs)} seed{'s' * (len(runs) > 1)})")
        ax.fill_between(x, loss.min(0), loss.max(0), color=color, alpha=0.25, linewidth=0)
    unigram = report["unigram"]["bits_per_token"]
    ax.axhline(unigram, color="#AA3333", linestyle=":", linewidth=1)
    ax.annotate(f"unigram level (ppl {report['unigram']['perplexity']:.0f})", (ax.get_xlim()[1], unigram),
                xytext=(-4, -10), textcoords="offset points", ha="right", fontsize=7, color="#AA3333")
    ax.set_xlabel("updates" if axis == "updates" else "training seconds (sum of fairseq train_wall)")
    ax.set_ylabel("validation nll loss (bits/token)")
    ax.grid(alpha=0.3)


def _buckets(ax, report: Dict[str, object], kind: str) -> None:
    models = [k for k in report["models"] if any(r["model"] == k for r in report["runs"])]
    groups: List[str] = ["all", *report["buckets"]]
    width = 0.8 / max(1, len(models))
    for m, key in enumerate(models):
        runs = [r for r in report["runs"] if r["model"] == key and kind in r["scores"]]
        per_seed = np.array([[r["scores"][kind]["bleu"] if g == "all" else r["scores"][kind]["buckets"][g]["bleu"]
                              for g in groups] for r in runs])
        if not len(per_seed):
            continue
        x = np.arange(len(groups)) + (m - (len(models) - 1) / 2) * width
        ax.bar(x, per_seed.mean(0), width, color=COLORS.get(key), alpha=0.8, label=report["models"][key]["name"])
        for row in per_seed:
            ax.scatter(x, row, s=10, color="black", zorder=3)
    ax.set_xticks(range(len(groups)))
    words = {g: report["buckets"][g]["source_words"] for g in report["buckets"]}
    labels = ["all"] + [f"{g}\n({words[g][0]}-{words[g][1]} words)"
                        for g in groups[1:]]
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("sacreBLEU")
    average = report["settings"]["average"]
    title = "final checkpoint" if kind == "final" else f"average of the last {average} checkpoints"
    ax.set_title(f"test BLEU by source length, beam {report['settings']['beam']}: {title}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def draw(report: Dict[str, object], path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _curves(axes[0][0], report, "updates")
    _curves(axes[0][1], report, "train_seconds")
    axes[0][0].set_title("validation loss vs updates (mean, min-max over seeds)", fontsize=9)
    axes[0][1].set_title("validation loss vs training time (shared machine: see load)", fontsize=9)
    axes[0][0].legend(fontsize=8)
    _buckets(axes[1][0], report, "final")
    _buckets(axes[1][1], report, "averaged")
    axes[1][0].legend(fontsize=8)
    machine = report["machine"]
    fig.text(0.01, 0.005, f"{report['name']}: {report['date']}, {machine['platform']}, {machine['cpus']} CPUs, "
             f"{report['settings']['threads']} thread(s)/run, {report['settings']['jobs']} run(s) at a time, "
             f"load {machine['loadavg_start'][0]:.1f} -> {machine['loadavg_end'][0]:.1f}"
             + (f"; PARTIAL: {report['partial']}" if report.get("partial") else ""), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as tmp:
        fig.savefig(tmp.name, dpi=100)
    plt.close(fig)
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)
