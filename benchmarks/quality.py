"""The matched quality study: does dropping input feeding cost BLEU?

    python -m benchmarks.quality            # the full study on the bundled sample (= make bench-quality)
    python -m benchmarks.quality --quick    # one seed, few updates: checks the whole path
    python -m benchmarks.quality --data DATA-BIN [--reference test.de --source test.en]

Trains fairseq's ``lstm`` (input feeding), ``hybrid_lstm`` and ``hybrid_lstm
--input-feeding`` with ``fairseq-train`` at the same sizes, vocabulary, batch, number of
updates, optimizer, learning-rate schedule and seeds (runs in seed-major order, so load
from other users of the machine hits the models alike); scores the final checkpoint and
the average of the last N interval checkpoints with beam search (sacreBLEU and chrF with
signatures, BLEU by source-length thirds and the longest 10%); compares hybrid with both
input-feeding models by paired bootstrap. Each finished run is cached under ``--work``
(a rerun with the same settings continues); ``--report-only`` reports on the runs done.
Writes ``<out>/<name>.json``, ``.png`` and ``.md`` (the README section).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import quality_chart, quality_report, quality_stats
from .data import sample_data
from .fairseq_runs import ROOT, BenchmarkError
from .quality_runs import MODELS, Schedule, average_last, generate, train

SAMPLE = ROOT / "data/ende-sample"
FULL = {"seeds": "1,2,3", "updates": 400, "interval": 50, "average": 4}
QUICK = {"seeds": "1", "updates": 40, "interval": 10, "average": 2}
COMPARISONS = [("hybrid", "lstm"), ("hybrid", "hybrid_if")]
KINDS = ("final", "averaged")


class OneLineParser(argparse.ArgumentParser):
    """Bad values stop the run with one line naming the value and what is allowed."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = OneLineParser(prog="benchmarks.quality", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"defaults {QUICK} instead of {FULL}")
    parser.add_argument("--seeds", help="comma-separated training seeds")
    parser.add_argument("--updates", type=int, help="--max-update of every run")
    parser.add_argument("--interval", type=int, help="validate and save every this many updates")
    parser.add_argument("--average", type=int, help="average the last N interval checkpoints")
    parser.add_argument("--jobs", type=int, default=len(MODELS),
                        help="runs at a time (default 3: one seed's three models side by side, under the "
                        "same load)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument("--data", help="a fairseq-preprocess directory (default: the bundled sample, "
                        "sentencepiece --vocab pieces)")
    parser.add_argument("--vocab", type=int, default=3000, help="joint sentencepiece size for the sample")
    parser.add_argument("--reference", help="raw test references, one per line (default with --data: "
                        "fairseq-generate's T- lines)")
    parser.add_argument("--source", help="raw test sources (for the length buckets; default with --data: S- lines)")
    parser.add_argument("--remove-bpe", help="fairseq-generate --remove-bpe (sample: sentencepiece)")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--report-only", action="store_true", help="report on the cached runs; train nothing")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep every run's checkpoints")
    parser.add_argument("--work", default=str(ROOT / "work/quality"))
    parser.add_argument("--out", default=str(ROOT / "results/quality"))
    parser.add_argument("--name", help="report name (default quality-sample, quality-quick with --quick)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: must be comma-separated integers, e.g. 1,2,3")
    if len(set(args.seed_list)) != len(args.seed_list) or min(args.seed_list) < 0:
        parser.error(f"--seeds {args.seeds!r}: seeds must be distinct integers >= 0")
    for name in ("updates", "interval", "average", "jobs", "threads", "max_tokens", "vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be an integer >= 1")
    if args.lr <= 0:
        parser.error(f"--lr {args.lr}: must be > 0")
    if args.updates % args.interval:
        parser.error(f"--updates {args.updates} is not a multiple of --interval {args.interval}")
    if args.average * args.interval > args.updates:
        parser.error(f"--average {args.average} x --interval {args.interval} exceeds --updates {args.updates}: "
                     "not enough interval checkpoints to average")
    if args.data:
        data = Path(args.data)
        if not list(data.glob("test.*-*.*.idx")) or not list(data.glob("train.*-*.*.idx")):
            parser.error(f"--data {args.data!r}: not a fairseq-preprocess directory with train and test splits")
    for name in ("reference", "source"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            parser.error(f"--{name} {path!r}: no such file")
        if path and not args.data:
            parser.error(f"--{name} is only for --data (the bundled sample has its own)")
    args.name = args.name or ("quality-quick" if args.quick else "quality-sample")
    return args


def schedule_of(args: argparse.Namespace) -> Schedule:
    return Schedule(updates=args.updates, interval=args.interval, average=args.average,
                    max_tokens=args.max_tokens, lr=args.lr, threads=args.threads)


def test_set(args: argparse.Namespace, generated: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """References and sources to score against: raw files when known, else fairseq's."""
    if args.data:
        reference, source = args.reference, args.source
    else:
        reference, source = SAMPLE / "test.de", SAMPLE / "test.en"
    refs = read_lines(reference) if reference else generated["T"]
    sources = read_lines(source) if source else generated["S"]
    if len(refs) != len(generated["D"]) or len(sources) != len(generated["D"]):
        raise BenchmarkError(f"the test set has {len(generated['D'])} sentences but the references have "
                             f"{len(refs)} lines and the sources {len(sources)}")
    return {"references": refs, "sources": sources}


def read_lines(path) -> List[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
        tmp.write(text)
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)


def run_one(args: argparse.Namespace, data: str, schedule: Schedule, key: str, seed: int,
            order: int) -> Dict[str, object]:
    """Train, average, generate and keep the hypotheses of one model and seed (cached)."""
    model = next(m for m in MODELS if m.key == key)
    run_dir = Path(args.work) / args.name / f"{key}-seed{seed}"
    settings = {"data": data, "schedule": dataclasses.asdict(schedule), "options": model.options,
                "remove_bpe": args.remove_bpe}
    cached = run_dir / "run.json"
    if cached.exists():
        result = json.loads(cached.read_text())
        if result["settings"] == settings:
            print(f"[{key} seed {seed}] cached", flush=True)
            return result
    if args.report_only:
        return {}
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    print(f"[{key} seed {seed}] training {schedule.updates} updates", flush=True)
    timeout = 6 * 3600
    result: Dict[str, object] = {"model": key, "seed": seed, "order": order, "settings": settings,
                                 "loadavg_start": os.getloadavg(), "started": now()}
    result.update(train(data, model, schedule, seed, run_dir, timeout))
    averaged, averaged_updates = average_last(run_dir / "checkpoints", schedule.average, schedule.threads, timeout)
    result["averaged_updates"] = averaged_updates
    result["generate_seconds"] = {}
    for kind, checkpoint in (("final", run_dir / "checkpoints/checkpoint_last.pt"), ("averaged", averaged)):
        generated = generate(data, checkpoint, schedule, args.remove_bpe, run_dir / f"generate.{kind}.out", timeout)
        write_text(run_dir / f"hyp.{kind}.txt", "".join(h + "\n" for h in generated["D"]))
        if kind == "final":
            write_text(run_dir / "test.src.txt", "".join(s + "\n" for s in generated["S"]))
            write_text(run_dir / "test.ref.txt", "".join(t + "\n" for t in generated["T"]))
        result["generate_seconds"][kind] = generated["seconds"]
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints")
    result["loadavg_end"] = os.getloadavg()
    result["finished"] = now()
    write_text(cached, json.dumps(result, indent=2))
    curve = result["curve"][-1]
    print(f"[{key} seed {seed}] done: valid ppl {curve['ppl']:.1f} after {curve['train_seconds']:.0f} s "
          "of training", flush=True)
    return result


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def hypotheses(args: argparse.Namespace, run: Dict[str, object], kind: str) -> List[str]:
    return read_lines(Path(args.work) / args.name / f"{run['model']}-seed{run['seed']}" / f"hyp.{kind}.txt")


def analyse(args: argparse.Namespace, runs: List[Dict[str, object]]) -> Dict[str, object]:
    """Scores of every run, their mean and spread per model, and the comparisons."""
    first = Path(args.work) / args.name / f"{runs[0]['model']}-seed{runs[0]['seed']}"
    generated = {"D": read_lines(first / "hyp.final.txt"), "S": read_lines(first / "test.src.txt"),
                 "T": read_lines(first / "test.ref.txt")}
    test = test_set(args, generated)
    refs = test["references"]
    buckets = quality_stats.length_buckets([len(s.split()) for s in test["sources"]])
    outputs: Dict[str, Dict[str, Dict[int, List[str]]]] = {}
    for run in runs:
        run["scores"] = {}
        for kind in KINDS:
            hyps = hypotheses(args, run, kind)
            outputs.setdefault(run["model"], {}).setdefault(kind, {})[run["seed"]] = hyps
            run["scores"][kind] = quality_stats.score(hyps, refs, buckets)
    summary: Dict[str, object] = {}
    for key in outputs:
        mine = [r for r in runs if r["model"] == key]
        row: Dict[str, object] = {
            "parameters": mine[0]["parameters"],
            "valid_ppl": quality_stats.mean_std([r["curve"][-1]["ppl"] for r in mine]),
            "valid_nll_loss": quality_stats.mean_std([r["curve"][-1]["nll_loss"] for r in mine]),
            "train_seconds": quality_stats.mean_std([r["train_seconds"] for r in mine]),
        }
        for kind in KINDS:
            row[kind] = {m: quality_stats.mean_std([r["scores"][kind][m] for r in mine])
                         for m in quality_stats.METRICS}
            row[kind]["buckets"] = {b: quality_stats.mean_std([r["scores"][kind]["buckets"][b]["bleu"] for r in mine])
                                    for b in buckets}
        summary[key] = row
    comparisons: Dict[str, object] = {}
    for system, baseline in COMPARISONS:
        if system not in outputs or baseline not in outputs:
            continue
        seeds = sorted(set(outputs[system]["final"]) & set(outputs[baseline]["final"]))
        label = f"{system} - {baseline}"
        comparisons[label] = {"system": system, "baseline": baseline, "seeds": seeds}
        for kind in KINDS:
            sys_out = [outputs[system][kind][s] for s in seeds]
            base_out = [outputs[baseline][kind][s] for s in seeds]
            entry: Dict[str, object] = {
                m: quality_stats.paired_bootstrap(sys_out, base_out, refs, metric_name=m)
                for m in quality_stats.METRICS}
            entry["buckets"] = {b: quality_stats.paired_bootstrap(sys_out, base_out, refs, info["indices"])
                                for b, info in buckets.items()}
            entry["sacrebleu_paired_bs_per_seed"] = {
                str(s): quality_stats.sacrebleu_paired_bs(outputs[system][kind][s], outputs[baseline][kind][s], refs)
                for s in seeds}
            comparisons[label][kind] = entry
    return {"buckets": buckets, "summary": summary, "comparisons": comparisons, "test_sentences": len(refs)}


def machine() -> Dict[str, object]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "nice": os.nice(0)}


def run(args: argparse.Namespace) -> Dict[str, object]:
    started, loadavg_start = time.time(), os.getloadavg()
    schedule = schedule_of(args)
    if args.data:
        data = str(Path(args.data).resolve())
    else:
        args.remove_bpe = args.remove_bpe or "sentencepiece"
        print(f"preparing the bundled sample (sentencepiece {args.vocab})", flush=True)
        data = str(sample_data(args.vocab, Path(args.work) / f"sample-v{args.vocab}").resolve())
    unigram = quality_stats.unigram_perplexity(Path(data))
    plan = [(key, seed) for seed in args.seed_list for key in (m.key for m in MODELS)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, args, data, schedule, key, seed, order)
                   for order, (key, seed) in enumerate(plan)]
        runs = [f.result() for f in futures]
    runs = [r for r in runs if r]
    complete_seeds = [s for s in args.seed_list if sum(r["seed"] == s for r in runs) == len(MODELS)]
    if not runs:
        raise BenchmarkError(f"no finished runs under {Path(args.work) / args.name} to report on")
    partial = None
    if len(runs) < len(plan):
        partial = f"{len(runs)} of {len(plan)} runs finished (complete seeds: {complete_seeds or 'none'})"
    report: Dict[str, object] = {
        "name": args.name, "date": now(),
        "command": " ".join(["python -m benchmarks.quality", *sys.argv[1:]]),
        "machine": machine() | {"loadavg_start": loadavg_start, "loadavg_end": os.getloadavg()},
        "settings": dataclasses.asdict(schedule) | {
            "data": data, "vocab": args.vocab if not args.data else None, "seeds": args.seed_list,
            "jobs": args.jobs, "remove_bpe": args.remove_bpe,
            "models": {m.key: m.options for m in MODELS}},
        "models": {m.key: {"name": m.name, "options": m.options, "criterion": m.criterion} for m in MODELS},
        "unigram": unigram, "partial": partial, "runs": runs,
    }
    report.update(analyse(args, runs))
    report["seconds"] = time.time() - started
    if args.report_only:  # the study's span and load are those of its runs, not of this report
        first = min(runs, key=lambda r: r["started"])
        last = max(runs, key=lambda r: r["finished"])
        report["seconds"] = (parse_time(last["finished"]) - parse_time(first["started"])).total_seconds()
        report["machine"] |= {"loadavg_start": first["loadavg_start"], "loadavg_end": last["loadavg_end"]}
        report["report_only"] = True
    return report


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = run(args)
    out = Path(args.out)
    write_text(out / f"{args.name}.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    quality_chart.draw(report, out / f"{args.name}.png")
    # the section is for the README at the repository root: the image path is relative to it
    markdown = quality_report.markdown(report, os.path.relpath(out / f"{args.name}.png", ROOT))
    write_text(out / f"{args.name}.md", markdown)
    print(markdown)
    print(f"wrote {out / args.name}.json, .png and .md")


if __name__ == "__main__":
    main()
