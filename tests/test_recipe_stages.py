"""recipes/sample/run.sh (and the WMT recipes' shared checks in recipes/lib/stage.sh): a stage
run before the one it reads, a tool that fails inside a stage, and settings that are not
numbers, paths or stages the recipe can use: one line on the terminal (stderr), exit status
1, nothing created; numbers are read as Python reads them (``LR=1e-3``)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STAGE_SH = REPO / "recipes" / "lib" / "stage.sh"


def sample(stage, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
                **{"WORK": str(tmp_path / "work"), "RESULTS": str(tmp_path / "results"), **env})
    args = [stage] if isinstance(stage, str) else list(stage)
    return subprocess.run(["bash", str(REPO / "recipes" / "sample" / "run.sh"), *args], env=full,
                          capture_output=True, text=True, timeout=120)


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and proc.stdout == "", proc.stderr
    return lines[0]


@pytest.mark.parametrize("stage,needs", [("binarize", "spm"), ("train", "bin"),
                                         ("generate", "checkpoints"), ("score", "generate")])
def test_a_stage_before_the_one_it_reads_is_one_line(tmp_path, stage, needs):
    """``score`` first was `cat: .../seconds: No such file` and a traceback."""
    made_by = {"spm": "spm", "bin": "binarize", "checkpoints": "train", "generate": "generate"}[needs]
    assert one_line(sample(stage, tmp_path)) == (
        f"error: {stage}: {tmp_path}/work/{needs} is not complete: run the {made_by} stage first")
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("setting,message", [
    ("LR=1e-3x", "LR='1e-3x': must be a number > 0"),
    ("LR=0", "LR='0': must be a number > 0"),
    ("LR=nan", "LR='nan': must be a number > 0"),
    ("TRAIN_MINUTES=inf", "TRAIN_MINUTES='inf': must be a number > 0"),
    ("DROPOUT=1", "DROPOUT='1': must be a number >= 0 and < 1"),
    ("DROPOUT=.3.", "DROPOUT='.3.': must be a number >= 0 and < 1"),
    ("MAX_TOKENS=2000.5", "MAX_TOKENS='2000.5': must be an integer >= 100"),
    ("BEAM=99999999999999999999", "BEAM='99999999999999999999': must be an integer >= 1"),
    ("WORK={tmp}/a:b", "WORK='{tmp}/a:b': fairseq reads ':' in a data or checkpoint path as a list of "
                       "paths: use a directory without ':'"),
    ("WORK={tmp}/file", "WORK='{tmp}/file' is a file, not a directory"),
    ("RESULTS={tmp}/file", "RESULTS='{tmp}/file' is a file, not a directory"),
    ("FORCE=yes", "FORCE='yes': use 1 (yes) or 0 (no)"),  # was read as 0
    ("MAX_UPDATE=0", "MAX_UPDATE='0': must be an integer >= 1"),
    ("INTERVAL=25O", "INTERVAL='25O': must be an integer >= 1"),
    ("CHECKPOINT=first", "CHECKPOINT='first': use best, last or avg (average of the last AVG_N saved)"),
    ("AVG_N=-1", "AVG_N='-1': must be an integer >= 1"),
    ("LENPEN=-1", "LENPEN='-1': must be a number >= 0"),
    ("MAX_LEN_B=1.5", "MAX_LEN_B='1.5': must be an integer >= 0"),
])
def test_settings_the_recipe_cannot_use_are_one_line(tmp_path, setting, message):
    (tmp_path / "file").write_text("")
    name, value = setting.format(tmp=tmp_path).split("=", 1)
    assert one_line(sample("all", tmp_path, **{name: value})) == f"error: {message.format(tmp=tmp_path)}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_second_stage_argument_is_refused(tmp_path):
    assert one_line(sample(["train", "generate"], tmp_path)) == (
        "error: one stage at a time ('train generate'): use all, spm, binarize, train, generate or score")


@pytest.mark.parametrize("kind,given,plain", [
    ("positive", "1e-3", "0.001"), ("positive", ".5", "0.5"), ("positive", "3", "3"),
    ("positive", "2E+2", "200"), ("positive", "1e-5", "1e-05"), ("fraction", "0", "0"),
    ("non-negative", "0.0", "0"),
])
def test_numbers_are_read_as_python_reads_them_and_passed_on_plainly(kind, given, plain):
    """LR=1e-3 was refused as not a number (any exponent was)."""
    script = f'. "{STAGE_SH}"; X="$1"; require_float {kind} X; printf "%s" "$X"'
    proc = subprocess.run(["bash", "-c", script, "bash", given], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == plain, proc.stderr
    assert float(proc.stdout) == float(given)


def test_an_exponent_passes_the_sample_recipes_checks(tmp_path):
    """The run gets past the settings to the first stage's own check."""
    proc = sample("score", tmp_path, LR="1e-3", TRAIN_MINUTES="2.5e1", DROPOUT="3E-1")
    assert one_line(proc).startswith("error: score: ")


@pytest.mark.slow
def test_a_failing_fairseq_generate_is_named_on_the_terminal(sample_data, tmp_path):
    """Its one line was only inside generate.log; the stage's output is not created."""
    work = tmp_path / "work"
    shutil.copytree(sample_data / "bin", work / "bin")
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "checkpoint_best.pt").write_bytes(b"not a checkpoint")
    (work / "checkpoints" / ".done").write_text("test\n")
    proc = sample("generate", tmp_path, BEAM="1", CHECKPOINT="best")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: generate: fairseq-generate failed: fairseq_hybrid: error: "
                           f"'{work}/checkpoints/checkpoint_best.pt' is not a readable fairseq checkpoint")
    assert last.endswith(f"(log: {work}/generate.tmp/generate.log)")
    assert not (work / "generate").exists()


def test_averaging_a_missing_checkpoint_is_one_line(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"x")
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / "lib" / "average.py"), "--out",
                           str(tmp_path / "avg.pt"), str(tmp_path / "a.pt"), str(tmp_path / "b.pt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"average.py: error: checkpoint '{tmp_path}/b.pt' does not exist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt"]


def test_the_score_stage_with_spaces_in_every_path(tmp_path):
    """WORK and RESULTS with spaces: the stage reads the generate stage's output and writes
    bleu.json (here from a made-up output that repeats the references: BLEU 100)."""
    work, results = tmp_path / "my work", tmp_path / "my results"
    generated = work / "generate"
    generated.mkdir(parents=True)
    references = (REPO / "data" / "ende-sample" / "test.de").read_text(encoding="utf-8").splitlines()
    (generated / "test.out").write_text("".join(f"D-{i}\t-0.5\t{line}\n" for i, line in enumerate(references)),
                                        encoding="utf-8")
    for name, text in (("seconds", "7"), ("beam", "3"), (".done", "test")):
        (generated / name).write_text(text + "\n")
    proc = sample("score", tmp_path, WORK=str(work), RESULTS=str(results), LR="1e-3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((results / "bleu.json").read_text())
    assert result["bleu"] == 100.0 and result["sentences"] == len(references)
    assert result["beam"] == 3 and result["generate_seconds"] == 7  # what generate ran with
