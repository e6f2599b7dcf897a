"""The quality study's README section (Markdown): the settings, mean ± standard deviation
over seeds per model, BLEU by source length, and each difference hybrid − input feeding
with its paired bootstrap interval, stated as found."""
from __future__ import annotations

from typing import Dict, List


def _ms(stat: Dict[str, float], digits: int = 2) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _verdict(ci: List[float]) -> str:
    if ci[0] > 0:
        return "hybrid better (the interval is above 0)"
    if ci[1] < 0:
        return "hybrid worse (the interval is below 0)"
    return "no difference detected (the interval contains 0)"


def _cell(value: Dict[str, object]) -> str:
    return f"{value['difference']:+.2f} [{value['ci95'][0]:+.2f}, {value['ci95'][1]:+.2f}]"


def markdown(report: Dict[str, object], png: str) -> str:
    s = report["settings"]
    models = report["models"]
    summary = report["summary"]
    seeds = len(s["seeds"])
    averaged = "; ".join(sorted({", ".join(map(str, r["averaged_updates"])) for r in report["runs"]}))
    lines = [
        f"Measured {report['date'][:10]} with `{report['command']}` "
        f"({report['seconds'] / 60:.0f} min{' from the first run to the last' if report.get('report_only') else ''}; "
        f"machine load average {report['machine']['loadavg_start'][0]:.1f} at "
        f"the start, {report['machine']['loadavg_end'][0]:.1f} at the end, on {report['machine']['cpus']} CPUs "
        f"shared with other work, {s['threads']} thread(s) per run, {s['jobs']} run(s) at a time: the time axis "
        "is distorted by that sharing; updates are not).",
        "",
    ]
    if report.get("partial"):
        lines += [f"**PARTIAL RESULTS: {report['partial']}.**", ""]
    lines += [
        f"Every model: 2+2 LSTM layers x 256 (embeddings, hidden, attention output), "
        f"`{s['share']}`, dropout {s['dropout']}, label smoothing {s['label_smoothing']}, "
        f"`--optimizer {s['optimizer']}` betas {s['adam_betas']}, lr {s['lr']} ({s['lr_scheduler']}), "
        f"clip-norm {s['clip_norm']}, `--max-tokens {s['max_tokens']}`, **{s['updates']} updates**, "
        f"seeds {', '.join(map(str, s['seeds']))}; validation every {s['interval']} updates; "
        f"beam {s['beam']} (max length {s['max_len_a']} x source + {s['max_len_b']}) on the "
        f"{report['test_sentences']} test sentences; \"averaged\" = the mean of the last {s['average']} "
        f"interval checkpoints (updates {averaged}). Unigram level of the validation set: perplexity "
        f"{report['unigram']['perplexity']:.0f} ({report['unigram']['bits_per_token']:.2f} bits/token).",
        "",
        f"![quality study]({png})",
        "",
        "| model | parameters | valid ppl | BLEU | chrF | BLEU (averaged) | chrF (averaged) | training s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in summary.items():
        lines.append(
            f"| {models[key]['name']} | {row['parameters']:,} | {_ms(row['valid_ppl'], 1)} | "
            f"{_ms(row['final']['bleu'])} | {_ms(row['final']['chrf'])} | {_ms(row['averaged']['bleu'])} | "
            f"{_ms(row['averaged']['chrf'])} | {_ms(row['train_seconds'], 0)} |")
    buckets = report["buckets"]
    lines += ["", f"Mean ± standard deviation over {seeds} seed(s). BLEU by source length (words), final checkpoints:",
              "", "| model | " + " | ".join(f"{b} ({v['source_words'][0]}-{v['source_words'][1]})"
                                         for b, v in buckets.items()) + " |",
              "|---|" + "---:|" * len(buckets)]
    for key, row in summary.items():
        scores = " | ".join(_ms(row["final"]["buckets"][b]) for b in buckets)
        lines.append(f"| {models[key]['name']} | {scores} |")
    lines += ["", "Differences hybrid − input feeding: difference of the seed means [95% paired bootstrap "
              "interval over test sentences: 1,000 resamples drawn as sacreBLEU's `--paired-bs` draws them, "
              "each scoring every seed]; p: sacreBLEU's own `--paired-bs` p-value of BLEU for each seed pair:", "",
              "| difference | checkpoint | BLEU | chrF | " + " | ".join(f"BLEU, {b}" for b in buckets)
              + " | p per seed |",
              "|---|---|" + "---|" * (3 + len(buckets))]
    readings = []
    for comparison in report["comparisons"].values():
        name = f"{models[comparison['system']]['name']} − {models[comparison['baseline']]['name']}"
        for kind in ("final", "averaged"):
            entry = comparison[kind]
            cells = [_cell(entry["bleu"]), _cell(entry["chrf"])] + [_cell(entry["buckets"][b]) for b in buckets]
            p = ", ".join(f"{v['bleu']['p_value']:.3f}" for v in entry["sacrebleu_paired_bs_per_seed"].values())
            lines.append(f"| {name} | {kind} | " + " | ".join(cells) + f" | {p} |")
            for label, value in (("BLEU", entry["bleu"]), ("chrF", entry["chrf"]),
                                 ("BLEU on the longest 10%", entry["buckets"]["longest 10%"])):
                readings.append(f"- {name}, {kind} checkpoints, {label}: {value['difference']:+.2f} "
                                f"[{value['ci95'][0]:+.2f}, {value['ci95'][1]:+.2f}]: {_verdict(value['ci95'])}")
    lines += ["", *readings]
    signature = next(iter(report["runs"]))["scores"]["final"]
    lines += ["", f"Signatures: BLEU `{signature['bleu_signature']}`, chrF `{signature['chrf_signature']}`. "
              "The interval covers test-set sampling only; the seed spread is the ± column."]
    return "\n".join(lines) + "\n"
