"""The recipe helpers: scoring refuses incomplete generate output and writes its JSON
atomically; sentencepiece training rejects bad values."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(script, *args, cwd):
    return subprocess.run([sys.executable, str(REPO / "recipes" / "lib" / script), *args],
                          cwd=cwd, capture_output=True, text=True)


def test_score_refuses_output_with_missing_sentences(tmp_path):
    (tmp_path / "ref.de").write_text("Das ist gut.\nEr ist da.\nJa.\n")
    (tmp_path / "gen.out").write_text("D-0\t-0.5\tDas ist gut.\nD-2\t-0.1\tJa.\n")
    proc = run("score.py", "--generate-output", "gen.out", "--reference", "ref.de",
               "--json", "out/bleu.json", cwd=tmp_path)
    assert proc.returncode != 0
    assert "1 of 3 sentences have no hypothesis" in proc.stderr
    assert "--required-batch-size-multiple 1" in proc.stderr
    assert not (tmp_path / "out" / "bleu.json").exists()


def test_score_writes_bleu_and_chrf_with_signatures(tmp_path):
    (tmp_path / "ref.de").write_text("Das ist gut.\nEr ist da.\n")
    (tmp_path / "gen.out").write_text("D-1\t-0.5\tEr ist da.\nD-0\t-0.1\tDas ist gut.\n")
    proc = run("score.py", "--generate-output", "gen.out", "--reference", "ref.de",
               "--json", "bleu.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "bleu.json").read_text())
    assert result["bleu"] == 100.0 and result["chrf"] == 100.0
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_spm_rejects_a_tiny_vocabulary(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n")
    proc = run("spm.py", "train", "--vocab", "5", "--model-prefix", "m", "a.txt", cwd=tmp_path)
    assert proc.returncode != 0 and "--vocab 5 is too small" in proc.stderr
