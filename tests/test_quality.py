"""The quality study (benchmarks/quality*.py): length buckets, scores against sacreBLEU
called directly, the paired bootstrap against sacreBLEU's own --paired-bs, the unigram
level against counts from the raw text, fairseq log parsing, one-line errors, and
``--quick`` end to end on a tiny corpus (JSON, PNG and Markdown written and readable)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from benchmarks import quality_stats
from benchmarks.quality_runs import learning_curve

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

ROOT = Path(__file__).resolve().parent.parent
REFS = ["the cat sat on the mat", "a dog barks at night", "it is raining again today",
        "we went to the market", "he reads a long book", "the sun is shining bright",
        "she plays the piano well", "they are late for school"]
GOOD = ["the cat sat on the mat", "a dog barks at night", "it is raining today",
        "we went to a market", "he reads a long book", "the sun shines bright",
        "she plays piano well", "they are late to school"]
BAD = ["cat the mat", "dog night", "raining is it", "market we", "book long", "sun the",
       "piano she", "late they"]


def test_length_buckets_are_thirds_by_source_length_and_the_longest_tenth():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10, 3, 5]  # 12 sentences
    buckets = quality_stats.length_buckets(lengths)
    assert buckets["short third"]["indices"] == [1, 3, 5, 10]  # lengths 1, 2, 3, 3
    assert buckets["middle third"]["indices"] == [0, 7, 8, 11]  # lengths 4, 5, 5, 6
    assert buckets["long third"]["indices"] == [2, 4, 6, 9]  # lengths 7, 8, 9, 10
    assert buckets["longest 10%"]["indices"] == [2, 9]
    assert buckets["longest 10%"]["source_words"] == [9, 10]
    assert buckets["short third"]["source_words"] == [1, 3]
    with pytest.raises(ValueError, match="at least 3"):
        quality_stats.length_buckets([1, 2])


def test_scores_equal_sacrebleu_on_the_whole_set_and_on_each_bucket():
    buckets = quality_stats.length_buckets([len(r.split()) for r in REFS])
    scores = quality_stats.score(GOOD, REFS, buckets)
    assert scores["bleu"] == round(sacrebleu.corpus_bleu(GOOD, [REFS]).score, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(GOOD, [REFS]).score, 2)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    for info, bucket in zip(buckets.values(), scores["buckets"].values()):
        hyp = [GOOD[i] for i in info["indices"]]
        ref = [REFS[i] for i in info["indices"]]
        assert bucket["bleu"] == round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2)


def test_paired_bootstrap_of_one_seed_agrees_with_sacrebleu_paired_bs():
    ours = quality_stats.paired_bootstrap([GOOD], [BAD], REFS)
    theirs = quality_stats.sacrebleu_paired_bs(GOOD, BAD, REFS)["bleu"]
    assert ours["difference"] == pytest.approx(theirs["system"] - theirs["baseline"], abs=1e-9)
    # the same resampled sentences: the bootstrap means agree (sacreBLEU sums float32 stats)
    assert ours["bootstrap_mean"] == pytest.approx(theirs["system_mean"] - theirs["baseline_mean"], abs=1e-3)
    assert 0 < ours["ci95"][0] <= ours["difference"] <= ours["ci95"][1]
    assert ours["p_not_better"] < 0.05


def test_paired_bootstrap_of_identical_systems_is_zero_and_seed_means_are_averaged():
    same = quality_stats.paired_bootstrap([GOOD, BAD], [GOOD, BAD], REFS, metric_name="chrf")
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    mixed = quality_stats.paired_bootstrap([GOOD, GOOD], [GOOD, BAD], REFS, subset=[0, 2, 4, 6])
    sub = [0, 2, 4, 6]
    expected = (sacrebleu.corpus_bleu([GOOD[i] for i in sub], [[REFS[i] for i in sub]]).score
                - sacrebleu.corpus_bleu([BAD[i] for i in sub], [[REFS[i] for i in sub]]).score) / 2
    assert mixed["difference"] == pytest.approx(expected)
    assert mixed["sentences"] == 4


def test_mean_std_is_the_sample_standard_deviation():
    stat = quality_stats.mean_std([1.0, 2.0, 6.0])
    assert stat["mean"] == pytest.approx(3.0)
    assert stat["std"] == pytest.approx(np.std([1.0, 2.0, 6.0], ddof=1))
    assert quality_stats.mean_std([4.0])["std"] == 0.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from cli import prepared_sample

    return prepared_sample(tmp_path_factory.mktemp("tiny"), train=300, valid=40, test=40)


def test_unigram_perplexity_matches_counts_from_the_raw_text(tiny):
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(tiny / "bin/dict.de.txt"))

    def ids(split):
        lines = (tiny / f"raw/{split}.de").read_text(encoding="utf-8").splitlines()
        return [dictionary.index(w) for line in lines for w in line.split()] + [dictionary.eos()] * len(lines)

    counts = np.bincount(ids("train"), minlength=len(dictionary)) + 1.0
    bits = -np.mean(np.log2(counts[ids("valid")] / counts.sum()))
    result = quality_stats.unigram_perplexity(tiny / "bin")
    assert result["bits_per_token"] == pytest.approx(bits)
    assert result["perplexity"] == pytest.approx(2 ** bits)


def test_learning_curve_sums_train_wall_up_to_each_validation():
    def line(kind, record):
        return f"2026-12-03 10:00:00 | INFO | {kind} | " + json.dumps({k: str(v) for k, v in record.items()})

    log = "\n".join([
        "2026-12-03 | INFO | fairseq_cli.train | num. shared model params: 3,000,000 (num. trained: 3,000,000)",
        line("train_inner", {"num_updates": 10, "train_wall": 4, "wall": 5}),
        line("train_inner", {"num_updates": 20, "train_wall": 3, "wall": 9}),
        line("valid", {"valid_loss": 9.5, "valid_nll_loss": 9.0, "valid_ppl": 512.0, "valid_num_updates": 20}),
        line("train_inner", {"num_updates": 30, "train_wall": 5, "wall": 16}),
        line("train_inner", {"num_updates": 40, "train_wall": 2, "wall": 19}),
        line("valid", {"valid_loss": 8.5, "valid_nll_loss": 8.0, "valid_ppl": 256.0, "valid_num_updates": 40}),
    ])
    curve = learning_curve(log)
    assert [(p["updates"], p["train_seconds"], p["wall_seconds"], p["ppl"]) for p in curve] == [
        (20, 7.0, 9.0, 512.0), (40, 14.0, 19.0, 256.0)]


def run_quality(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.quality", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("args,message", [
    (["--seeds", "1,1"], "--seeds '1,1': seeds must be distinct"),
    (["--seeds", "a"], "--seeds 'a': must be comma-separated integers"),
    (["--updates", "30", "--interval", "7"], "--updates 30 is not a multiple of --interval 7"),
    (["--updates", "40", "--interval", "10", "--average", "5"], "--average 5 x --interval 10 exceeds --updates 40"),
    (["--jobs", "0"], "--jobs 0: must be an integer >= 1"),
    (["--data", "/nonexistent/bin"], "--data '/nonexistent/bin': not a fairseq-preprocess directory"),
    (["--reference", "/nonexistent.de"], "--reference '/nonexistent.de': no such file"),
])
def test_bad_input_stops_with_one_line_before_any_work(tmp_path, args, message):
    proc = run_quality(*args, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    message = proc.stderr.split("error: ", 1)[1].strip()
    assert proc.stderr.strip().splitlines() == [f"benchmarks.quality: error: {message}"]
    assert message in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_quick_end_to_end_writes_json_png_and_markdown(tiny, tmp_path):
    proc = run_quality("--quick", "--jobs", "1", "--data", str(tiny / "bin"), "--work", str(tmp_path / "work"),
                       "--out", str(tmp_path / "out"), "--name", "tiny",
                       "--reference", str(tiny / "raw/test.de"), "--source", str(tiny / "raw/test.en"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_quick_report(tiny, tmp_path, proc.stdout)
    # a rerun reports from the cached runs without training again
    again = run_quality("--quick", "--jobs", "1", "--data", str(tiny / "bin"), "--work", str(tmp_path / "work"),
                        "--out", str(tmp_path / "out2"), "--name", "tiny", "--report-only",
                        "--reference", str(tiny / "raw/test.de"), "--source", str(tiny / "raw/test.en"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "out2/tiny.json").read_text())["runs"] == \
        json.loads((tmp_path / "out/tiny.json").read_text())["runs"]


def check_quick_report(tiny: Path, tmp_path: Path, stdout: str) -> None:
    report = json.loads((tmp_path / "out/tiny.json").read_text())
    assert report["partial"] is None and report["test_sentences"] == 40
    assert [(r["model"], r["seed"]) for r in report["runs"]] == [("lstm", 1), ("hybrid", 1), ("hybrid_if", 1)]
    settings = report["settings"]
    assert (settings["updates"], settings["interval"], settings["average"], settings["seeds"]) == (40, 10, 2, [1])
    params = {r["model"]: r["parameters"] for r in report["runs"]}
    assert params["lstm"] == params["hybrid_if"] > params["hybrid"]  # input feeding widens decoder layer 0
    refs = (tiny / "raw/test.de").read_text(encoding="utf-8").splitlines()
    for run in report["runs"]:
        assert [p["updates"] for p in run["curve"]] == [10, 20, 30, 40]
        assert all(p["train_seconds"] >= 0 and p["ppl"] > 1 for p in run["curve"])
        # the last two interval checkpoints fairseq wrote (none at an update that ends an epoch)
        saved = {int(m) for m in re.findall(r"Saved checkpoint \S*checkpoint_\d+_(\d+)\.pt", (
            tmp_path / f"work/tiny/{run['model']}-seed1/train.log").read_text())}
        assert run["averaged_updates"] == sorted(saved)[-2:] and run["averaged_updates"][-1] == 40
        hyps = (tmp_path / f"work/tiny/{run['model']}-seed1/hyp.final.txt").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == 40
        assert run["scores"]["final"]["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
        assert set(run["scores"]["averaged"]["buckets"]) == {"short third", "middle third", "long third", "longest 10%"}
        assert "tok:13a" in run["scores"]["final"]["bleu_signature"]
    assert sum(b["sentences"] for k, b in report["buckets"].items() if "third" in k) == 40
    assert set(report["comparisons"]) == {"hybrid - lstm", "hybrid - hybrid_if"}
    for comparison in report["comparisons"].values():
        for kind in ("final", "averaged"):
            low, high = comparison[kind]["bleu"]["ci95"]
            assert low <= high
            assert "bs:1000" in comparison[kind]["sacrebleu_paired_bs_per_seed"]["1"]["bleu"]["signature"]
    assert report["unigram"]["perplexity"] > 1 and len(report["machine"]["loadavg_end"]) == 3
    from PIL import Image

    with Image.open(tmp_path / "out/tiny.png") as image:
        assert image.format == "PNG" and image.size[0] > 800
    markdown = (tmp_path / "out/tiny.md").read_text(encoding="utf-8")
    assert "| fairseq lstm (input feeding) |" in markdown
    assert f"![quality study]({os.path.relpath(tmp_path / 'out/tiny.png', ROOT)})" in markdown
    assert markdown in stdout
