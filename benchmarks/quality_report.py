"""The quality study's results as Markdown (``results/quality/<name>.md``, linked from
docs/quality.md): settings and budget, per model mean ± standard deviation over seeds of
quality, stopping point, speed and memory, and each difference with its two seed-level
intervals and the reading they allow (``quality_stats.verdict``; for BLEU the equivalence
reading of ``quality_equivalence``), and each model's time to quality (``quality_time``)."""
from __future__ import annotations

from typing import Dict, List, Optional

RECIPE = {"sample": "recipes/sample/run.sh", "wmt": "recipes/lib/wmt.sh"}  # whose training settings


def mean_std(stat: Dict[str, float], digits: int = 2) -> str:
    """'mean ± standard deviation' of a model's seeds."""
    return f"{stat['mean']:,.{digits}f} ± {stat['std']:,.{digits}f}"


def _ci(ci: Optional[List[float]]) -> str:
    return "n/a (< 2 seeds or no spread)" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _growth(settings: Dict[str, object]) -> str:
    grow_to = settings.get("grow_to")
    return (f"; grown by the seed spread while the hybrid_lstm − fairseq lstm interval is wider than its target, "
            f"at most {grow_to} (`--grow-to`)" if grow_to else "")


def markdown(report: Dict[str, object], png: str) -> str:
    s = report["settings"]
    models, summary = report["models"], report["summary"]
    tokens = [row["train_tokens"]["mean"] / max(1.0, row["last_updates"]["mean"]) for row in summary.values()]
    lines = [f"# Quality study `{report['name']}`", "",
             f"Made {report['date'][:10]} with `{report['command']}`"
             f"{' (report from the stored runs)' if report.get('report_only') else ''}.", ""]
    if report.get("partial"):
        lines += [f"**PARTIAL RESULTS: {report['partial']}.** Intervals and readings below cover only the "
                  "finished runs.", ""]
    lines += [
        f"Every model: `{s['sizes'] or 'the sizes of its --arch'}`, "
        f"`{s['share'] or 'no shared embeddings'}`, dropout {s['dropout']}, label smoothing "
        f"{s['label_smoothing']}, `--optimizer {s['optimizer']}` betas {s['adam_betas']}, lr {s['lr']} "
        f"(`{s['lr_scheduler']}`, as `{RECIPE[s.get('preset', 'sample')]}`), clip-norm {s['clip_norm']}, `--max-tokens "
        f"{s['max_tokens']}`. **Budget, the same for every model: at most {s['max_update']:,} updates** "
        f"(about {s['max_update'] * sum(tokens) / len(tokens):,.0f} target tokens at the measured tokens per "
        f"update); validation every {s['interval']} updates, stop after `--patience {s['patience']}` "
        f"validations without a lower loss; scored at `checkpoint_best.pt`. Seeds {s['seeds']} "
        f"(`hybrid_lstm --input-feeding`: the first {s['if_seeds']}"
        f"{_growth(s)}); {s['threads']} thread(s) per run, "
        f"{s['jobs']} run(s) at a time. Beam {s['beam']}, max length {s['max_len_a']} x source + "
        f"{s['max_len_b']}; length penalty: the default 1.0 and each run's best of {list(s['lenpens'])} on "
        f"the validation set. {report['test_sentences']} test sentences; the probe: "
        f"{report['probe']['pairs']} **made-up** pairs of consecutive test pairs joined to 30-60 source "
        f"words. Unigram level of the validation set: perplexity {report['unigram']['perplexity']:.0f}.",
        "", f"![quality study]({png})", "",
        "| model | seeds | parameters | stopped by patience | best at update | within 1% of best at | "
        "last update | best valid ppl | train tokens/s (undisturbed) | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, row in summary.items():
        lines.append(
            f"| {models[key]['name']} | {len(row['seeds'])} | {row['parameters']:,} | "
            f"{row['stopped_by_patience']}/{len(row['seeds'])} | {mean_std(row['best_updates'], 0)} | "
            f"{mean_std(row['updates_to_within_1pct'], 0)} | {mean_std(row['last_updates'], 0)} | "
            f"{mean_std(row['best_valid_ppl'], 1)} | {mean_std(row['tokens_per_second'], 0)} | "
            f"{mean_std(row['peak_rss_mib'], 0)} |")
    labels = list(next(iter(summary.values()))["measures"])
    lines += ["", "Mean ± standard deviation over seeds (sacreBLEU and chrF2, detokenized; "
              "\"best lenpen\" = each run's own best on the validation set):", "",
              "| measure | " + " | ".join(models[k]["name"] for k in summary) + " |",
              "|---|" + "---:|" * len(summary)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(mean_std(row["measures"][label]) for row in summary.values())
                     + " |")
    lines.append("| chosen lenpen per seed | " + " | ".join(", ".join(map(str, row["best_lenpen"]))
                                                        for row in summary.values()) + " |")
    lines.append("| hypothesis/reference length (lenpen 1.0) | "
                 + " | ".join(mean_std(row["length_ratio"], 3) for row in summary.values()) + " |")
    lines += equivalence_section(report) + time_section(report)
    lines += ["", "Differences (system − baseline) of the seed means. *Seed-level bootstrap*: 95% interval of "
              "resamples that draw the seeds of each model and the test sentences together. *Welch t*: 95% "
              "interval over the per-seed scores. A direction is read only when both exclude 0; BLEU rows "
              "also read equivalence within the margin (both 90% intervals inside it), else \"not decided\".", "",
              "| difference | measure | difference | seed-level bootstrap | Welch t (p) | reading |",
              "|---|---|---:|---|---|---|"]
    for comparison in report["comparisons"].values():
        name = f"{models[comparison['system']]['name']} − {models[comparison['baseline']]['name']}"
        for label, m in comparison["measures"].items():
            p = m["welch"]["p_value"]
            lines.append(f"| {name} | {label} | {m['difference']:+.2f} | {_ci(m['bootstrap']['ci95'])} | "
                         f"{_ci(m['welch']['ci95'])}{'' if p is None else f' ({p:.3f})'} | "
                         f"{m['equivalence']['reading'] if 'equivalence' in m else m['verdict']} |")
    signature = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp (sacreBLEU BLEU), chrF2 defaults"
    lines += ["", f"Scores: {signature}. What this can say: on this 14.5K-pair sample, with the settings above, "
              "whether dropping input feeding changes BLEU/chrF by more than the seed spread. What it cannot: "
              "anything about WMT-sized data or the paper's 4+4 x 1000 models; the probe's long inputs are "
              "joined sentences, not real long sentences."]
    return "\n".join(lines) + "\n"


EQUIVALENCE_MEASURES = ("BLEU", "BLEU, best lenpen")


def _name(report: Dict[str, object], comparison: Dict[str, object]) -> str:
    models = report["models"]
    return f"{models[comparison['system']]['name']} − {models[comparison['baseline']]['name']}"


def equivalence_section(report: Dict[str, object]) -> List[str]:
    """The TOST reading of the BLEU differences and their intervals' width against the target."""
    first = next(iter(report["comparisons"].values()), None)
    if first is None:
        return []
    eq = first["measures"]["BLEU"]["equivalence"]
    lines = ["", f"**Equivalence** (stated in advance, docs/quality.md): two one-sided tests at a margin of "
             f"±{eq['margin']:g} BLEU, 5% each side: *equivalent within {eq['margin']:g} BLEU* when both "
             "seed-level 90% intervals lie inside the margin; *worse/better by* when both 95% intervals "
             "exclude 0; else *not decided*. Width: the 95% intervals' half-width against the target "
             f"±{eq['width']['target']:g} BLEU (for hybrid_lstm − fairseq lstm), and the seeds per model "
             "Welch's interval needs at the observed seed spread.", "",
             "| difference | measure | difference | 90%: bootstrap | 90%: Welch (TOST p) | reading | "
             f"95% half-width: bootstrap / Welch | narrower than ±{eq['width']['target']:g} | seeds each needed |",
             "|---|---|---:|---|---|---|---|---|---:|"]
    for comparison in report["comparisons"].values():
        for label in EQUIVALENCE_MEASURES:
            m = comparison["measures"][label]
            eq, w = m["equivalence"], m["equivalence"]["width"]
            p = eq["welch_tost_p"]
            halves = " / ".join("n/a" if h is None else f"±{h:.2f}" for h in (w["bootstrap_half_width"],
                                                                             w["welch_half_width"]))
            lines.append(f"| {_name(report, comparison)} | {label} | {m['difference']:+.2f} | "
                         f"{_ci(eq['bootstrap_ci90'])} | {_ci(eq['welch_ci90'])}"
                         f"{'' if p is None else f' ({p:.3f})'} | **{eq['reading']}** | {halves} | "
                         f"{'yes' if w['met'] else 'no'} | {w['seeds_needed'] or 'n/a'} |")
    return lines


def mean_ci(stat: Optional[Dict[str, object]], scale: float = 1.0, digits: int = 0) -> str:
    """'mean [95% interval]' over seeds, each divided by ``scale``."""
    if not stat:
        return "n/a"
    mean, ci = stat["mean"] / scale, stat["ci95"]
    interval = "" if ci is None else f" [{ci[0] / scale:,.{digits}f}, {ci[1] / scale:,.{digits}f}]"
    return f"{mean:,.{digits}f}{interval}"


def time_section(report: Dict[str, object]) -> List[str]:
    """Time to quality: each model's updates, tokens and one-thread minutes to its own best and
    to the common loss, beside its BLEU; the ratios of the means to the common loss."""
    time = report.get("time_to_quality")
    if not time:
        return []
    lines = ["", f"**Time to quality** (from the stored curves, each run as if uninterrupted): to each run's own "
             f"best validation loss, and to the common loss {time['common_loss']:.3f} (the highest of all runs' "
             "best losses, which every run reaches); the first validation at or below it, no interpolation. "
             "One-thread minutes = target tokens / the run's undisturbed tokens/s (the niced runs' wall "
             "time was disturbed). Mean [95% t interval] over seeds.", "",
             "| model | BLEU | own best: updates | M target tokens | one-thread minutes | common loss: updates | "
             "M target tokens | one-thread minutes |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, row in time["models"].items():
        cells = [mean_ci(row["bleu"], digits=2)]
        for target in ("own_best", "common"):
            cells += [mean_ci(row[target].get("updates")), mean_ci(row[target].get("train_tokens"), 1e6, 2),
                      mean_ci(row[target].get("one_thread_seconds"), 60, 1)]
        lines.append(f"| {report['models'][key]['name']} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, ratio in time["ratios_to_common"].items():
        system, baseline = name.split(" / ")
        parts = [f"{what} {r['ratio']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"
                 for what, r in (("one-thread time", ratio.get("one_thread_seconds")),
                                 ("target tokens", ratio.get("train_tokens"))) if r]
        lines.append(f"- {report['models'][system]['name']} / {report['models'][baseline]['name']}, to the common "
                     f"loss (ratio of the means, 95% seed bootstrap): " + "; ".join(parts))
    return lines
