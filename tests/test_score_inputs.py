"""recipes/lib/score.py and wmt_score.py given bad input: one line naming the bad value and
what is allowed, exit status 1, checked before any work, nothing written (no JSON, no
temporary file)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOOD = "D-0\t-0.1\tDas ist gut.\nD-1\t-0.2\tEr ist da.\n"


def score(tmp_path: Path, *args: str, script: str = "score.py") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "recipes" / "lib" / script), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def files(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "ref.de").write_text("Das ist gut.\nEr ist da.\n", encoding="utf-8")
    (tmp_path / "src.en").write_text("That is good.\nHe is here.\n", encoding="utf-8")
    (tmp_path / "gen.out").write_text(GOOD, encoding="utf-8")
    (tmp_path / "out").mkdir()
    return tmp_path


BASE = ["--generate-output", "gen.out", "--reference", "ref.de", "--json", "out/bleu.json"]


@pytest.mark.parametrize("script", ["score.py", "wmt_score.py"])
@pytest.mark.parametrize("setup,args,message", [
    # UnicodeDecodeError
    ({"ref.de": b"Das ist gut.\nEr ist \xff da.\n"}, BASE,
     "--reference 'ref.de' is not UTF-8 text: line 2 has the byte 0xff; convert it to UTF-8"),
    ({"gen.out": b"D-0\t-0.1\t\xe4\n"}, BASE, "--generate-output 'gen.out' is not UTF-8 text: line 1"),
    # IndexError inside sacrebleu
    ({"ref.de": b"", "gen.out": b""}, BASE, "--reference 'ref.de' is empty: give the test set's target side"),
    # FileNotFoundError
    ({}, ["--generate-output", "nope.out", *BASE[2:]], "--generate-output 'nope.out' does not exist"),
    ({}, ["--generate-output", "out", *BASE[2:]], "--generate-output 'out' is a directory: give a text file"),
    # JSONDecodeError, TypeError
    ({}, [*BASE, "--extra", "{model: x}"], "--extra '{model: x}' is not JSON (Expecting property name"),
    ({}, [*BASE, "--extra", "[1, 2]"], "--extra '[1, 2]' is a JSON list, not an object: give e.g."),
    ({}, [*BASE, "--extra", '{"chrf": 99}'], "--extra sets 'chrf', which the script writes itself"),
    # IsADirectoryError, with a temporary file left in out/
    ({}, [*BASE[:4], "--json", "out"], "--json 'out' is a directory: give the file to write, e.g. 'out/bleu.json'"),
    ({}, [*BASE[:4], "--json", "ref.de"], "--json 'ref.de' is also an input ('ref.de')"),
    ({}, [*BASE[:4], "--json", "src.en/x.json"], "--json 'src.en/x.json' cannot be written: '"),
    # the output of other runs
    ({"gen.out": b"S-0\ta\nD-0\t-0.1\tx\nD-0\t-0.3\ty\nS-1\tb\nD-1\t-0.2\tz\nD-1\t-0.4\tw\n"}, BASE,
     "--generate-output 'gen.out' has up to 2 hypotheses per sentence (fairseq-generate --nbest 2): "
     "score the output of a run with --nbest 1"),
    ({"gen.out": (GOOD + GOOD).encode()}, BASE,
     "--generate-output 'gen.out' has 2 duplicated hypothesis id(s) (first: [0, 1]): the output of "
     "more than one fairseq-generate run?"),
    ({"gen.out": b"D-0\t-0.1\tDas ist gut.\n"}, BASE,
     "1 of 2 sentences have no hypothesis in 'gen.out' (1 hypotheses for a 2-line reference; first "
     "missing: [1]): fairseq-generate was interrupted, skipped them"),
    ({"gen.out": b"D-zero\t-0.1\tDas\n"}, BASE, "--generate-output 'gen.out' line 1 is not a "
                                                "fairseq-generate hypothesis (D-<id>, score, text"),
    ({"gen.out": b"2024-01-01 | INFO | fairseq_cli.generate | Translated 2 sentences\n"}, BASE,
     "--generate-output 'gen.out' has no D- lines: give fairseq-generate's output"),
    ({}, [*BASE, "--lang"], "argument --lang: expected one argument (see --help)"),
])
def test_bad_input_is_one_line_and_writes_nothing(inputs, script, setup, args, message):
    if "--lang" in args and script == "score.py":
        args = [*BASE, "--show"]
        message = "argument --show: expected one argument (see --help)"
    for name, data in setup.items():
        (inputs / name).write_bytes(data)
    before = files(inputs)
    proc = score(inputs, *args, script=script)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stdout == ""
    assert proc.stderr.startswith(f"{script}: error: {message}"), proc.stderr
    assert files(inputs) == before  # no JSON, no temporary file


@pytest.mark.parametrize("args,message", [
    # IndexError after bleu.json was written
    (["--source", "short.en", "--show", "5"], "--source 'short.en' has 1 line(s) but the reference has 2: "
                                              "give the source side of the same test set"),
    (["--show", "2"], "--show 2 needs --source (the test set's source side) to print examples"),
    (["--source", "src.en", "--show", "-1"], "--show -1 is not allowed: the number of example "
                                             "translations to print, >= 0"),
])
def test_score_checks_show_and_source_before_writing(inputs, args, message):
    (inputs / "short.en").write_text("That is good.\n")
    before = files(inputs)
    proc = score(inputs, *BASE, *args)
    assert proc.returncode == 1 and proc.stderr.strip() == f"score.py: error: {message}", proc.stderr
    assert files(inputs) == before


def test_a_byte_order_mark_is_not_part_of_the_first_reference(inputs):
    (inputs / "ref.de").write_bytes(b"\xef\xbb\xbfDas ist gut.\nEr ist da.\n")  # chrF was 93.81
    proc = score(inputs, *BASE)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((inputs / "out" / "bleu.json").read_text())
    assert result["bleu"] == 100.0 and result["chrf"] == 100.0


def test_good_input_still_scores_with_examples_and_the_best_of_each_id(inputs):
    proc = score(inputs, *BASE, "--source", "src.en", "--show", "5", "--extra", '{"beam": 5}')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("  SRC: ") == 2 and "HYP: Er ist da." in proc.stdout
    result = json.loads((inputs / "out" / "bleu.json").read_text())
    assert result["bleu"] == 100.0 and result["beam"] == 5 and result["sentences"] == 2
    assert files(inputs / "out") == ["bleu.json"]
