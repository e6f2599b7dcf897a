"""The quality study (benchmarks/quality*.py): scores against sacreBLEU called directly, the
seed-level intervals against hand computations, the wording they allow, the made-up long
probe, fairseq log parsing across a resume, which runs a rerun skips or resumes (fake
records, no training), one-line errors, and ``--quick`` end to end on a tiny corpus."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from benchmarks import quality, quality_stats as qs
from benchmarks.quality_generate import best_lenpen, join, probe_groups
from benchmarks.quality_runs import (BenchmarkError, Schedule, as_uninterrupted, learning_curve, model_options,
                                     patience_stop, stopping, train_command, training_speed, undisturbed_speed,
                                     visible_devices)
from benchmarks.quality_store import SettingsMismatch, Store, plan

REFS = ["the cat sat on the mat", "a dog barks at night", "it is raining again today",
        "we went to the market", "he reads a long book", "the sun is shining bright",
        "she plays the piano well", "they are late for school"]
GOOD = ["the cat sat on the mat", "a dog barks at night", "it is raining today",
        "we went to a market", "he reads a long book", "the sun shines bright",
        "she plays piano well", "they are late to school"]
BAD = ["cat the mat", "dog night", "raining is it", "market we", "book long", "sun the",
       "piano she", "late they"]


def test_length_buckets_are_thirds_by_source_length_and_the_longest_tenth():
    buckets = qs.length_buckets([5, 1, 9, 3, 7, 2, 8, 4, 6, 10, 3, 5])
    assert buckets["short third"]["indices"] == [1, 3, 5, 10]  # lengths 1, 2, 3, 3
    assert buckets["long third"]["indices"] == [2, 4, 6, 9]  # lengths 7, 8, 9, 10
    assert buckets["longest 10%"]["indices"] == [2, 9] and buckets["longest 10%"]["source_words"] == [9, 10]
    with pytest.raises(ValueError, match="at least 3"):
        qs.length_buckets([1, 2])


def test_scores_equal_sacrebleu_on_the_whole_set_and_on_each_bucket():
    buckets = qs.length_buckets([len(r.split()) for r in REFS])
    scores = qs.score(GOOD, REFS, buckets)
    assert scores["bleu"] == round(sacrebleu.corpus_bleu(GOOD, [REFS]).score, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(GOOD, [REFS]).score, 2)
    for info, bucket in zip(buckets.values(), scores["buckets"].values()):
        hyp, ref = [GOOD[i] for i in info["indices"]], [REFS[i] for i in info["indices"]]
        assert bucket["bleu"] == round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2)


def test_mean_std_is_the_sample_standard_deviation():
    stat = qs.mean_std([1.0, 2.0, 6.0])
    assert stat["mean"] == pytest.approx(3.0) and stat["std"] == pytest.approx(np.std([1.0, 2.0, 6.0], ddof=1))
    assert qs.mean_std([4.0])["std"] == 0.0 and np.isnan(qs.mean_std([])["mean"])


def test_summed_sentence_statistics_give_sacrebleus_corpus_score():
    for metric, corpus in (("bleu", sacrebleu.corpus_bleu), ("chrf", sacrebleu.corpus_chrf)):
        stats = qs.sentence_stats(metric, GOOD, REFS)
        assert qs.corpus_scorer(metric)(stats.sum(0)) == pytest.approx(corpus(GOOD, [REFS]).score)


def test_paired_bootstrap_of_one_seed_agrees_with_sacrebleu_paired_bs():
    ours = qs.paired_bootstrap([GOOD], [BAD], REFS)
    theirs = qs.sacrebleu_paired_bs(GOOD, BAD, REFS)["bleu"]
    assert ours["difference"] == pytest.approx(theirs["system"] - theirs["baseline"], abs=1e-9)
    assert ours["bootstrap_mean"] == pytest.approx(theirs["system_mean"] - theirs["baseline_mean"], abs=1e-3)


def test_hierarchical_bootstrap_matches_a_hand_computation():
    # "score" = mean of one number per sentence; 2 system seeds, 2 baseline seeds, 3 sentences
    system = [np.array([[1.0], [2.0], [3.0]]), np.array([[3.0], [3.0], [3.0]])]  # means 2, 3
    baseline = [np.array([[0.0], [0.0], [3.0]]), np.array([[2.0], [2.0], [2.0]])]  # means 1, 2

    def mean(totals):
        return float(totals[0]) / 3  # every resample has 3 sentences

    draws = [  # (system seeds, baseline seeds, sentences)
        (np.array([0, 0]), np.array([1, 1]), np.array([0, 1, 2])),  # 2 - 2 = 0
        (np.array([1, 1]), np.array([0, 0]), np.array([0, 0, 1])),  # 3 - 0 = 3
        (np.array([0, 1]), np.array([0, 1]), np.array([2, 2, 2])),  # (3 + 3)/2 - (3 + 2)/2 = 0.5
        (np.array([0, 1]), np.array([1, 0]), np.array([1, 1, 0])),  # (5/3 + 3)/2 - (2 + 0)/2 = 4/3
    ]
    result = qs.hierarchical_bootstrap(system, baseline, mean, draws=draws)
    assert result["difference"] == pytest.approx((2 + 3) / 2 - (1 + 2) / 2)  # 1.0
    assert result["ci95"] == pytest.approx([0.0, 3.0])  # 4 samples: the cut is 0, so min and max
    assert result["p_not_better"] == pytest.approx(1 / 4)  # only the 0 is <= 0
    assert result["seeds"] == [2, 2] and result["samples"] == 4


def test_hierarchical_bootstrap_without_seed_spread_is_the_sentence_bootstrap():
    rows = qs.resample_indices(len(REFS))
    stats = [qs.sentence_stats("bleu", h, REFS) for h in (GOOD, BAD)]
    draws = [(np.zeros(2, int), np.zeros(2, int), r) for r in rows]
    seeds = qs.hierarchical_bootstrap([stats[0], stats[0]], [stats[1], stats[1]], qs.corpus_scorer("bleu"),
                                      draws=draws)
    sentences = qs.paired_bootstrap([GOOD, GOOD], [BAD, BAD], REFS)
    assert seeds["difference"] == pytest.approx(sentences["difference"])
    assert seeds["ci95"] == pytest.approx(sentences["ci95"])
    # with a seed spread, the interval widens
    spread = qs.hierarchical_bootstrap([stats[0], stats[1]], [stats[1], stats[1]], qs.corpus_scorer("bleu"))
    assert spread["ci95"][0] <= 0 < spread["ci95"][1]


def test_welch_interval_matches_a_hand_computation():
    # equal variances 2.5, n 5 and 5: se = sqrt(2.5/5 + 2.5/5) = 1, df = 8, t(0.975, 8) = 2.306004
    result = qs.welch_interval([4, 5, 6, 7, 8], [3, 4, 5, 6, 7])
    assert result["difference"] == 1.0 and result["df"] == pytest.approx(8.0)
    assert result["ci95"] == pytest.approx([1 - 2.306004, 1 + 2.306004], abs=1e-6)
    assert result["p_value"] == pytest.approx(0.346594, abs=1e-6)  # 2 * P(T_8 > 1)
    # a baseline without spread: se = sqrt(2/2) = 1, df = 1^2 / (1^2 / 1) = 1, t(0.975, 1) = 12.706205
    result = qs.welch_interval([2, 4], [1, 1, 1])
    assert result["ci95"] == pytest.approx([2 - 12.706205, 2 + 12.706205], abs=1e-6)
    assert qs.welch_interval([1.0], [2.0, 3.0])["ci95"] is None  # one seed: no seed-level interval
    assert qs.welch_interval([1.0, 1.0], [2.0, 2.0])["ci95"] is None  # no spread at all


def test_verdict_needs_both_seed_level_intervals_on_one_side():
    assert qs.verdict([-1.2, -0.3], [-1.5, -0.1], -0.8, "BLEU") == "hybrid worse by 0.80 BLEU"
    assert qs.verdict([0.3, 1.2], [0.1, 1.5], 0.8, "chrF") == "hybrid better by 0.80 chrF"
    assert qs.verdict([0.3, 1.2], [-0.1, 1.5], 0.8, "BLEU") == "no difference detected"
    assert qs.verdict([0.3, 1.2], None, 0.8, "BLEU") == "no difference detected"  # sentence resampling alone


def test_best_lenpen_prefers_the_default_on_ties():
    assert best_lenpen({"0.6": 3.0, "1.0": 3.5, "1.4": 3.5}, 1.0) == 1.0
    assert best_lenpen({"0.6": 3.0, "1.2": 3.6, "1.4": 3.6}, 1.0) == 1.2


def test_probe_groups_join_consecutive_pairs_to_30_to_60_words():
    lengths = [10, 15, 8, 25, 40, 50, 70, 5, 5, 30]
    groups = probe_groups(lengths)
    # [10, 15, 8] = 33; 25 + 40 > 60: 25 dropped, 40 starts and ends a group (>= 30); so does 50;
    # 70 > 60 is skipped; [5, 5, 30] = 40
    assert groups == [[0, 1, 2], [4], [5], [7, 8, 9]]
    assert all(30 <= sum(lengths[i] for i in g) <= 60 for g in groups)
    assert join(list("abcdefghij"), groups) == ["a b c", "e", "f", "h i j"]


def _log(*records):
    return "\n".join(f"2026-12-03 10:00:00 | INFO | {kind} | " + json.dumps({k: str(v) for k, v in r.items()})
                     for kind, r in records)


def test_learning_curve_counts_updates_replayed_after_a_resume_once():
    def inner(u, wall, wpb=100):
        return ("train_inner", {"num_updates": u, "train_wall": wall, "wpb": wpb})

    def valid(u, loss):
        return ("valid", {"valid_loss": loss, "valid_nll_loss": loss - 0.5, "valid_ppl": 2 ** loss,
                          "valid_num_updates": u})

    log = _log(inner(10, 4), valid(10, 9.0), inner(20, 3), valid(20, 8.0), inner(30, 5),  # killed here
               inner(30, 6), valid(30, 8.5), inner(40, 2), valid(40, 8.2))  # resumed from update 20
    curve = learning_curve(log)
    assert [(p["updates"], p["train_seconds"], p["train_tokens"]) for p in curve] == [
        (10, 4.0, 1000.0), (20, 7.0, 2000.0), (30, 13.0, 3000.0), (40, 15.0, 4000.0)]
    assert training_speed(log) == {"tokens_per_second": 3000 / 11, "timed_tokens": 3000.0, "timed_seconds": 11.0}
    # intervals after the first: 1000 tokens in 6 s, then in 2 s; the 90th percentile of two
    # speeds (nearest rank: the 2nd) is the faster: a slowed interval cannot lower it
    assert undisturbed_speed(curve) == 500.0
    assert undisturbed_speed(curve[:1]) is None
    # 11 validations, 100 tokens per second between them, but intervals 3 and 7 paused
    # (5 s instead of 1): over the whole run 1000 tokens in 18 s, undisturbed 100 tokens/s
    seconds = [0.0]
    for interval in range(10):
        seconds.append(seconds[-1] + (5.0 if interval in (3, 7) else 1.0))
    paused = [{"train_tokens": 100.0 * i, "train_seconds": t} for i, t in enumerate(seconds)]
    assert undisturbed_speed(paused) == 100.0
    patience = stopping(curve, Schedule(max_update=100, interval=10, patience=2))
    assert (patience["stopped_by"], patience["best_updates"], patience["validations_after_best"]) == ("patience", 20, 2)
    assert patience["updates_to_within_1pct"] == 20
    budget = stopping(curve, Schedule(max_update=40, interval=10, patience=3))
    assert budget["stopped_by"] == "max_update"
    assert stopping(curve, Schedule(max_update=100, interval=10, patience=3))["stopped_by"] is None


def _curve(losses):
    return [{"updates": 10 * (i + 1), "loss": loss, "nll_loss": loss - 0.5, "ppl": 2 ** loss,
             "train_seconds": 2.0 * (i + 1), "train_tokens": 100.0 * (i + 1)} for i, loss in enumerate(losses)]


def test_the_stop_is_where_an_uninterrupted_run_stops_and_a_best_found_later_is_refused():
    schedule = Schedule(max_update=1000, interval=10, patience=2)
    # fairseq's rule: a loss equal to the best is not better; a lower one restarts the count
    assert patience_stop(_curve([5.0, 4.0, 4.0, 3.9, 4.1, 3.95]), 2) == 5
    assert patience_stop(_curve([5.0, 4.0, 3.0]), 2) is None
    # a resume restarted fairseq's count at update 40 (3.2 taken as the best): it went on to 70
    record = {"model": "lstm", "seed": 1, "curve": _curve([3.5, 3.0, 3.1, 3.2, 3.15, 3.3, 3.25])}
    cut = as_uninterrupted(record, schedule)
    assert cut["stop"]["last_updates"] == 40 and cut["stop"]["trained_past_stop"] == 30
    assert (cut["stop"]["best_updates"], cut["stop"]["stopped_by"]) == (20, "patience")
    assert [p["updates"] for p in cut["curve"]] == [10, 20, 30, 40]
    assert (cut["train_seconds"], cut["train_tokens"]) == (8.0, 400.0)
    later = {"model": "hybrid_if", "seed": 1, "curve": _curve([3.5, 3.0, 3.1, 3.2, 3.15, 2.9, 3.0])}
    with pytest.raises(BenchmarkError, match="hybrid_if seed 1 trained past its --patience stop at update 40.*"
                                             "delete r.json and r.hyps.json.gz to train it again"):
        as_uninterrupted(later, schedule, (Path("r.json"), Path("r.hyps.json.gz")))
    whole = as_uninterrupted({"model": "lstm", "seed": 2, "curve": _curve([3.5, 3.0, 3.1, 3.2])}, schedule)
    assert whole["stop"]["trained_past_stop"] == 0 and len(whole["curve"]) == 4


def test_a_rerun_skips_finished_runs_resumes_started_ones_and_refuses_other_settings(tmp_path):
    store = Store(tmp_path / "records", tmp_path / "work")
    settings = {"lstm": {"lr": 0.003, "options": "--arch lstm"}, "hybrid": {"lr": 0.003, "options": "--arch h"}}
    runs = [("lstm", 1), ("hybrid", 1), ("lstm", 2), ("hybrid", 2)]
    assert plan(runs, store, settings) == {"finished": [], "resume": [], "new": runs}
    # lstm 1 finished; hybrid 1 trained to a checkpoint and was killed; lstm 2 started, no checkpoint yet
    store.finish({"model": "lstm", "seed": 1, "settings": settings["lstm"], "scores": 1}, {"test@default": ["x"]})
    started = store.begin("hybrid", 1, settings["hybrid"], "new")
    (started / "checkpoints").mkdir()
    (started / "checkpoints/checkpoint_last.pt").write_bytes(b"weights")
    store.begin("lstm", 2, settings["lstm"], "new")
    assert plan(runs, store, settings) == {"finished": [("lstm", 1)], "resume": [("hybrid", 1)],
                                           "new": [("lstm", 2), ("hybrid", 2)]}
    assert store.load("lstm", 1) == ({"model": "lstm", "seed": 1, "settings": settings["lstm"], "scores": 1},
                                     {"test@default": ["x"]})
    # resuming keeps the checkpoint; a new start wipes what was there
    assert store.begin("hybrid", 1, settings["hybrid"], "resume") == started
    assert (started / "checkpoints/checkpoint_last.pt").read_bytes() == b"weights"
    (store.run_dir("lstm", 2) / "stale.txt").write_text("old")
    store.begin("lstm", 2, settings["lstm"], "new")
    assert not (store.run_dir("lstm", 2) / "stale.txt").exists()
    # a started run of other settings starts again; a finished one of other settings stops everything
    other = {k: v | {"lr": 0.001} for k, v in settings.items()}
    assert store.status("hybrid", 1, other["hybrid"]) == "new"
    with pytest.raises(SettingsMismatch, match=r"lstm-seed1\.json was run with other settings \(lr differ\)"):
        plan(runs, store, other)
    # a record without its hypotheses is not finished
    store.hyps_path("lstm", 1).unlink()
    assert store.status("lstm", 1, settings["lstm"]) == "new"


def test_a_failed_run_is_reported_and_the_others_still_run(monkeypatch, capsys):
    from benchmarks.fairseq_runs import BenchmarkError

    done = []

    def run_one(args, store, data, probe, schedule, key, seed, test, status):
        if (key, seed) == ("lstm", 1):
            raise BenchmarkError("fairseq-train exited 1")
        done.append((key, seed, status))

    monkeypatch.setattr(quality, "run_one", run_one)
    runs = [("lstm", 1), ("hybrid", 1), ("lstm", 2)]
    todo = {("lstm", 1): "new", ("hybrid", 1): "resume", ("lstm", 2): "new"}
    with pytest.raises(BenchmarkError, match=r"1 run\(s\) failed: lstm-seed1 \(rerun the same command"):
        quality.run_all(quality.parse_args(["--jobs", "1"]), None, None, None, None, runs, None, todo)
    assert done == [("hybrid", 1, "resume"), ("lstm", 2, "new")]
    out = capsys.readouterr().out
    assert "[lstm seed 1] FAILED (a rerun retries it): benchmarks: error: fairseq-train exited 1" in out


@pytest.mark.parametrize("args,message", [
    (["--seeds", "1,1"], "--seeds '1,1': seeds must be distinct integers >= 0"),
    (["--lenpens", "0.8,1.2"], "--lenpens '0.8,1.2': must include the default 1.0"),
    (["--max-update", "30", "--interval", "7"], "--max-update 30 is not a multiple of --interval 7"),
    (["--if-seeds", "4", "--seeds", "1,2"], "--if-seeds 4: more than the 2 seed(s) in --seeds"),
    (["--jobs", "0"], "--jobs 0: must be an integer >= 1"),
    (["--grow-to", "-1"], "--grow-to -1: must be an integer >= 0"),
    (["--grow-to", "5"], "--grow-to 5: fewer than the 10 seed(s) in --seeds (0 never grows the study)"),
    (["--data", "/nonexistent/bin"],
     "--data '/nonexistent/bin': not a fairseq-preprocess directory with train and test splits"),
    (["--reference", "/nonexistent.de"], "--reference '/nonexistent.de': no such file"),
])
def test_bad_input_stops_with_one_line_before_any_work(capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        quality.parse_args(args)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"benchmarks.quality: error: {message}"]


def test_presets_train_the_sample_recipes_or_the_wmt_recipes_models_on_their_devices():
    sample = quality.parse_args([])
    command = train_command("bin", quality.MODEL["hybrid"], quality.schedule_of(sample), 3, "ckpt")
    joined = " ".join(command)
    assert "--optimizer adam" in joined and "--lr 0.003 --lr-scheduler fixed --clip-norm 1.0" in joined
    assert "--max-update 16000" in joined and "--patience 4" in joined and "--validate-interval-updates 250" in joined
    assert "--encoder-layers 2" in joined and "--share-all-embeddings" in joined and "--seed 3" in joined
    # 10 seeds of every model (hybrid_lstm --input-feeding too), seed-major
    assert sample.seed_list == list(range(1, 11)) and quality.planned(sample).count(("hybrid_if", 10)) == 1
    assert len(quality.planned(sample)) == 30
    assert quality.planned(sample)[:4] == [("lstm", 1), ("hybrid", 1), ("hybrid_if", 1), ("lstm", 2)]
    assert quality.planned(quality.parse_args(["--seeds", "1,2,3", "--if-seeds", "1"])).count(("hybrid_if", 2)) == 0
    wmt = quality.parse_args(["--preset", "wmt", "--hybrid-devices", "cuda:2,cuda:3"])
    joined = " ".join(train_command("bin", quality.MODEL["lstm"], quality.schedule_of(wmt), 1, "ckpt"))
    assert "--lr 0.001 --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --clip-norm 5.0" in joined
    assert "--max-tokens 8000" in joined and "--dropout 0.2" in joined and "--encoder-layers" not in joined
    assert model_options("lstm", "wmt", "cuda:2,cuda:3") == "--arch lstm_luong_wmt_en_de"
    hybrid_if = model_options("hybrid_if", "wmt", "cuda:2,cuda:3")
    assert hybrid_if == "--arch hybrid_lstm_wmt_en_de --hybrid-devices cuda:2,cuda:3 --input-feeding"
    # the hybrid sees the GPUs it names; the baseline and beam search only the first; CPU runs none
    assert visible_devices(hybrid_if, "cuda:2,cuda:3") is None
    assert visible_devices("--arch lstm_luong_wmt_en_de", "cuda:2,cuda:3") == "2"
    assert visible_devices("--arch lstm", "cpu") == ""


def test_the_wmt_recipes_quality_stage_runs_the_study_with_the_recipes_settings(tmp_path):
    import subprocess

    for name in ("bin/train.en-de.en.idx", "bin/test.en-de.en.idx", "clean/test.ref.de", "clean/test.en"):
        (tmp_path / "wmt" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "wmt" / name).write_text("")  # what the study checks exists before any work
    env = dict(os.environ, DRY_RUN="1", GPUS="0,1", MAX_UPDATE="20000", SAVE_INTERVAL="2000",
               QUALITY_SEEDS="1,2,3", DATA_DIR=str(tmp_path / "wmt"))
    proc = subprocess.run(["bash", "recipes/wmt17_en_de/run.sh", "quality"], cwd=quality.ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[-1]
    assert line.startswith("quality   [would run] the quality study")
    study = line.split("&& ", 1)[1].rstrip(")").split()
    args = quality.parse_args(study[3:])  # what the stage would run parses, with the recipe's settings
    assert (args.preset, args.hybrid_devices, args.max_update, args.interval) == ("wmt", "cuda:0,cuda:1", 20000, 2000)
    assert args.seed_list == [1, 2, 3] and args.name == "wmt17_en_de" and args.remove_bpe == "sentencepiece"
    assert args.reference == str(tmp_path / "wmt/clean/test.ref.de")
    bad = subprocess.run(["bash", "recipes/wmt17_en_de/run.sh", "quality"], cwd=quality.ROOT,
                         env=env | {"SAVE_INTERVAL": "3000"}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "MAX_UPDATE=20000 is not a multiple of SAVE_INTERVAL=3000" in bad.stderr


@pytest.mark.slow
def test_quick_end_to_end_stores_runs_reports_and_a_rerun_trains_nothing(sample_data, tmp_path, capsys):
    """On the suite's shared 400/20/20 sample (conftest.sample_data); 100 bootstrap resamples
    (the report's machinery, not its precision, is checked here)."""
    tiny = sample_data
    common = ["--quick", "--if-seeds", "0", "--data", str(tiny / "bin"), "--work", str(tmp_path / "work"),
              "--name", "tiny", "--reference", str(tiny / "raw/test.de"), "--source", str(tiny / "raw/test.en"),
              "--samples", "100"]
    quality.main(common + ["--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out/tiny.json").read_text())
    assert report["partial"] is None and report["test_sentences"] == 20
    assert [(r["model"], r["seed"]) for r in report["runs"]] == [("lstm", 1), ("hybrid", 1)]
    params = {r["model"]: r["parameters"] for r in report["runs"]}
    assert params["lstm"] > params["hybrid"]  # input feeding widens decoder layer 0
    refs = (tiny / "raw/test.de").read_text(encoding="utf-8").splitlines()
    sources = (tiny / "raw/test.en").read_text(encoding="utf-8").splitlines()
    groups = report["probe"]["groups"]
    assert groups == probe_groups([len(s.split()) for s in sources]) and groups
    for run in report["runs"]:
        stop = run["stop"]
        assert stop["stopped_by"] in ("patience", "max_update") and stop["last_updates"] <= 20
        assert [p["updates"] for p in run["curve"]] == list(range(10, stop["last_updates"] + 1, 10))
        assert run["speed"]["timed_tokens"] > 0 and run["memory"]["peak_rss_bytes"] > 50 * 2 ** 20
        # fairseq logs train_wall in whole seconds: 10 tiny updates may round to 0 (no rate then)
        assert run["speed"]["tokens_per_second"] is None or run["speed"]["tokens_per_second"] > 0
        assert set(run["lenpen_valid_bleu"]) == {"1.0", "1.4"} and run["best_lenpen"] in (1.0, 1.4)
        _, hyps = Store(tmp_path / "out/runs/tiny", tmp_path / "work/tiny").load(run["model"], 1)
        assert len(hyps["test@default"]) == 20 and len(hyps["probe@default"]) == len(groups)
        assert run["measures"]["BLEU"] == pytest.approx(sacrebleu.corpus_bleu(hyps["test@default"], [refs]).score,
                                                        abs=0.005)
        probe_refs = join(refs, groups)
        assert run["scores"]["probe@default"]["chrf"] == round(
            sacrebleu.corpus_chrf(hyps["probe@default"], [probe_refs]).score, 2)
        assert not (tmp_path / f"work/tiny/{run['model']}-seed1/checkpoints").exists()  # removed once stored
    entry = report["comparisons"]["hybrid - lstm"]["measures"]["BLEU"]
    assert entry["welch"]["ci95"] is None and entry["verdict"] == "no difference detected"  # one seed each
    assert entry["bootstrap"]["seeds"] == [1, 1] and entry["bootstrap"]["samples"] == 100
    markdown = (tmp_path / "out/tiny.md").read_text(encoding="utf-8")
    assert "![quality study](tiny.png)" in markdown and "made-up probe" in markdown
    assert (tmp_path / "out/tiny.png").stat().st_size > 10_000
    # the rerun skips both runs: nothing is trained or generated again
    logs = {p: p.stat().st_mtime_ns for p in (tmp_path / "work/tiny").rglob("*.log")}
    capsys.readouterr()
    quality.main(common + ["--out", str(tmp_path / "out")])
    assert "plan: lstm-seed1: finished, hybrid-seed1: finished" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "work/tiny").rglob("*.log")} == logs
    assert json.loads((tmp_path / "out/tiny.json").read_text())["runs"] == report["runs"]
    # a missing run is reported as partial by --report-only, which trains nothing
    for path in (tmp_path / "out/runs/tiny").glob("hybrid-seed1.*"):
        os.remove(path)
    quality.main(common + ["--out", str(tmp_path / "out"), "--report-only"])
    partial = json.loads((tmp_path / "out/tiny.json").read_text())
    assert partial["partial"] == "1 of 2 runs finished" and [r["model"] for r in partial["runs"]] == ["lstm"]


def _growth_run(monkeypatch, tmp_path, argv, needed_at):
    """quality.run with training and analysis replaced: the headline interval meets its target
    once the plan has ``needed_at`` seeds per model (the spread needs ``needed_at``)."""
    trained = []  # the runs each round trained (the store stays empty: plan() calls every run new)
    monkeypatch.setattr(quality, "sample_data", lambda vocab, path: tmp_path)
    monkeypatch.setattr(quality, "test_set", lambda args: {"probe_groups": []})
    monkeypatch.setattr(quality, "write_probe", lambda *a: tmp_path)
    monkeypatch.setattr(quality, "run_all", lambda args, store, data, probe, schedule, runs, test, todo:
                        trained.append([r for r in runs if not any(r in done for done in trained)]))

    def report_of(args, store, schedule, data, runs, test, started):
        seeds = len(args.seed_list)
        width = {"met": seeds >= needed_at, "seeds_needed": needed_at, "target": 0.35,
                 "bootstrap_half_width": 0.4, "welch_half_width": 0.38}
        return {"partial": "runs missing" if args.report_only and seeds > 10 else None,  # only 10 stored
                "comparisons": {"hybrid - lstm": {"measures": {"BLEU": {"equivalence": {"width": width}}}}},
                "settings": {"seeds": list(args.seed_list), "if_seeds": args.if_seeds}}

    monkeypatch.setattr(quality, "report_of", report_of)
    args = quality.parse_args(argv + ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    return quality.run(args), trained


def test_the_study_grows_to_the_seeds_its_spread_needs_then_stops(monkeypatch, tmp_path, capsys):
    report, trained = _growth_run(monkeypatch, tmp_path, [], needed_at=12)
    assert report["settings"] == {"seeds": list(range(1, 13)), "if_seeds": 12}
    assert [sorted({seed for _, seed in runs}) for runs in trained] == [list(range(1, 11)), [11, 12]]
    assert sorted(trained[1]) == sorted((key, seed) for key in ("lstm", "hybrid", "hybrid_if") for seed in (11, 12))
    assert ("hybrid - lstm BLEU: 95% half-width ±0.40/±0.38, target ±0.35, the spread needs 12 seeds per model: "
            "growing to 12 (--grow-to 24)") in capsys.readouterr().out


@pytest.mark.parametrize("argv,seeds", [(["--grow-to", "0"], 10), (["--grow-to", "11"], 11),
                                        (["--if-seeds", "5", "--grow-to", "11"], 11)])
def test_growth_stops_at_its_cap_and_leaves_a_partial_if_plan_alone(monkeypatch, tmp_path, argv, seeds):
    report, trained = _growth_run(monkeypatch, tmp_path, argv, needed_at=12)
    assert report["settings"]["seeds"] == list(range(1, seeds + 1))
    assert report["settings"]["if_seeds"] == (5 if "--if-seeds" in argv else seeds)
    assert len(trained) == (1 if seeds == 10 else 2)


def test_report_only_reports_on_the_grown_plan_without_training(monkeypatch, tmp_path):
    report, trained = _growth_run(monkeypatch, tmp_path, ["--report-only"], needed_at=12)
    assert trained == []
    assert report["settings"]["seeds"] == list(range(1, 13)) and report["partial"] == "runs missing"


def test_only_the_bundled_samples_full_study_grows_by_default(tmp_path):
    for name in ("train.en-de.en.idx", "test.en-de.en.idx"):
        (tmp_path / name).write_text("")
    (tmp_path / "test.en").write_text("a\n")
    raw = str(tmp_path / "test.en")
    own_data = ["--data", str(tmp_path), "--reference", raw, "--source", raw]
    assert quality.parse_args([]).grow_to == quality.SAMPLE_GROW_TO == 24
    for argv in (["--quick"], ["--preset", "wmt"], own_data):  # their runs cost what their data costs
        assert quality.parse_args(argv).grow_to == 0, argv
    assert quality.parse_args(["--preset", "wmt", "--grow-to", "12"]).grow_to == 12
