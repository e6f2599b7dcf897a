"""The quality study's results where users read them: a marked block of the README's quality
section and of docs/quality.md, written from the report (``results/quality/<name>.json``) by
``python -m benchmarks.quality`` whenever it writes the committed report, so the docs say what
the stored runs say — every number and every reading in the block comes from the report, and
``tests/test_quality_summary.py`` fails when the committed docs and report disagree.

The block lies between ``begin_marker(name)`` and ``END``; the text around it is written by hand
(method, what the study cannot say). ``refresh`` replaces the block of every file that has one
for this study, atomically, and touches nothing else.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .quality_report import mean_ci, mean_std
from .quality_store import write_text

SHORT_NAMES = {"lstm": "fairseq `lstm`", "hybrid": "`hybrid_lstm`", "hybrid_if": "`hybrid_lstm --input-feeding`"}
HEADLINE = ("hybrid", "lstm")  # the comparison the study is for: dropping input feeding, against fairseq
COLUMN_ORDER = ("lstm", "hybrid", "hybrid_if")
END = "<!-- end of the quality summary -->"


class SummaryError(ValueError):
    """A file's marked block cannot be replaced (a begin marker without its end)."""


def begin_marker(name: str) -> str:
    return (f"<!-- quality summary of `{name}`: written by python -m benchmarks.quality from "
            f"results/quality/{name}.json (benchmarks/quality_summary.py); edit those, not this block -->")


def _short(report: Dict[str, object], key: str) -> str:
    return SHORT_NAMES.get(key, report["models"][key]["name"])


def _signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def _ci(ci: Optional[Sequence[float]]) -> str:
    return "n/a" if ci is None else f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def seed_ranges(seeds: Sequence[int]) -> str:
    """1, 2, 3, 5 -> '1–3, 5'."""
    parts: List[str] = []
    ordered = sorted(seeds)
    start = previous = ordered[0] if ordered else None
    for seed in ordered[1:] + [None]:
        if seed is not None and seed == previous + 1:
            previous = seed
            continue
        parts.append(str(start) if start == previous else f"{start}–{previous}")
        start = previous = seed
    return ", ".join(parts)


def lowest_to_highest(stat: Dict[str, object]) -> str:
    """'lowest-highest' of a measure over a model's seeds (what one run may score: the demo is one)."""
    return f"{min(stat['values']):.2f}-{max(stat['values']):.2f}"


def _columns(report: Dict[str, object]) -> List[str]:
    present = report["summary"]
    return [k for k in COLUMN_ORDER if k in present] + [k for k in present if k not in COLUMN_ORDER]


def runs_line(report: Dict[str, object]) -> str:
    summary, settings = report["summary"], report["settings"]
    keys = _columns(report)
    seeds = {k: summary[k]["seeds"] for k in keys}
    done = sum(len(s) for s in seeds.values())
    planned = sum(settings["if_seeds"] if key == "hybrid_if" else len(settings["seeds"]) for key in report["models"])
    if len({tuple(s) for s in seeds.values()}) == 1:
        which = f"seeds {seed_ranges(seeds[keys[0]])} of every model"
    else:
        which = "; ".join(f"{_short(report, k)} seeds {seed_ranges(s)}" for k, s in seeds.items())
    if report.get("partial"):
        return (f"**{done} of {planned} runs are in** ({which}); the numbers below are theirs, and the report "
                "says \"PARTIAL RESULTS\" until the plan is complete.")
    return f"**All {done} runs are in** ({which})."


def table(report: Dict[str, object]) -> List[str]:
    summary, keys = report["summary"], _columns(report)
    time = (report.get("time_to_quality") or {}).get("models", {})
    common = (report.get("time_to_quality") or {}).get("common_loss")

    def row(label: str, cell) -> str:
        return f"| {label} | " + " | ".join(cell(k) for k in keys) + " |"

    measures = {k: summary[k]["measures"] for k in keys}
    longest = next((m for m in measures[keys[0]] if m.startswith("BLEU, longest")), None)
    probe = next((m for m in measures[keys[0]] if m.startswith("BLEU, made-up probe") and "lenpen" not in m), None)
    lines = ["| | " + " | ".join(_short(report, k) for k in keys) + " |", "| --- |" + " ---: |" * len(keys),
             row("test BLEU / chrF", lambda k: f"{mean_std(measures[k]['BLEU'])} / {mean_std(measures[k]['chrF'])}"),
             row("test BLEU, lowest-highest seed", lambda k: lowest_to_highest(measures[k]["BLEU"]))]
    if longest:
        lines.append(row(longest, lambda k: mean_std(measures[k][longest])))
    if probe:
        lines.append(row(probe.replace("made-up probe", "made-up long probe of joined pairs"),
                         lambda k: mean_std(measures[k][probe])))
    lines.append(row("best validation loss at update", lambda k: mean_std(summary[k]["best_updates"], 0)))
    lines.append(row("training target tokens/s, one thread (undisturbed intervals)",
                     lambda k: f"{summary[k]['tokens_per_second']['mean']:,.0f}"))
    if time:
        lines.append(row(f"one-thread minutes to the loss every run reaches ({common:.3f}), mean [95% interval]",
                         lambda k: mean_ci(time.get(k, {}).get("common", {}).get("one_thread_seconds"), 60, 1)))
        lines.append(row("one-thread minutes to the run's own best loss",
                         lambda k: mean_ci(time.get(k, {}).get("own_best", {}).get("one_thread_seconds"), 60, 1)))
    lines.append(row("peak memory per process (RSS)", lambda k: f"{summary[k]['peak_rss_mib']['mean']:,.0f} MiB"))
    return lines


def difference_line(report: Dict[str, object], comparison: Dict[str, object]) -> str:
    system, baseline = comparison["system"], comparison["baseline"]
    m = comparison["measures"]["BLEU"]
    eq = m["equivalence"]
    width = eq["width"]
    name = f"{_short(report, system)} − {_short(report, baseline)}"
    if {system, baseline} == {"hybrid", "hybrid_if"}:
        name = f"dropping input feeding in the same code ({name})"
    halves = [h for h in (width["bootstrap_half_width"], width["welch_half_width"]) if h is not None]
    text = (f"- **{name[0].upper() + name[1:]}: BLEU {_signed(m['difference'])}, {_ci(m['bootstrap']['ci95'])} and "
            f"{_ci(m['welch']['ci95'])}: {eq['reading']}** (90% intervals {_ci(eq['bootstrap_ci90'])} and "
            f"{_ci(eq['welch_ci90'])})")
    if (system, baseline) == HEADLINE and halves:
        text += (f". Half-widths {' and '.join(f'±{h:.2f}' for h in halves)} against the target "
                 f"±{width['target']:g}: {'met' if width['met'] else 'not met'}")
        if not width["met"] and width["seeds_needed"]:
            text += f"; at this seed spread Welch's interval needs {width['seeds_needed']} seeds per model"
    return text + "."


def time_line(report: Dict[str, object]) -> Optional[str]:
    ratios = (report.get("time_to_quality") or {}).get("ratios_to_common", {})
    ratio = ratios.get(" / ".join(HEADLINE))
    if not ratio or not ratio.get("one_thread_seconds") or not ratio.get("train_tokens"):
        return None
    t, n = ratio["one_thread_seconds"], ratio["train_tokens"]
    system, baseline = (_short(report, k) for k in HEADLINE)
    return (f"- **Time**: {system} reaches the common validation loss in {t['ratio']:.2f} "
            f"[{t['ci95'][0]:.2f}, {t['ci95'][1]:.2f}] of {baseline}'s one-thread training time (ratio of the means, "
            f"seed bootstrap), on {n['ratio']:.2f} [{n['ci95'][0]:.2f}, {n['ci95'][1]:.2f}] of its target tokens.")


def conclusion(report: Dict[str, object]) -> Optional[str]:
    """What the headline comparison allows, in one sentence, from its reading and intervals."""
    comparison = next((c for c in report["comparisons"].values()
                       if (c["system"], c["baseline"]) == HEADLINE), None)
    if comparison is None:
        return None
    m = comparison["measures"]["BLEU"]
    eq = m["equivalence"]
    seeds = min(len(report["summary"][k]["seeds"]) for k in HEADLINE)
    lows = [ci[0] for ci in (m["bootstrap"]["ci95"], m["welch"]["ci95"]) if ci]
    highs = [ci[1] for ci in (m["bootstrap"]["ci95"], m["welch"]["ci95"]) if ci]
    margin = eq["margin"]
    if eq["direction"]:
        verb = "gains" if eq["direction"] > 0 else "costs"
        text = (f"dropping input feeding {verb} {abs(m['difference']):.2f} BLEU against fairseq's `lstm` "
                f"(both 95% intervals exclude 0)")
        if eq["equivalent"]:
            text += f", a difference inside the ±{margin:g} BLEU margin (both 90% intervals inside it)"
    elif eq["equivalent"]:
        text = (f"dropping input feeding changes BLEU by less than {margin:g} against fairseq's `lstm` "
                f"(both 90% intervals inside ±{margin:g}; difference {_signed(m['difference'])})")
    else:
        text = (f"{seeds} seeds per model detect no BLEU difference between `hybrid_lstm` and fairseq's `lstm`, "
                f"and cannot rule out one between {_signed(min(lows))} and {_signed(max(highs))} (the 95% "
                "intervals' ends)")
    tps = {k: report["summary"][k]["tokens_per_second"]["mean"] for k in HEADLINE}
    return (f"What the runs say{'' if not report.get('partial') else ' so far'}: at this size, on this sample, "
            f"{text}; `hybrid_lstm` trains {tps['hybrid'] / tps['lstm']:.2f}x as many target tokens per second "
            "per thread as fairseq's `lstm`.")


def summary(report: Dict[str, object]) -> str:
    """The block's text (markers included) for ``report``."""
    lines = [begin_marker(report["name"]), runs_line(report), "", "Mean ± standard deviation over seeds:", ""]
    lines += table(report)
    lines += ["", "Differences of the seed means, with 95% intervals that include the seed spread (seed-level "
              "bootstrap over seeds and sentences; Welch's t over seeds), and the equivalence reading stated in "
              "advance (two one-sided tests at ±0.5 BLEU: both 90% intervals inside the margin):", ""]
    lines += [difference_line(report, c) for c in report["comparisons"].values()]
    lines += [line for line in (time_line(report),) if line]
    said = conclusion(report)
    if said:
        lines += ["", said]
    return "\n".join(lines + [END])


def replace_block(text: str, name: str, block: str, where: str = "text") -> Optional[str]:
    """``text`` with its block for study ``name`` replaced by ``block``; None when it has none."""
    begin = text.find(begin_marker(name))
    if begin < 0:
        return None
    end = text.find(END, begin)
    if end < 0:
        raise SummaryError(f"{where}: the quality summary of {name!r} begins but has no {END!r} line")
    return text[:begin] + block + text[end + len(END):]


def refresh(report: Dict[str, object], paths: Sequence[Path]) -> List[Path]:
    """Rewrite the block of each file in ``paths`` that has one for this study; the changed files."""
    block, changed = summary(report), []
    for path in paths:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = replace_block(text, report["name"], block, str(path))
        if new is not None and new != text:
            write_text(path, new)
            changed.append(path)
    return changed


def blocks(text: str) -> List[str]:
    """The names of the studies whose blocks ``text`` carries."""
    return re.findall(r"<!-- quality summary of `([^`]+)`", text)
