"""The quality study's analysis of the stored runs: each run's scores, each model's mean
and spread over seeds (quality, stopping point, speed, memory), each difference with its
two seed-level intervals and the wording they allow (``quality_stats``), the BLEU
differences' equivalence reading (``quality_equivalence``), and each model's time to
quality (``quality_time``)."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from . import quality_equivalence, quality_time
from . import quality_stats as qs
from .quality_runs import undisturbed_speed

COMPARISONS = [("hybrid", "lstm"), ("hybrid", "hybrid_if"), ("hybrid_if", "lstm")]
OUTPUTS = ("test@default", "test@best", "probe@default", "probe@best")


def _refs(test: Dict[str, List[str]], label: str) -> List[str]:
    return test["references"] if label.startswith("test") else test["probe_references"]


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Hypothesis / reference length in BLEU's tokens (BLEU's ``ratio``)."""
    result = qs.new_metric("bleu").corpus_score(list(hypotheses), [list(references)])
    return round(result.sys_len / result.ref_len, 3) if result.ref_len else 0.0


def run_scores(hyps: Dict[str, List[str]], test: Dict[str, List[str]]) -> Dict[str, Dict[str, float]]:
    """BLEU, chrF and the length ratio of each output of one run (whole sets)."""
    out = {}
    for label in OUTPUTS:
        refs = _refs(test, label)
        out[label] = {m: round(qs.new_metric(m).corpus_score(hyps[label], [refs]).score, 2) for m in qs.METRICS}
        out[label]["length_ratio"] = length_ratio(hyps[label], refs)
    return out


def measures(test: Dict[str, List[str]], buckets: Dict[str, Dict[str, object]]) -> List[Tuple[str, str, str, object]]:
    """(label, output, metric, sentence subset or None) of every number compared."""
    rows = [("BLEU", "test@default", "bleu", None), ("chrF", "test@default", "chrf", None),
            ("BLEU, best lenpen", "test@best", "bleu", None), ("chrF, best lenpen", "test@best", "chrf", None)]
    rows += [(f"BLEU, {name} ({b['source_words'][0]}-{b['source_words'][1]} words)", "test@default", "bleu",
              b["indices"]) for name, b in buckets.items()]
    words = [sum(len(test["sources"][i].split()) for i in g) for g in test["probe_groups"]] or [0]
    probe = f"made-up probe ({min(words)}-{max(words)} words)"
    rows += [(f"BLEU, {probe}", "probe@default", "bleu", None), (f"chrF, {probe}", "probe@default", "chrf", None),
             (f"BLEU, {probe}, best lenpen", "probe@best", "bleu", None)]
    return rows


def analyse(records: List[Dict[str, object]], hyps: List[Dict[str, List[str]]], test: Dict[str, List[str]],
            samples: int = qs.BOOTSTRAP_SAMPLES) -> Dict[str, object]:
    buckets = qs.length_buckets([len(s.split()) for s in test["sources"]])
    rows = measures(test, buckets)
    # per-sentence statistics of every run, output and metric (computed once)
    stats: Dict[Tuple[int, str, str], object] = {}
    per_run: List[Dict[str, float]] = []
    for i, h in enumerate(hyps):
        values = {}
        for label, output, metric, subset in rows:
            key = (i, output, metric)
            if key not in stats:
                stats[key] = qs.sentence_stats(metric, h[output], _refs(test, output))
            chosen = stats[key] if subset is None else stats[key][subset]
            values[label] = qs.corpus_scorer(metric)(chosen.sum(0))
        per_run.append(values)
    for record, values in zip(records, per_run):
        record["measures"] = {k: round(v, 2) for k, v in values.items()}
    summary = {}
    for key in dict.fromkeys(r["model"] for r in records):
        mine = [r for r in records if r["model"] == key]
        summary[key] = {
            "seeds": [r["seed"] for r in mine], "parameters": mine[0]["parameters"],
            "measures": {label: qs.mean_std([r["measures"][label] for r in mine]) for label, *_ in rows},
            "best_valid_ppl": qs.mean_std([r["stop"]["best_ppl"] for r in mine]),
            "best_updates": qs.mean_std([r["stop"]["best_updates"] for r in mine]),
            "last_updates": qs.mean_std([r["stop"]["last_updates"] for r in mine]),
            "updates_to_within_1pct": qs.mean_std([r["stop"]["updates_to_within_1pct"] for r in mine]),
            "stopped_by_patience": sum(r["stop"]["stopped_by"] == "patience" for r in mine),
            "train_tokens": qs.mean_std([r["train_tokens"] for r in mine]),
            "train_seconds": qs.mean_std([r["train_seconds"] for r in mine]),
            # from the stored curve, so runs stored before this estimate get it too; None
            # with fewer than two validations (tiny runs only)
            "tokens_per_second": qs.mean_std([speed for speed in (undisturbed_speed(r["curve"]) for r in mine)
                                              if speed]),
            "peak_rss_mib": qs.mean_std([r["memory"]["peak_rss_bytes"] / 2 ** 20 for r in mine
                                         if r["memory"]["peak_rss_bytes"]]),
            "best_lenpen": [r["best_lenpen"] for r in mine],
            "length_ratio": qs.mean_std([r["scores"]["test@default"]["length_ratio"] for r in mine]),
        }
    comparisons = {}
    for system, baseline in COMPARISONS:
        if system not in summary or baseline not in summary:
            continue
        sys_i = [i for i, r in enumerate(records) if r["model"] == system]
        base_i = [i for i, r in enumerate(records) if r["model"] == baseline]
        entry = {"system": system, "baseline": baseline, "measures": {}}
        for label, output, metric, subset in rows:
            def pick(indices):
                return [stats[(i, output, metric)] if subset is None else stats[(i, output, metric)][subset]
                        for i in indices]
            boot = qs.hierarchical_bootstrap(pick(sys_i), pick(base_i), qs.corpus_scorer(metric), samples)
            sys_scores, base_scores = [per_run[i][label] for i in sys_i], [per_run[i][label] for i in base_i]
            welch = qs.welch_interval(sys_scores, base_scores)
            unit = "BLEU" if metric == "bleu" else "chrF"
            entry["measures"][label] = {
                "difference": boot["difference"], "bootstrap": boot, "welch": welch,
                "verdict": qs.verdict(boot["ci95"], welch["ci95"], boot["difference"], unit, system)}
            if metric == "bleu":  # the margin is in BLEU
                entry["measures"][label]["equivalence"] = quality_equivalence.equivalence(
                    boot, welch, sys_scores, base_scores, system)
        comparisons[f"{system} - {baseline}"] = entry
    time_to_quality = quality_time.analyse(records, COMPARISONS, samples)
    for key, row in time_to_quality["models"].items():
        row["bleu"] = quality_time.seed_interval(summary[key]["measures"]["BLEU"]["values"])
    return {"buckets": buckets, "probe": {"pairs": len(test["probe_groups"]), "groups": test["probe_groups"]},
            "test_sentences": len(test["references"]), "runs": records, "summary": summary,
            "comparisons": comparisons, "time_to_quality": time_to_quality}
