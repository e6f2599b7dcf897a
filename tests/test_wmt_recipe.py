"""The WMT14/WMT17 en-de recipes, offline: a tiny fake mirror (tests/fake_wmt_mirror.py)
in the real archive layouts, fetched through MIRROR=file://... (WMT14, resuming a download
left half done) or http://... (WMT17), end to end to BLEU on the CPU with a tiny model; plus
corrupted downloads, an unreachable mirror, re-runs that skip, DRY_RUN, and one-line errors
for bad settings."""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Optional

import pytest

from fake_wmt_mirror import build, filtered

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SAMPLE = REPO / "data" / "ende-sample"
TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-hidden-size 32 --decoder-hidden-size 32 --decoder-out-embed-dim 32")
STAGES = ["prepare", "clean", "spm", "binarize", "train", "generate", "score"]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("mirror")
    build(dest, pairs=400, test=40)
    return dest


def run_recipe(recipe: str, stage: Optional[str], env: Dict[str, str], timeout: int = 300,
               path: Optional[str] = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PATH=path or f"{BIN}{os.pathsep}{os.environ['PATH']}",
                PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **env)
    full.pop("CUDA_VISIBLE_DEVICES", None)
    for name in ("MIRROR", "GPUS", "DRY_RUN", "FORCE", "ARCH"):
        if name not in env:
            full.pop(name, None)
    args = ["bash", str(REPO / "recipes" / recipe / "run.sh")] + ([stage] if stage else [])
    return subprocess.run(args, cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)


def mirror_env(mirror: Path, data: Path, **extra: str) -> Dict[str, str]:
    return {"MIRROR": mirror.as_uri(), "CHECKSUMS": str(mirror / "checksums.tsv"),
            "DATA_DIR": str(data), "RESULTS": str(data / "results"), "RETRIES": "2", **extra}


def tiny_env(mirror: Path, data: Path, **extra: str) -> Dict[str, str]:
    return mirror_env(mirror, data, GPUS="cpu", SPM_VOCAB="400", MAX_TOKENS="1000",
                      MAX_UPDATE="30", SAVE_INTERVAL="10", LOG_INTERVAL="10", WORKERS="2",
                      EXTRA_TRAIN_ARGS=TINY, **extra)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}")
    return proc


def last_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def lines(path: Path) -> list:
    return path.read_text(encoding="utf-8").splitlines()


def file_states(root: Path) -> Dict[str, tuple]:
    """Every file under root: (size, modification time in ns), to tell a rerun that wrote nothing."""
    states = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            state = path.stat()
            states[str(path.relative_to(root))] = (state.st_size, state.st_mtime_ns)
    return states


def test_wmt14_end_to_end_on_the_fake_mirror_resuming_a_download_then_a_rerun_skips_every_stage(mirror, tmp_path):
    data = tmp_path / "wmt14"
    env = tiny_env(mirror, data, CHECKPOINT="avg", AVG_N="2")
    # an interrupted download: half of Europarl is there; prepare goes on from its last byte
    archive = (mirror / "training-parallel-europarl-v7.tgz").read_bytes()
    (data / "downloads").mkdir(parents=True)
    (data / "downloads" / "training-parallel-europarl-v7.tgz.part").write_bytes(archive[: len(archive) // 2])
    first = ok(run_recipe("wmt14_en_de", "all", env))
    assert f"resuming at byte {len(archive) // 2}" in first.stderr
    assert (data / "downloads" / "training-parallel-europarl-v7.tgz").read_bytes() == archive
    assert (data / "raw" / ".done").exists()

    # prepare: the three corpora (400 pairs + 5 noisy ones each), test set from the sgm
    assert len(lines(data / "raw" / "train.en")) == len(lines(data / "raw" / "train.de")) == 3 * 405
    assert lines(data / "clean" / "test.ref.de") == lines(SAMPLE / "test.de")[40:80]  # newstest2014 sgm
    assert lines(data / "raw" / "valid.en") == lines(SAMPLE / "valid.en")[:40]       # newstest2013 sgm
    assert (data / "raw" / "test.name").read_text().strip() == "newstest2014_full"
    # the filtered newstest2014, from test-filtered.tgz (md5-checked, members named ./test/...)
    assert lines(data / "clean" / "test_filtered.ref.de") == filtered(lines(SAMPLE / "test.de")[40:80])
    # clean: every kind of bad pair was dropped, punctuation normalised
    stats = json.loads((data / "clean" / "train.stats.json").read_text())
    assert set(stats["dropped"]) == {"empty", "duplicate", "longer than 80 words", "length ratio above 1.5"}
    assert stats["kept"] == len(lines(data / "clean" / "train.en"))
    assert '"Quotes" and spaces ,here.' in lines(data / "clean" / "train.en")
    # score: both BLEUs, with the signature, over the whole test set
    result = json.loads((data / "results" / "hybrid_lstm_wmt_en_de-avg.json").read_text())
    assert result["sentences"] == 40
    assert result["test_set"].startswith("newstest2014 full: 3,003 sentences (= sacrebleu -t wmt14/full")
    result_filtered = json.loads((data / "results" / "hybrid_lstm_wmt_en_de-avg-filtered.json").read_text())
    assert result_filtered["sentences"] == 30
    assert result_filtered["test_set"].startswith("newstest2014 filtered: 2,737 sentences (= sacrebleu -t wmt14 ")
    assert result["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "tokenized_bleu" in result and result["arch"] == "hybrid_lstm_wmt_en_de"
    # nothing half-written left behind
    assert not list(data.rglob("*.tmp")) and not list(data.rglob("*.part"))
    assert not (data / "generate" / "hybrid_lstm_wmt_en_de-avg" / "checkpoint_avg.pt").exists()

    before = file_states(data)
    again = ok(run_recipe("wmt14_en_de", "all", env))
    assert file_states(data) == before  # a rerun rewrites nothing: no stage ran again
    for stage in ("prepare", "clean", "spm", "binarize", "train (hybrid_lstm_wmt_en_de)",
                  "generate (hybrid_lstm_wmt_en_de, avg checkpoint)", "score"):
        assert f"{stage}: done already" in again.stderr, again.stderr
    assert "starting" not in again.stderr

    plan = ok(run_recipe("wmt14_en_de", "all", dict(env, DRY_RUN="1"))).stdout
    assert plan.count("[done, would skip]") == 6

    # training longer, as recipes/README.md says: drop the marker, raise MAX_UPDATE; it resumes
    (data / "checkpoints" / "hybrid_lstm_wmt_en_de" / ".done").unlink()
    longer = ok(run_recipe("wmt14_en_de", "train", dict(env, MAX_UPDATE="40")))
    assert "train: resuming from" in longer.stderr
    assert "num_updates 40" in longer.stderr and "num_updates 10 " not in longer.stderr


def test_wmt17_input_feeding_baseline_with_back_translation_over_an_http_mirror(mirror, tmp_path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    data = tmp_path / "wmt17"
    env = tiny_env(mirror, data, ARCH="lstm_luong_wmt_en_de", CHECKPOINT="best",
                   MIRROR=f"http://127.0.0.1:{server.server_port}/",
                   BT_EN=str(mirror / "backtranslation.en.gz"), BT_DE=str(mirror / "backtranslation.de.gz"))
    try:
        proc = ok(run_recipe("wmt17_en_de", "all", env))
    finally:
        server.shutdown()
    assert f"from http://127.0.0.1:{server.server_port}/dev.tgz" in proc.stderr
    assert (data / "raw" / ".done").exists()
    assert "backtranslation: 400 pairs" in proc.stderr
    assert len(lines(data / "raw" / "train.en")) == 4 * 405 + 400
    assert (data / "raw" / "test.name").read_text().strip() == "newstest2017"
    result = json.loads((data / "results" / "lstm_luong_wmt_en_de-best.json").read_text())
    assert result["arch"] == "lstm_luong_wmt_en_de" and result["sentences"] == 40
    assert result["test_set"].startswith("newstest2017 (= sacrebleu -t wmt17")
    assert not (data / "results" / "lstm_luong_wmt_en_de-best-filtered.json").exists()


def test_corrupted_archive_fails_its_checksum_naming_the_url(mirror, tmp_path):
    bad = tmp_path / "bad-mirror"
    shutil.copytree(mirror, bad)
    target = bad / "training-parallel-commoncrawl.tgz"
    payload = bytearray(target.read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    target.write_bytes(bytes(payload))
    data = tmp_path / "d"
    env = dict(mirror_env(bad, data), CHECKSUMS=str(mirror / "checksums.tsv"))
    line = last_line(run_recipe("wmt14_en_de", "prepare", env))
    assert line.startswith(f"download.py: error: checksum mismatch for {target.as_uri()}"), line
    assert not (data / "raw").exists()
    assert not (data / "downloads" / "training-parallel-commoncrawl.tgz").exists()
    assert not (data / "downloads" / "training-parallel-commoncrawl.tgz.part").exists()


def test_unreachable_mirror_fails_early_with_one_line(tmp_path):
    data = tmp_path / "d"
    env = {"MIRROR": (tmp_path / "nowhere").as_uri(), "DATA_DIR": str(data)}
    proc = run_recipe("wmt14_en_de", "prepare", env)
    assert last_line(proc) == (f"error: cannot reach {(tmp_path / 'nowhere').as_uri()}/"
                               "training-parallel-europarl-v7.tgz: no such file (check MIRROR, or the network)")
    after_start = proc.stderr.split("prepare: starting")[1]
    assert not re.search(r"prepare: download \d+/", after_start)  # refused before the first download
    assert not (data / "downloads").exists() or not any((data / "downloads").iterdir())


@pytest.mark.parametrize("recipe,urls", [
    ("wmt14_en_de", ["http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                     "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                     "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                     "http://data.statmt.org/wmt19/translation-task/dev.tgz",
                     "https://statmt.org/wmt14/test-filtered.tgz"]),
    ("wmt17_en_de", ["http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
                     "http://data.statmt.org/wmt18/translation-task/rapid2016.tgz"]),
])
def test_dry_run_prints_the_real_urls_and_the_plan(recipe, urls, tmp_path):
    data = tmp_path / "d"
    proc = ok(run_recipe(recipe, None, {"DRY_RUN": "1", "DATA_DIR": str(data)}))
    for url in urls:
        assert url in proc.stdout
    for stage in STAGES:
        assert f"\n{stage} " in proc.stdout
    assert "MISSING" not in proc.stdout  # every file has a published sha256
    assert "--hybrid-devices cuda:0,cuda:1,cuda:2,cuda:3" in proc.stdout
    assert not data.exists()


@pytest.mark.parametrize("stage,env,message", [
    ("tokenize", {},
     "error: unknown stage 'tokenize': use one of: prepare clean spm binarize train generate score all"),
    ("all", {"GPUS": "0,gpu1"},
     "error: GPUS='0,gpu1': use GPU indices like 0,1,2,3 (one process drives them all) or cpu"),
    ("all", {"GPUS": "0,1,1"}, "error: GPUS='0,1,1': GPU 1 is listed twice"),
    ("train", {"GPUS": "0,1,2,3"}, "error: GPUS='0,1,2,3': this machine has 0 CUDA device(s)"),
    ("all", {"ARCH": "transformer"}, "error: ARCH='transformer': use hybrid_lstm_wmt_en_de"),
    ("all", {"CHECKPOINT": "first"}, "error: CHECKPOINT='first': use best, last or avg"),
    ("all", {"MAX_UPDATE": "0"}, "error: MAX_UPDATE='0': must be an integer >= 1"),
    ("all", {"MIRROR": "ftp://x"}, "error: MIRROR='ftp://x': use a file://, http:// or https:// URL"),
    ("all", {"BT_EN": "x.en"}, "error: BT_EN and BT_DE go together"),
    ("all", {"MAX_LEN_B": "1.5"}, "error: MAX_LEN_B='1.5': must be an integer >= 0"),  # fairseq's is an int
    ("all", {"LABEL_SMOOTHING": "1"}, "error: LABEL_SMOOTHING='1': must be a number >= 0 and < 1"),
    ("all", {"LR": "1e-3", "CLIP_NORM": "abc"}, "error: CLIP_NORM='abc': must be a number >= 0"),
])
def test_bad_settings_give_one_line_before_any_work(stage, env, message, tmp_path):
    if "CUDA device" in message:
        import torch
        if torch.cuda.device_count():
            pytest.skip("this machine has GPUs")
    data = tmp_path / "d"
    proc = run_recipe("wmt14_en_de", stage, dict(env, DATA_DIR=str(data)))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.strip().startswith(message), proc.stderr
    assert not data.exists()


def test_missing_tool_gives_one_line(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python").symlink_to(sys.executable)
    proc = run_recipe("wmt14_en_de", "binarize", {"DATA_DIR": str(tmp_path / "d")},
                      path=f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert last_line(proc).startswith("error: 'fairseq-preprocess' not found on PATH")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_not_enough_disk_space_fails_before_downloading(mirror, tmp_path):
    table = tmp_path / "checksums.tsv"
    rows = (mirror / "checksums.tsv").read_text().splitlines()
    table.write_text("\n".join(
        "\t".join(f.split("\t")[:2] + ["1" + "0" * 18] + f.split("\t")[3:]) if not f.startswith("#") else f
        for f in rows) + "\n")
    data = tmp_path / "d"
    proc = run_recipe("wmt14_en_de", "prepare", dict(mirror_env(mirror, data), CHECKSUMS=str(table)))
    assert last_line(proc).startswith(f"error: not enough disk space in {data / 'downloads'}: about ")
    assert not list((data / "downloads").iterdir())


def test_back_translations_count_in_the_disk_space_check(mirror, tmp_path):
    huge = {}
    for lang in ("en", "de"):
        huge[lang] = tmp_path / f"news.bt.en-de.{lang}"
        with open(huge[lang], "wb") as handle:
            handle.truncate(10 ** 13)  # sparse: 10 TB on paper, nothing on disk
    data = tmp_path / "d"
    env = mirror_env(mirror, data, BT_EN=str(huge["en"]), BT_DE=str(huge["de"]))
    line = last_line(run_recipe("wmt17_en_de", "prepare", env))
    assert line.startswith(f"error: not enough disk space in {data / 'downloads'}: about 40000"), line
    assert "and the back-translations" in line
    assert not list((data / "downloads").iterdir())
