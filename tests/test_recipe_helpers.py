"""The recipe helpers: scoring refuses incomplete generate output and writes its JSON
atomically; tokenized BLEU equals the perl reference procedure; sentencepiece training
rejects bad values."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def hyphen_rich(lines, every):
    """Join every ``every``-th pair of neighbouring words with a hyphen."""
    out = []
    for line in lines:
        words = line.split()
        out.append(" ".join(w + ("-" if i % every == every - 1 and i + 1 < len(words) else " ")
                            for i, w in enumerate(words)).replace("- ", "-").strip())
    return out


def test_compound_split_is_perls_one_pass():
    sys.path.insert(0, str(REPO / "recipes" / "lib"))
    from wmt_score import compound_split

    assert compound_split("E-Mail-Adresse") == "E ##AT##-##AT## Mail ##AT##-##AT## Adresse"
    assert compound_split("1-2-3") == "1 ##AT##-##AT## 2-3"


@pytest.mark.skipif(shutil.which("perl") is None, reason="needs perl (the reference one-liner)")
def test_tokenized_bleu_equals_the_perl_reference_procedure(tmp_path):
    """tensor2tensor's get_ende_bleu.sh: Moses-tokenize, then the perl compound split once,
    then BLEU on the tokens; on a hyphen-rich text (where a second pass inflated it)."""
    import sacrebleu
    from sacremoses import MosesTokenizer

    sample = (REPO / "data" / "ende-sample" / "test.de").read_text(encoding="utf-8").splitlines()[:200]
    refs = hyphen_rich(sample, 3)
    hyps = hyphen_rich([" ".join(w if i % 5 else "x-y" for i, w in enumerate(line.split())) for line in sample], 2)
    (tmp_path / "ref.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "gen.out").write_text("".join(f"D-{i}\t-0.1\t{h}\n" for i, h in enumerate(hyps)),
                                      encoding="utf-8")
    proc = run("wmt_score.py", "--generate-output", "gen.out", "--reference", "ref.de",
               "--json", "x.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ours = json.loads((tmp_path / "x.json").read_text())["tokenized_bleu"]

    tokenizer = MosesTokenizer(lang="de")

    def perl_split(lines):
        tokens = "".join(tokenizer.tokenize(line, return_str=True, escape=True) + "\n" for line in lines)
        return subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=tokens,
                              capture_output=True, text=True, check=True).stdout.splitlines()

    reference = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(
        perl_split(hyps), [perl_split(refs)]).score
    assert sum(r.count("-") for r in refs) > 200
    assert ours == round(reference, 2)


def test_clean_keeps_pairs_aligned_across_a_carriage_return_and_removes_non_printing(tmp_path):
    (tmp_path / "in.en").write_bytes("One\rtwo.\nThree.\nFour\x01five\u200bsix\tseven.\n".encode())
    (tmp_path / "in.de").write_bytes("Eins zwei.\nDrei.\nVier fünf sechs sieben.\n".encode())
    for extra in ([], ["--filter"]):
        proc = run("clean.py", "text", "--src", "in.en", "--tgt", "in.de", "--out-prefix", "out", *extra,
                   cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "kept 3 of 3 pairs" in proc.stderr
        assert (tmp_path / "out.en").read_bytes().decode() == "One two.\nThree.\nFour five six seven.\n"
        assert (tmp_path / "out.de").read_bytes().decode() == "Eins zwei.\nDrei.\nVier fünf sechs sieben.\n"


def test_spm_encode_writes_one_line_per_input_line(tmp_path):
    sample = REPO / "data" / "ende-sample" / "train.en"
    proc = run("spm.py", "train", "--vocab", "200", "--model-prefix", "m", "--threads", "1", str(sample),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "in.en").write_bytes(b"Good\rmorning.\nHello.\n")
    proc = run("spm.py", "encode", "--model", "m.model", "in.en", "out.en", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out.en").read_bytes().decode()
    assert out.count("\n") == 2 and "\r" not in out


def test_score_reads_a_reference_with_a_carriage_return_as_one_line(tmp_path):
    (tmp_path / "ref.de").write_bytes(b"Das ist\rgut.\nEr ist da.\r\n")
    (tmp_path / "gen.out").write_text("D-1\t-0.5\tEr ist da.\nD-0\t-0.1\tDas ist gut.\n")
    proc = run("score.py", "--generate-output", "gen.out", "--reference", "ref.de",
               "--json", "bleu.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "bleu.json").read_text())
    assert result["sentences"] == 2 and result["bleu"] == 100.0


def test_extract_matches_archive_members_after_normpath(tmp_path):
    import io
    import tarfile

    with tarfile.open(tmp_path / "a.tgz", "w:gz") as tar:
        for name, data in (("./dev/x.en", b"hello\n"), ("dev//y.de", b"hallo\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    proc = run("wmt_data.py", "extract", "a.tgz", "dev/x.en=out.en", "./dev/y.de=out.de", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.en").read_bytes() == b"hello\n" and (tmp_path / "out.de").read_bytes() == b"hallo\n"


@pytest.mark.parametrize("setting,message", [
    ("TRAIN_MINUTES=0", "TRAIN_MINUTES='0': must be a number > 0"),
    ("SPM_VOCAB=50", "SPM_VOCAB='50': must be an integer >= 100"),
    ("MAX_TOKENS=lots", "MAX_TOKENS='lots': must be an integer >= 100"),
    ("LR=-1", "LR='-1': must be a number > 0"),
    ("BEAM=0", "BEAM='0': must be an integer >= 1"),
    ("PATIENCE=never", "PATIENCE='never': must be an integer >= 1"),
])
def test_sample_recipe_checks_its_settings_like_the_wmt_recipes(tmp_path, setting, message):
    """recipes/sample/run.sh and recipes/lib/wmt.sh share stage.sh's checks: one line,
    before any work (nothing is created under WORK)."""
    name, value = setting.split("=", 1)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               WORK=str(tmp_path / "work"), RESULTS=str(tmp_path / "results"), **{name: value})
    proc = subprocess.run(["bash", str(REPO / "recipes/sample/run.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()
