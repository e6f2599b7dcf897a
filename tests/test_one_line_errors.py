"""The last tracebacks of issue 23 (item 7) as one line: fairseq-generate's options that its
beam search cannot run and a missing --path (for every model: parse-only checks), the
advisor's arguments, a validation split that is not there, a vocabulary larger than the
corpus allows, a training stopped by a non-finite loss and generation from its crash.pt;
and --pipeline-chunks' help for every model."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import REPO, USER_DIR, generate_error_in_process, model_args, run_tool, train_args
from fairseq_hybrid.errors import HybridConfigError, HybridRuntimeError
from fairseq_hybrid.plugin.checks import check_data_dir


def only_line(proc, prefix: str = "fairseq_hybrid: error: ") -> str:
    """The run failed with exactly one message line and no traceback."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def fake_data_dir(root: Path, *splits: str) -> Path:
    """Enough of a fairseq-preprocess directory for parse-time checks (no .idx: the sizes
    check leaves it to fairseq)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ["dict.en.txt", "dict.de.txt"] + [f"{s}.en-de.{lang}.bin" for s in splits for lang in ("en", "de")]:
        (root / name).write_text("")
    return root


# ------------------------------------------------------------------ fairseq-generate's options
def parse_generate(*extra: str, data: str = "data"):
    from fairseq import options

    return options.parse_args_and_arch(options.get_generation_parser(), [data, *extra])


@pytest.mark.parametrize("extra,message", [
    (["--beam", "0"], "--beam 0 is not allowed: an integer >= 1"),  # fairseq: a reshape error
    (["--beam", "-2"], "--beam -2 is not allowed: an integer >= 1"),
    # fairseq: AssertionError: min_len cannot be larger than max_len
    (["--max-len-b", "-5"], "--max-len-b -5 is not allowed with --max-len-a 0 and --min-len 1: "
                            "no output could be long enough"),
    (["--min-len", "300"], "--max-len-b 200 is not allowed with --max-len-a 0 and --min-len 300"),
    (["--temperature", "0"], "--temperature 0 is not allowed: a number > 0"),  # an AssertionError
    (["--sampling", "--beam", "3"], "--nbest 1 is not allowed with --sampling and --beam 3"),
    # fairseq printed 2 hypotheses per sentence without a word
    (["--beam", "2", "--nbest", "5"], "--nbest 5 is not allowed with --beam 2: the search keeps only "
                                      "--beam hypotheses per sentence; use --nbest 2 or less, or --beam 5 or more"),
    (["--nbest", "0"], "--nbest 0 is not allowed: an integer >= 1"),  # fairseq printed none
    (["--beam", "two"], "argument --beam: invalid int value: 'two' .see .* --help.$"),
    (["--path", "nowhere.pt"], "--path 'nowhere.pt' does not exist: give a checkpoint file"),  # OSError
    (["--path", "{dir}"], "--path '{dir}' is a directory, not a fairseq checkpoint file"),
    (["--path", "{file}:nowhere.pt"], "--path 'nowhere.pt' does not exist"),  # an ensemble
    ([], "--path is required"),  # fairseq: an AssertionError (generate), AttributeError (interactive)
])
def test_generation_options_fairseq_cannot_run_are_one_line(tmp_path, extra, message):
    (tmp_path / "model.pt").write_bytes(b"x")
    given = [part.format(dir=tmp_path, file=tmp_path / "model.pt") for part in extra]
    path = [] if "--path" in given or not extra else ["--path", str(tmp_path / "model.pt")]
    with pytest.raises(HybridConfigError, match=message.format(dir=tmp_path).replace("(", r"\(")):
        parse_generate(*path, *given)


@pytest.mark.parametrize("extra", [
    ["--max-len-a", "1.5", "--max-len-b", "-5"],  # depends on the sources: fairseq's to decide
    ["--match-source-len", "--max-len-b", "-5"],
    ["--beam", "1", "--min-len", "200"], ["--sampling", "--beam", "3", "--nbest", "3"],
])
def test_generation_options_fairseq_can_run_are_accepted(tmp_path, extra):
    (tmp_path / "model.pt").write_bytes(b"x")
    (tmp_path / "bin" / "test.en-de.en.idx").parent.mkdir()
    for name in ("dict.en.txt", "dict.de.txt", "test.en-de.en.idx", "test.en-de.en.bin"):
        (tmp_path / "bin" / name).write_text("")  # sizes unreadable: left to fairseq
    args = parse_generate("--path", str(tmp_path / "model.pt"), *extra, data=str(tmp_path / "bin"))
    assert args.path == str(tmp_path / "model.pt")


def test_training_parsers_are_not_generation_checked():
    from fairseq import options

    args = options.parse_args_and_arch(options.get_training_parser(), ["data", "--arch", "lstm"])
    assert args.arch == "lstm" and not hasattr(args, "beam")


def test_pipeline_chunks_help_gives_fairseqs_meaning_first():
    from fairseq import options

    for parser in (options.get_training_parser(), options.get_training_parser()):
        text = parser._option_string_actions["--pipeline-chunks"].help
        assert text.startswith("microbatch count for pipeline model parallelism "
                               "(--pipeline-model-parallel); hybrid_lstm: time chunks")
        assert text.count("hybrid_lstm:") == 1


# ------------------------------------------------------------------ data, advisor
@pytest.mark.parametrize("options,splits,message", [
    ({}, [], "--valid-subset 'valid': data directory '{d}' has no 'valid' split"),
    ({"valid_subset": "valid,test"}, ["valid"], "--valid-subset 'test': data directory '{d}' has no 'test'"),
    ({"disable_validation": True}, [], None),
    ({"valid_subset": "dev"}, ["dev"], None),
    ({"valid_subset": "dev", "combine_valid_subsets": True}, ["dev"], "has no 'valid' split"),
])
def test_a_missing_validation_split_is_one_line(tmp_path, options, splits, message):
    data = fake_data_dir(tmp_path / "bin", "train", *splits)
    args = SimpleNamespace(data=str(data), source_lang="en", target_lang="de", **options)
    if message is None:
        check_data_dir(args)
        return
    with pytest.raises(HybridConfigError, match=message.format(d=data)) as error:
        check_data_dir(args)  # fairseq: FileNotFoundError: Dataset not found: valid
    assert str(error.value).endswith("or train without validation (--disable-validation)")


@pytest.mark.parametrize("argv,message", [
    ([], "--arch is missing: the advisor needs hybrid_lstm"),  # a bare RuntimeError
    (["{data}", "--max-tokens", "100"], "--arch is missing"),
    (["{data}", "--arch", "lstm"], "--arch 'lstm' is not allowed"),
    (["--arch", "hybrid_lstm"], "the following arguments are required: data .usage: python -m "
                                "fairseq_hybrid.tools.advise DATA --arch hybrid_lstm"),
    (["{data}", "--arch", "hybrid_lstm", "--max-tokens", "many"], "argument --max-tokens: invalid int"),
])
def test_advisor_arguments_are_one_line(tmp_path, argv, message):
    from fairseq_hybrid.tools.advise import parse

    data = fake_data_dir(tmp_path / "bin", "train", "valid")
    with pytest.raises(HybridConfigError, match=message):
        parse([part.format(data=data) for part in argv])


def test_advisor_without_hybrid_devices_uses_the_default_device(tmp_path):
    from fairseq_hybrid.plugin.placement_options import placement_options
    from fairseq_hybrid.tools.advise import parse

    args = parse([str(fake_data_dir(tmp_path / "bin", "train", "valid")), "--arch", "hybrid_lstm",
                  "--max-tokens", "100"])
    assert args.hybrid_devices is None  # was an AttributeError in advise()
    assert [str(d) for d in placement_options(args).all_devices()] == ["cpu"]


@pytest.mark.slow
def test_advisor_command_without_arguments():
    proc = subprocess.run([sys.executable, "-m", "fairseq_hybrid.tools.advise"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert only_line(proc).startswith("fairseq_hybrid: error: --arch is missing")


# ------------------------------------------------------------------ sentencepiece
@pytest.mark.slow
def test_a_vocabulary_larger_than_the_corpus_allows_is_one_line(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               WORK=str(tmp_path / "work"), RESULTS=str(tmp_path / "results"), SPM_VOCAB="500000")
    proc = subprocess.run(["bash", str(REPO / "recipes/sample/run.sh"), "spm"], env=env,
                          capture_output=True, text=True, timeout=120)
    line = only_line(proc, prefix="spm.py: error: ")
    assert line.startswith("spm.py: error: --vocab 500000 is too large for these training files: "
                           "sentencepiece can make at most ")
    assert proc.stderr.strip().splitlines()[-1] == line
    assert os.listdir(tmp_path / "work") == []  # no spm.tmp/ left


# ------------------------------------------------------------------ a non-finite loss
@pytest.fixture(scope="module")
def diverged(tmp_path_factory, small_sample_data):
    """fairseq-train with --lr 1e38: epoch 1 (one update, checkpoint written) is finite, the
    gradients of update 2 are not. The data: conftest.small_sample_data (40 pairs, only read)."""
    root = small_sample_data
    save = tmp_path_factory.mktemp("nan") / "save"
    proc = run_tool("fairseq-train", train_args(root / "bin", model_args(16), "--max-update", "5",
                                                "--no-epoch-checkpoints", save_dir=save, lr=1e38,
                                                max_tokens=1000), cwd=root, check=False)
    return root, save, proc


@pytest.mark.slow
def test_a_non_finite_loss_is_one_line_saying_the_update_and_what_was_saved(diverged):
    _, save, proc = diverged
    assert only_line(proc) == (
        f"fairseq_hybrid: error: training stopped at update 2: the loss or its gradients became "
        "NaN or inf (FloatingPointError: gradients are Nan/Inf), so that update was not applied; "
        f"fairseq saved the state before it as {save}/crash.pt (a dump for debugging: do not "
        f"translate with it); {save}/checkpoint_last.pt (update 1) is unchanged. Lower --lr (it "
        "is 1e+38) or clip the gradients (--clip-norm)")
    # no checkpoint_best.pt: update 1 already made the validation loss non-finite
    assert sorted(os.listdir(save)) == ["checkpoint_last.pt", "crash.pt"]


def test_the_one_lines_keep_fairseqs_exception_types():
    """A Python caller catching fairseq's FloatingPointError / AssertionError still does."""
    from fairseq_hybrid.plugin.fairseq_patches import NonFiniteScores, NonFiniteTraining

    assert issubclass(NonFiniteTraining, FloatingPointError) and issubclass(NonFiniteScores, AssertionError)
    assert issubclass(NonFiniteTraining, HybridRuntimeError) and issubclass(NonFiniteScores, HybridRuntimeError)
    assert not issubclass(NonFiniteTraining, HybridConfigError)


def generate_args(root, *extra, user_dir=True):
    return [str(root / "bin"), *(["--user-dir", USER_DIR] if user_dir else []),
            "--gen-subset", "test", "--max-len-b", "10", *extra]


def generate(root, *extra, user_dir=True):
    return run_tool("fairseq-generate", generate_args(root, *extra, user_dir=user_dir), cwd=root, check=False)


@pytest.mark.slow
def test_generate_from_the_crash_dump_is_one_line(diverged):
    root, save, _ = diverged
    line = only_line(generate(root, "--path", str(save / "crash.pt")))  # was AssertionError: 10 < 10
    assert line.startswith("fairseq_hybrid: error: no translation of the batch of sentence ids 0, 1, 2, "
                           "3, 4 ... could be ended: every continuation scored NaN or -inf")
    assert line.endswith(f"'{save}/crash.pt' is the crash.pt fairseq saved when training stopped on "
                         "a non-finite loss at update 2 (the state before it, for debugging): "
                         "translate with checkpoint_best.pt or checkpoint_last.pt of that training")


@pytest.mark.slow
def test_generate_refuses_bad_options_before_writing(diverged, tmp_path, monkeypatch):
    """In this process (``cli.generate_error_in_process``): a parse-time check, whose real
    command's one line (exit 1, no traceback, no --results-path made) test_generation_limits.
    test_generate_refuses_before_writing_and_skips_when_asked checks."""
    root, save, _ = diverged
    monkeypatch.chdir(root)
    line = generate_error_in_process(generate_args(root, "--path", str(save / "checkpoint_last.pt"), "--beam", "0",
                                                   "--results-path", str(tmp_path / "results")), monkeypatch)
    assert line.startswith("fairseq_hybrid: error: --beam 0 is not allowed")
    assert not (tmp_path / "results").exists()  # fairseq creates it before loading the model


@pytest.mark.slow
def test_a_hybrid_checkpoint_without_user_dir_is_fairseqs_error(diverged):
    """The plugin is not loaded then, and fairseq 0.12 loads none from a checkpoint: this
    stays fairseq's traceback (docs/reliability.md says to add --user-dir)."""
    root, save, _ = diverged
    proc = generate(root, "--path", str(save / "checkpoint_last.pt"), user_dir=False)
    assert proc.returncode == 1 and "KeyError: \"'_name'\"" in proc.stderr
