"""The converged quality study: does dropping input feeding cost BLEU once models are trained?

    python -m benchmarks.quality            # the full study on the bundled sample (= make bench-quality)
    python -m benchmarks.quality --quick    # a tiny model, few updates, one seed: checks the whole path
    python -m benchmarks.quality --report-only   # the report from the stored runs; trains nothing
    python -m benchmarks.quality --data DATA-BIN --reference test.de --source test.en [--remove-bpe sentencepiece]

Trains fairseq's ``lstm`` (input feeding) and ``hybrid_lstm`` (``--seeds``, 1-10 by default)
and ``hybrid_lstm --input-feeding`` (the first ``--if-seeds`` of them, all 10 by default) with
``fairseq-train`` at the same sizes, vocabulary, batch, optimizer and learning-rate schedule
(the sample recipe's), each until its validation loss has not improved for ``--patience``
validations, within the same ``--max-update`` budget. Each run is scored at its best
checkpoint with beam 5 at the default length penalty and at the one its validation BLEU
prefers (``--lenpens`` sweep), on the test set, its source-length buckets, and the made-up
long-sentence probe (``quality_generate``). Differences get seed-level intervals
(``quality_stats``), the BLEU differences an equivalence reading (``quality_equivalence``),
and each model a time to quality (``quality_time``). When the planned seeds are in and the
``hybrid_lstm`` - ``lstm`` BLEU interval is wider than its target, the study grows to the
seeds the spread needs (``--grow-to``; at most 24 by default for the bundled sample's full
study). Runs are stored as they finish and a rerun skips them (``quality_store``). Writes
``<out>/<name>.json``, ``.png`` and ``.md``; when ``<out>`` is the committed
``results/quality``, also the summary blocks of README.md and docs/quality.md
(``quality_summary``).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import quality_analysis, quality_chart, quality_equivalence, quality_report, quality_summary
from .data import sample_data
from .fairseq_runs import ROOT, BenchmarkError
from .quality_generate import join, job, probe_groups, read_output, run_jobs, write_probe
from .quality_runs import (MODEL, MODELS, Schedule, as_uninterrupted, model_options, sizes, stop_children, train,
                           visible_devices)
from .quality_stats import unigram_perplexity
from .quality_store import Store, plan, write_text

SAMPLE = ROOT / "data/ende-sample"
COMMITTED = ROOT / "results/quality"  # the committed reports: the docs' summary blocks are written from them
DOCS = (ROOT / "README.md", ROOT / "docs/quality.md")
FULL = {"seeds": "1,2,3,4,5,6,7,8,9,10", "if_seeds": 10, "max_update": 16000, "interval": 250, "patience": 4,
        "lenpens": "0.6,0.8,1.0,1.2,1.4", "layers": 2, "dim": 256}
QUICK = {"seeds": "1", "if_seeds": 1, "max_update": 20, "interval": 10, "patience": 1,
         "lenpens": "1.0,1.4", "layers": 1, "dim": 32}
# the bundled sample's full study grows to at most this many seeds by default (docs/quality.md); a --quick,
# --data or WMT study only when --grow-to says so: their runs cost what their data costs
SAMPLE_GROW_TO = 24
# the training settings of each preset: the sample recipe's, or the WMT recipes' (recipes/lib/wmt.sh)
TRAINING_SETTINGS = {
    "sample": {"lr": 0.003, "dropout": 0.3, "clip_norm": 1.0, "max_tokens": 2000,
               "lr_scheduler": "--lr-scheduler fixed", "share": "--share-all-embeddings"},
    "wmt": {"lr": 0.001, "dropout": 0.2, "clip_norm": 5.0, "max_tokens": 8000,
            "lr_scheduler": "--lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5", "share": ""},
}
DEFAULT_LENPEN = 1.0
TIMEOUT = 48 * 3600


class OneLineParser(argparse.ArgumentParser):
    """Bad values stop the run with one line naming the value and what is allowed."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = OneLineParser(prog="benchmarks.quality", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"defaults {QUICK} instead of {FULL}")
    add("--seeds", help="comma-separated training seeds of lstm and hybrid")
    add("--if-seeds", type=int, help="hybrid_lstm --input-feeding trains on the first this many seeds")
    add("--grow-to", type=int, help="when --seeds are in and the hybrid - lstm BLEU interval is wider than "
        "its target, add seeds (every model) as the seed spread needs, up to this many; 0: never "
        f"(default: {SAMPLE_GROW_TO} for the bundled sample's full study, else 0)")
    add("--max-update", type=int, help="the training budget of every run (--max-update)")
    add("--interval", type=int, help="validate and save every this many updates")
    add("--patience", type=int, help="stop after this many validations without a lower loss (--patience)")
    add("--lenpens", help="length penalties swept on the validation set (must include 1.0)")
    add("--layers", type=int, help="LSTM layers of encoder and decoder each")
    add("--dim", type=int, help="embedding, hidden and attention-output size")
    add("--jobs", type=int, default=2, help="runs at a time (default 2)")
    add("--threads", type=int, default=1, help="torch threads per run (default 1)")
    add("--data", help="a fairseq-preprocess directory (default: the bundled sample, sentencepiece --vocab)")
    add("--vocab", type=int, default=3000, help="joint sentencepiece size for the sample")
    add("--reference", help="raw test references, one per line (needed with --data)")
    add("--source", help="raw test sources (needed with --data)")
    add("--remove-bpe", help="fairseq-generate --remove-bpe (sample: sentencepiece)")
    add("--preset", choices=sorted(TRAINING_SETTINGS), default="sample",
        help="sample: 2+2 x --dim LSTMs, the sample recipe's training; wmt: the WMT recipes' models "
        "(lstm_luong_wmt_en_de, hybrid_lstm_wmt_en_de) and training (recipes/lib/wmt.sh)")
    add("--max-tokens", type=int, help="tokens per batch (preset: sample 2000, wmt 8000)")
    add("--lr", type=float, help="learning rate (preset: sample 0.003 fixed, wmt 0.001 halved on plateaus)")
    add("--dropout", type=float, help="dropout (preset: sample 0.3, wmt 0.2)")
    add("--clip-norm", type=float, help="gradient norm clipping (preset: sample 1, wmt 5)")
    add("--hybrid-devices", default="cpu", help="hybrid_lstm's --hybrid-devices (default cpu; e.g. cuda:0,cuda:1)")
    add("--samples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    add("--report-only", action="store_true", help="report on the stored runs; train nothing")
    add("--keep-checkpoints", action="store_true", help="keep each finished run's checkpoints")
    add("--work", default=str(ROOT / "work/quality"))
    add("--out", help="report and run records (default results/quality; with --quick work/quality/quick-results)")
    add("--name", help="study name (default converged-sample, quality-quick with --quick)")
    args = parser.parse_args(argv)
    for key, value in ((QUICK if args.quick else FULL) | TRAINING_SETTINGS[args.preset]).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.grow_to is None:
        args.grow_to = SAMPLE_GROW_TO if args.preset == "sample" and not (args.quick or args.data) else 0
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
        args.lenpen_list = tuple(float(x) for x in args.lenpens.split(","))
    except ValueError:
        parser.error(f"--seeds {args.seeds!r} / --lenpens {args.lenpens!r}: must be comma-separated numbers")
    if len(set(args.seed_list)) != len(args.seed_list) or min(args.seed_list) < 0:
        parser.error(f"--seeds {args.seeds!r}: seeds must be distinct integers >= 0")
    if DEFAULT_LENPEN not in args.lenpen_list:
        parser.error(f"--lenpens {args.lenpens!r}: must include the default 1.0")
    for name in ("max_update", "interval", "patience", "jobs", "threads", "max_tokens", "vocab", "layers",
                 "dim", "samples", "if_seeds", "grow_to"):
        least = 0 if name in ("if_seeds", "grow_to") else 1
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be an integer >= {least}")
    if 0 < args.grow_to < len(args.seed_list):
        parser.error(f"--grow-to {args.grow_to}: fewer than the {len(args.seed_list)} seed(s) in --seeds "
                     "(0 never grows the study)")
    if args.if_seeds > len(args.seed_list):
        parser.error(f"--if-seeds {args.if_seeds}: more than the {len(args.seed_list)} seed(s) in --seeds")
    for name in ("lr", "clip_norm"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout {args.dropout}: must be in [0, 1)")
    if not all(d == "cpu" or (d.startswith("cuda:") and d[5:].isdigit()) for d in args.hybrid_devices.split(",")):
        parser.error(f"--hybrid-devices {args.hybrid_devices!r}: use cpu (or cpu,cpu) or cuda:0,cuda:1,...")
    if args.max_update % args.interval:
        parser.error(f"--max-update {args.max_update} is not a multiple of --interval {args.interval}")
    if args.data:
        data = Path(args.data)
        if not list(data.glob("test.*-*.*.idx")) or not list(data.glob("train.*-*.*.idx")):
            parser.error(f"--data {args.data!r}: not a fairseq-preprocess directory with train and test splits")
        if not (args.reference and args.source):
            parser.error("--data needs --reference and --source (the raw test set: scores and the probe use them)")
    for name in ("reference", "source"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            parser.error(f"--{name} {path!r}: no such file")
        if path and not args.data:
            parser.error(f"--{name} is only for --data (the bundled sample has its own)")
    args.name = args.name or ("quality-quick" if args.quick else "converged-sample")
    args.out = args.out or str(ROOT / ("work/quality/quick-results" if args.quick else "results/quality"))
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def schedule_of(args: argparse.Namespace) -> Schedule:
    return Schedule(max_update=args.max_update, interval=args.interval, patience=args.patience,
                    max_tokens=args.max_tokens, lr=args.lr, dropout=args.dropout, clip_norm=args.clip_norm,
                    lr_scheduler=args.lr_scheduler, share=args.share, threads=args.threads,
                    sizes=sizes(args.layers, args.dim) if args.preset == "sample" else "", lenpens=args.lenpen_list)


def planned(args: argparse.Namespace) -> List[Tuple[str, int]]:
    """Seed-major, so load from other users hits the models alike."""
    return [(m.key, seed) for i, seed in enumerate(args.seed_list) for m in MODELS
            if m.key != "hybrid_if" or i < args.if_seeds]


def options_of(key: str, args: argparse.Namespace) -> str:
    return model_options(key, args.preset, args.hybrid_devices)


def fingerprint(data: Path) -> str:
    """The data's identity, not its path: the dictionaries and the binarized sizes."""
    digest = hashlib.sha256()
    for path in sorted(data.glob("dict.*.txt")) + sorted(data.glob("*.bin")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes() if path.suffix == ".txt" else str(path.stat().st_size).encode())
    return digest.hexdigest()[:16]


def run_settings(args, schedule: Schedule, key: str, data: Path) -> Dict[str, object]:
    return {"data": fingerprint(data), "schedule": json.loads(json.dumps(dataclasses.asdict(schedule))),
            "options": options_of(key, args), "criterion": MODEL[key].criterion, "remove_bpe": args.remove_bpe}


def run_one(args, store: Store, data: Path, probe: Path, schedule: Schedule, key: str, seed: int,
            test: Dict[str, List[str]], status: str) -> Optional[Dict[str, object]]:
    """Train (or resume), sweep the length penalty, generate, store one model and seed."""
    settings = run_settings(args, schedule, key, data)
    if status == "finished":
        print(f"[{key} seed {seed}] finished earlier: skipped", flush=True)
        return store.load(key, seed)[0]
    run_dir = store.begin(key, seed, settings, status)
    record: Dict[str, object] = {"model": key, "seed": seed, "settings": settings, "started": now(),
                                 "loadavg_start": os.getloadavg(), "machine": machine()}
    trained = run_dir / "trained.json"
    if trained.exists():
        print(f"[{key} seed {seed}] trained earlier: generating", flush=True)
        result = json.loads(trained.read_text())
    else:
        print(f"[{key} seed {seed}] {'resuming' if status == 'resume' else 'training'} (patience "
              f"{schedule.patience} x {schedule.interval} updates, at most {schedule.max_update})", flush=True)
        model = dataclasses.replace(MODEL[key], options=settings["options"])
        result = train(str(data), model, schedule, seed, run_dir, TIMEOUT,
                       visible_devices(settings["options"], args.hybrid_devices))
        write_text(trained, json.dumps(result, indent=1))
    record.update(result)
    best = run_dir / "checkpoints/checkpoint_best.pt"
    cpu = "cuda" not in args.hybrid_devices
    gen = run_dir / "generate"
    gen.mkdir(exist_ok=True)
    sweep = {lp: job(str(data), "valid", best, schedule, lp, args.remove_bpe, str(gen / f"valid.lp{lp}.out"), cpu)
             for lp in schedule.lenpens}
    final = {f"{name}@{tag}": job(str(d), "test", best, schedule, lp, args.remove_bpe,
                                  str(gen / f"{name}.lp{{lenpen}}.out"), cpu)
             for name, d in (("test", data), ("probe", probe))
             for tag, lp in (("default", DEFAULT_LENPEN), ("best", "best"))}
    generated = run_jobs(sweep, final, DEFAULT_LENPEN, gen / "generate.log", schedule.threads, TIMEOUT,
                         visible_devices("", args.hybrid_devices))
    record["lenpen_valid_bleu"], record["best_lenpen"] = generated["lenpen_valid_bleu"], generated["best_lenpen"]
    record["generate_seconds"] = generated["seconds"]
    outputs = generated["outputs"]
    hyps = {}
    for label, path in outputs.items():
        out = read_output(Path(path))
        expected = len(test["references"] if label.startswith("test") else test["probe_references"])
        if len(out["D"]) != expected:
            raise BenchmarkError(f"{path}: {len(out['D'])} hypotheses for {expected} references")
        hyps[label] = out["D"]
    record["scores"] = quality_analysis.run_scores(hyps, test)
    record |= {"loadavg_end": os.getloadavg(), "finished": now()}
    store.finish(record, hyps)
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints")
    stop = record["stop"]
    print(f"[{key} seed {seed}] done: best valid ppl {stop['best_ppl']:.1f} at update {stop['best_updates']}, "
          f"stopped by {stop['stopped_by']} at {stop['last_updates']}; test BLEU "
          f"{record['scores']['test@default']['bleu']}", flush=True)
    return record


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_lines(path) -> List[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def machine() -> Dict[str, object]:
    import torch

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "nice": os.nice(0)}


def test_set(args: argparse.Namespace) -> Dict[str, List[str]]:
    reference, source = (args.reference, args.source) if args.data else (SAMPLE / "test.de", SAMPLE / "test.en")
    refs, sources = read_lines(reference), read_lines(source)
    if len(refs) != len(sources):
        raise BenchmarkError(f"{reference} has {len(refs)} lines but {source} has {len(sources)}")
    groups = probe_groups([len(s.split()) for s in sources])
    return {"references": refs, "sources": sources, "probe_groups": groups,
            "probe_references": join(refs, groups), "probe_sources": join(sources, groups)}


def run_all(args, store: Store, data: Path, probe: Path, schedule: Schedule, runs: List[Tuple[str, int]],
            test: Dict[str, List[str]], todo: Dict[Tuple[str, int], str]) -> None:
    """``--jobs`` runs at a time. A run that fails is reported at once and the others go on
    (a rerun retries it); SIGTERM stops the running children and starts nothing new."""
    def terminate(signum, frame):
        stop_children()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    futures = {pool.submit(run_one, args, store, data, probe, schedule, key, seed, test, todo[(key, seed)]):
               (key, seed) for key, seed in runs}
    failed = []
    try:
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except BenchmarkError as error:
                key, seed = futures[future]
                failed.append(f"{key}-seed{seed}")
                print(f"[{key} seed {seed}] FAILED (a rerun retries it): {str(error)[-2000:]}", flush=True)
    except BaseException:
        stop_children()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        signal.signal(signal.SIGTERM, previous)
    if failed:
        raise BenchmarkError(f"{len(failed)} run(s) failed: {', '.join(failed)} (rerun the same command to retry; "
                             "finished runs are kept)")


def run(args: argparse.Namespace) -> Dict[str, object]:
    """Train what the plan lacks, report, and grow the plan while its interval needs more seeds."""
    started = time.time()
    schedule = schedule_of(args)
    if args.data:
        data = Path(args.data).resolve()
    else:
        args.remove_bpe = args.remove_bpe or "sentencepiece"
        print(f"preparing the bundled sample (sentencepiece {args.vocab})", flush=True)
        data = sample_data(args.vocab, Path(args.work) / f"sample-v{args.vocab}").resolve()
    test = test_set(args)
    store = Store(Path(args.out) / "runs" / args.name, Path(args.work) / args.name)
    settings = {key: run_settings(args, schedule, key, data) for key in MODEL}
    probe = None if args.report_only else write_probe(data, test["probe_groups"],
                                                      Path(args.work) / args.name / "probe-bin")
    while True:
        runs = planned(args)
        todo = {pair: status for status, pairs in plan(runs, store, settings).items() for pair in pairs}
        print("plan: " + ", ".join(f"{k}-seed{s}: {todo[(k, s)]}" for k, s in runs), flush=True)
        if not args.report_only:
            run_all(args, store, data, probe, schedule, runs, test, todo)
        report = report_of(args, store, schedule, data, runs, test, started)
        if not grow(args, report):
            return report


def grow(args: argparse.Namespace, report: Dict[str, object]) -> bool:
    """Extend ``args``' seeds (every model that has them all) when the finished plan's
    ``hybrid - lstm`` BLEU interval misses its width target (``quality_equivalence``); with
    ``--report-only`` too, so its report covers the plan a training run would follow."""
    headline = report["comparisons"].get("hybrid - lstm")
    if not args.grow_to or report["partial"] or headline is None:
        return False
    width = headline["measures"]["BLEU"]["equivalence"]["width"]
    seeds = len(args.seed_list)
    count = quality_equivalence.grown_seed_count(width, seeds, args.grow_to)
    if count is None:
        return False
    if args.if_seeds == seeds:
        args.if_seeds = count
    args.seed_list += [max(args.seed_list) + i for i in range(1, count - seeds + 1)]
    halves = [h for h in (width["bootstrap_half_width"], width["welch_half_width"]) if h is not None]
    print(f"hybrid - lstm BLEU: 95% half-width {'/'.join(f'±{h:.2f}' for h in halves)}, target "
          f"±{width['target']:g}, the spread needs {width['seeds_needed'] or 'more than ' + str(args.grow_to)} "
          f"seeds per model: growing to {count} (--grow-to {args.grow_to})", flush=True)
    return True


def report_of(args: argparse.Namespace, store: Store, schedule: Schedule, data: Path, runs: List[Tuple[str, int]],
              test: Dict[str, List[str]], started: float) -> Dict[str, object]:
    loaded = {(k, s): store.load(k, s) for k, s in runs}
    done = [(as_uninterrupted(v[0], schedule, (store.record_path(*run), store.hyps_path(*run))), v[1])
            for run, v in loaded.items() if v]
    if not done:
        raise BenchmarkError(f"no finished runs under {store.records} to report on")
    report: Dict[str, object] = {
        "name": args.name, "date": now(), "command": " ".join(["python -m benchmarks.quality", *args.argv]),
        "settings": dataclasses.asdict(schedule) | {
            "seeds": args.seed_list, "if_seeds": args.if_seeds, "grow_to": args.grow_to, "jobs": args.jobs,
            "remove_bpe": args.remove_bpe, "data": str(data), "vocab": None if args.data else args.vocab,
            "hybrid_devices": args.hybrid_devices, "preset": args.preset},
        "models": {m.key: {"name": m.name, "options": options_of(m.key, args), "criterion": m.criterion}
                   for m in MODELS},
        "unigram": unigram_perplexity(data),
        "partial": None if len(done) == len(runs) else f"{len(done)} of {len(runs)} runs finished",
        "seconds": time.time() - started, "report_only": args.report_only,
    }
    report.update(quality_analysis.analyse([r for r, _ in done], [h for _, h in done], test, args.samples))
    return report


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = run(args)
    out = Path(args.out)
    write_text(out / f"{args.name}.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    quality_chart.draw(report, out / f"{args.name}.png")
    markdown = quality_report.markdown(report, f"{args.name}.png")  # relative to the .md beside it
    write_text(out / f"{args.name}.md", markdown)
    print(markdown)
    print(f"wrote {out / args.name}.json, .png and .md; runs in {out / 'runs' / args.name}")
    if out.resolve() == COMMITTED.resolve():
        changed = quality_summary.refresh(report, DOCS)
        print(f"quality summary rewritten in {', '.join(map(str, changed))}" if changed
              else "the docs' quality summaries were already the report's")


if __name__ == "__main__":
    main()
