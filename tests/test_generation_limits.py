"""fairseq-generate and fairseq-interactive, any model, with sentences longer than their
limits (--max-tokens, --max-source/target-positions, the checkpoint's own), a data
directory or split that is not there, and options fairseq would run wrongly (--nbest above
--beam, --batch-size above --buffer-size, an unreadable value): one line naming the value and
what to do, before --results-path is created; interactive skips an over-long line with one
warning and translates the rest; a generate that fails later leaves no result file.

Lengths are checked against the raw text (whitespace tokens + end-of-sentence), not against
what the plugin reads from the binarized files."""
from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import USER_DIR, hypotheses, model_args, run_tool, train_args
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin.sentence_limits import SentencesTooLong


def lengths(data: Path, split: str, lang: str) -> np.ndarray:
    """Tokens per sentence with the end-of-sentence token, from the raw text."""
    lines = (data / "raw" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
    return np.array([len(line.split()) + 1 for line in lines])


def expected_line(option: str, limit: int, noun: str, over: np.ndarray, sizes: np.ndarray) -> str:
    ids = np.flatnonzero(over)
    return (f"fairseq_hybrid: error: {option} {limit} is smaller than {len(ids)} {noun}s of the "
            f"'test' split (the longest has {sizes[ids].max()} tokens with the end-of-sentence "
            f"token; first: sentence {ids[0]}): use {option} {sizes[ids].max()} or more, "
            "or skip them with --skip-invalid-size-inputs-valid-test")


def parse(data: Path, tmp_path: Path, *extra: str, tool: str = "generate"):
    from fairseq import options

    (tmp_path / "model.pt").write_bytes(b"x")  # exists: the options are checked, not the model
    parser = options.get_generation_parser() if tool == "generate" else \
        options.get_interactive_generation_parser()
    return options.parse_args_and_arch(parser, [str(data), "--path", str(tmp_path / "model.pt"),
                                                *extra])


# ------------------------------------------------------------------ at parse time
def test_max_tokens_below_a_sentence_pair_is_one_line(sample_data, tmp_path):
    pairs = np.maximum(lengths(sample_data, "test", "en"), lengths(sample_data, "test", "de"))
    with pytest.raises(HybridConfigError) as error:  # fairseq: AssertionError in batch_by_size
        parse(sample_data / "bin", tmp_path, "--max-tokens", "10")
    assert str(error.value) == expected_line("--max-tokens", 10, "sentence pair", pairs > 10, pairs)


@pytest.mark.parametrize("option,lang", [("--max-source-positions", "en"), ("--max-target-positions", "de")])
def test_positions_below_a_sentence_are_one_line(sample_data, tmp_path, option, lang):
    sizes = lengths(sample_data, "test", lang)
    side = "source" if lang == "en" else "target"
    with pytest.raises(HybridConfigError) as error:  # fairseq: Exception: Size of sample #16 is invalid
        parse(sample_data / "bin", tmp_path, option, "5")
    assert str(error.value) == expected_line(option, 5, f"{side} sentence", sizes > 5, sizes)


def test_skipping_is_accepted_unless_it_would_skip_everything(sample_data, tmp_path):
    skip = "--skip-invalid-size-inputs-valid-test"
    assert parse(sample_data / "bin", tmp_path, "--max-tokens", "10", skip).max_tokens == 10
    with pytest.raises(HybridConfigError, match="every sentence of the 'test' split is longer than "
                                                "--max-tokens, --max-source-positions or"):
        parse(sample_data / "bin", tmp_path, "--max-tokens", "2", skip)  # fairseq: ZeroDivisionError


@pytest.mark.parametrize("case,message", [
    ("split", "--gen-subset 'test1': data directory '{bin}' has no 'test1' split for en-de (it has: "
              "test, train, valid)"),
    ("missing", "data directory '{bin}' does not exist: give the --destdir of fairseq-preprocess"),
    ("dict", "data directory '{bin}' has no dict.de.txt: give the --destdir of fairseq-preprocess"),
    ("pair", "data directory '{bin}' names no language pair"),
])
def test_a_data_directory_without_what_generate_reads_is_one_line(sample_data, tmp_path, case, message):
    data = tmp_path / "bin"
    extra = ["--gen-subset", "test1"] if case == "split" else []
    if case in ("split", "dict"):
        shutil.copytree(sample_data / "bin", data)
    if case == "dict":
        (data / "dict.de.txt").unlink()
    if case == "pair":
        data.mkdir()
    with pytest.raises(HybridConfigError, match=re.escape(message.format(bin=data))):  # FileNotFoundError
        parse(data, tmp_path, *extra)
    if case != "split":  # interactive reads the dictionaries, not a split
        with pytest.raises(HybridConfigError, match=re.escape(message.format(bin=data))):
            parse(data, tmp_path, tool="interactive")


def test_an_empty_split_is_one_line(sample_data, tmp_path):
    """fairseq translated nothing and ended with a ZeroDivisionError. The empty split is
    what fairseq-preprocess writes for empty text files: fairseq's own builder, finalized
    with no sentence, beside the sample's dictionaries and other splits."""
    from fairseq.data import indexed_dataset

    data = tmp_path / "bin"
    shutil.copytree(sample_data / "bin", data)
    for lang in ("en", "de"):
        prefix = data / f"test.en-de.{lang}"
        builder = indexed_dataset.make_builder(f"{prefix}.bin", "mmap", vocab_size=3008)
        builder.finalize(f"{prefix}.idx")
    assert (data / "test.en-de.en.bin").stat().st_size == 0  # the split really is empty
    with pytest.raises(HybridConfigError, match=re.escape(
            "--gen-subset 'test': the split has no sentences")):
        parse(data, tmp_path)


def test_interactive_batch_size_above_its_buffer_is_one_line(sample_data, tmp_path):
    with pytest.raises(HybridConfigError, match="--batch-size 4 is not allowed with --buffer-size 2: "
                                                "fairseq-interactive batches the lines of one buffer; "
                                                "use --buffer-size 4 or more"):
        parse(sample_data / "bin", tmp_path, "--batch-size", "4", "--buffer-size", "2", tool="interactive")
    args = parse(sample_data / "bin", tmp_path, "--max-tokens", "3", tool="interactive")
    assert args.skip_invalid_size_inputs_valid_test  # interactive skips over-long lines


@pytest.mark.parametrize("tool,extra,message", [
    ("generate", ["--max-tokens", "0"], "--max-tokens 0 is not allowed: an integer >= 1, or leave it out"),
    ("interactive", ["--batch-size", "-1"], "--batch-size -1 is not allowed: an integer >= 1"),
    # fairseq: killed by SIGFPE (a division by zero)
    ("generate", ["--required-batch-size-multiple", "0"], "--required-batch-size-multiple 0 is not allowed"),
    ("generate", ["--num-workers", "-1"], "--num-workers -1 is not allowed: an integer >= 0"),  # ValueError
    # fairseq: AssertionError: min_len cannot be larger than max_len (longer sources)
    ("generate", ["--max-len-a", "-1"], "--max-len-a -1.0 is not allowed: a number >= 0"),
    ("interactive", ["--diverse-beam-groups", "3", "--beam", "2"],  # ValueError
     "--diverse-beam-groups 3 is not allowed with --beam 2: --beam must be a multiple of it"),
    ("generate", ["--model-overrides", "{{'beam': 5"], "--model-overrides \"{{'beam': 5\" is not allowed: "
                                                       "a Python dict literal"),  # SyntaxError, at run time
    ("interactive", ["--replace-unk"], "--replace-unk needs an alignment dictionary file here"),  # '@@ '
    ("generate", ["--replace-unk", "{file}"], "--replace-unk is not allowed with binarized data"),
    ("generate", ["--results-path", "{file}"], "--results-path '{file}' is a file: give a directory"),
    ("generate", ["--path", ""], "--path is required"),  # fairseq: OSError: Model file not found:
    ("interactive", ["--input", "{tmp}/none.txt"], "--input '{tmp}/none.txt' does not exist"),
    ("interactive", ["--input", "{tmp}"], "--input '{tmp}' is a directory"),
    # fairseq: UnicodeDecodeError after translating the lines before it
    ("interactive", ["--input", "{latin1}"], "--input '{latin1}' is not UTF-8 text: line 3 has the byte 0xe4"),
])
def test_values_fairseq_fails_on_later_are_one_line(sample_data, tmp_path, tool, extra, message):
    (tmp_path / "some.txt").write_text("a b\n")
    (tmp_path / "latin1.txt").write_bytes("Hallo\nWelt\nK\u00e4se\n".encode("latin-1"))
    names = {"file": tmp_path / "some.txt", "tmp": tmp_path, "latin1": tmp_path / "latin1.txt"}
    given = [part.format(**names) for part in extra]
    with pytest.raises(HybridConfigError, match=re.escape(message.format(**names))):
        parse(sample_data / "bin", tmp_path, *given, tool=tool)


# ------------------------------------------------------------------ at run time (fairseq's batching)
@pytest.fixture
def task(sample_data, tmp_path):
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(parse(sample_data / "bin", tmp_path))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("test")
    return task


def batched_ids(iterator) -> list:
    return sorted(i for batch in iterator.next_epoch_itr(shuffle=False) for i in batch["id"].tolist())


def test_run_time_refusals_are_the_parse_time_lines(task, sample_data, tmp_path):
    """The same line when fairseq's batching finds them (any tool, e.g. a split fairseq-
    generate could not read at parse time)."""
    dataset = task.dataset("test")
    for option, value, kwargs in (("--max-tokens", "10", {"max_tokens": 10}),
                                  ("--max-source-positions", "5", {"max_positions": (5, 1024)})):
        with pytest.raises(HybridConfigError) as at_parse:
            parse(sample_data / "bin", tmp_path, option, value)
        task.cfg.max_source_positions = 5 if option == "--max-source-positions" else 1024
        with pytest.raises(SentencesTooLong) as at_run:
            task.get_batch_iterator(dataset, **{"max_positions": task.max_positions(), **kwargs})
        assert str(at_run.value) == str(at_parse.value)


def test_a_limit_of_the_checkpoint_names_the_way_out(task, sample_data):
    sizes = lengths(sample_data, "test", "en")
    with pytest.raises(SentencesTooLong) as error:  # the model's max_positions below the task's
        task.get_batch_iterator(task.dataset("test"), max_tokens=1000, max_positions=(6, 1024))
    assert str(error.value).startswith(
        f"fairseq_hybrid: error: the checkpoint's limit of source tokens 6 is smaller than "
        f"{(sizes > 6).sum()} source sentences of the 'test' split")
    assert str(error.value).endswith("skip them with --skip-invalid-size-inputs-valid-test, or "
                                     "translate with a model trained for longer sentences")


def test_skipping_leaves_out_exactly_the_long_pairs_with_one_warning(task, sample_data, caplog):
    pairs = np.maximum(lengths(sample_data, "test", "en"), lengths(sample_data, "test", "de"))
    with caplog.at_level(logging.WARNING):  # fairseq: AssertionError even when skipping
        iterator = task.get_batch_iterator(task.dataset("test"), max_tokens=10, ignore_invalid_inputs=True,
                                           max_positions=task.max_positions())
    assert batched_ids(iterator) == np.flatnonzero(pairs <= 10).tolist()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    over = np.flatnonzero(pairs > 10)
    assert warnings == [f"skipped {len(over)} sentence pairs of the 'test' split (first: sentence "
                        f"{over[0]}): longer than --max-tokens 10 allows (the longest has "
                        f"{pairs.max()} tokens with the end-of-sentence token); raise --max-tokens "
                        f"to {pairs.max()} to translate them"]
    with pytest.raises(SentencesTooLong, match="every sentence of the 'test' split is skipped"):
        task.get_batch_iterator(task.dataset("test"), max_tokens=2, ignore_invalid_inputs=True,
                                max_positions=task.max_positions(), disable_iterator_cache=True)


def test_an_over_long_input_line_is_named_by_its_text(task, caplog):
    lines = ["ein kurzer Satz", " ".join(["Wort"] * 30)]
    tokens = [task.source_dictionary.encode_line(line, add_if_not_exist=False).long() for line in lines]
    dataset = task.build_dataset_for_inference(tokens, [t.numel() for t in tokens])
    with caplog.at_level(logging.WARNING):
        iterator = task.get_batch_iterator(dataset, max_tokens=8, ignore_invalid_inputs=True,
                                           max_positions=task.max_positions())
    assert batched_ids(iterator) == [0]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "skipped 1 sentence of the input ('Wort Wort Wort Wort Wort Wort Wort Wort Wort Wort Wort "
        "Wo...'): longer than --max-tokens 8 allows (the longest has 31 tokens with the "
        "end-of-sentence token); raise --max-tokens to 31 to translate it"]


# ------------------------------------------------------------------ the commands, two models
LSTM = ["--arch", "lstm", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-hidden-size", "16", "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16"]


@pytest.fixture(scope="module")
def checkpoints(sample_data, tmp_path_factory):
    """A 2-update hybrid_lstm and fairseq lstm (any model gets the same behaviour)."""
    root = tmp_path_factory.mktemp("generation-limits")
    found = {}
    for name, model, criterion in (("hybrid", model_args(16), "hybrid_cross_entropy"),
                                   ("lstm", LSTM, "cross_entropy")):
        save = root / name
        run_tool("fairseq-train", train_args(sample_data / "bin", model, "--criterion", criterion,
                                             "--max-update", "2", "--no-epoch-checkpoints",
                                             save_dir=save, max_tokens=1000), cwd=root)
        found[name] = save / "checkpoint_last.pt"
    return root, found


def only_line(proc) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fairseq_hybrid: error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def generate(data: Path, path: Path, *extra: str):
    return run_tool("fairseq-generate", [str(data / "bin"), "--user-dir", USER_DIR, "--path", str(path),
                                         "--gen-subset", "test", "--max-len-b", "5", "--beam", "2",
                                         *extra], cwd=data, check=False)


def interactive(root: Path, data: Path, path: Path, stdin: bytes, *extra: str):
    """fairseq-interactive reading ``stdin`` strictly as UTF-8, as Python does in most UTF-8
    locales (here forced)."""
    return run_tool("fairseq-interactive", [str(data / "bin"), "--user-dir", USER_DIR, "--path", str(path),
                                            "--beam", "2", "--max-len-b", "5", *extra],
                    cwd=root, stdin=stdin, check=False, timeout=300, env={"PYTHONIOENCODING": "utf-8:strict"})


@pytest.mark.slow
@pytest.mark.parametrize("model", ["hybrid", "lstm"])
def test_interactive_skips_an_over_long_line_reads_a_non_utf8_byte_and_translates_the_rest(
        checkpoints, sample_data, model):
    """fairseq: AssertionError on the long line, and a UnicodeDecodeError on the byte that is
    not UTF-8 (line 2, Latin-1) before translating even the line before it; the lines after
    either were never translated. The plugin skips the long line with one warning and reads
    the byte as an unknown character."""
    root, found = checkpoints
    stdin = b"Hello .\n" + b" ".join([b"word"] * 12) + b"\nK\xe4se bitte .\nThank you .\nGood bye .\n"
    for limit in (["--max-tokens", "8"], ["--max-source-positions", "8"]):
        proc = interactive(root, sample_data, found[model], stdin, *limit)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        for prefix in ("H-", "D-"):
            assert sorted(int(line.split("\t")[0][2:]) for line in hypotheses(proc.stdout, (prefix,))) == [0, 2, 3, 4]
        warnings = [line for line in proc.stderr.splitlines() + proc.stdout.splitlines() if "skipped" in line]
        assert len(warnings) == 1 and f"longer than {limit[0]} 8 allows (the longest has 13 tokens" in warnings[0]


REFUSED = ((["--max-tokens", "10"], "--max-tokens 10 is smaller than"),
           (["--max-source-positions", "5"], "--max-source-positions 5 is smaller than"),
           (["--nbest", "5"], "--nbest 5 is not allowed with --beam 2"))  # fairseq: 2 each


@pytest.mark.slow
def test_generate_refuses_before_writing(checkpoints, sample_data, tmp_path, monkeypatch):
    """The options are refused once parsed, before fairseq creates --results-path or loads a
    model: the command (hybrid_lstm's checkpoint) prints one line, and the same refusal comes
    in this process with fairseq's lstm (fairseq-generate's own ``cli_main``)."""
    from fairseq_cli import generate as fairseq_generate

    _, found = checkpoints
    results = tmp_path / "results"
    for extra, start in REFUSED:
        line = only_line(generate(sample_data, found["hybrid"], *extra, "--results-path", str(results)))
        assert line.startswith(f"fairseq_hybrid: error: {start}")
        assert not results.exists()  # fairseq left an empty generate-test.txt
        monkeypatch.setattr("sys.argv", ["fairseq-generate", str(sample_data / "bin"), "--user-dir", USER_DIR,
                                         "--path", str(found["lstm"]), "--gen-subset", "test", "--max-len-b", "5",
                                         "--beam", "2", *extra, "--results-path", str(results)])
        with pytest.raises(HybridConfigError) as error:
            fairseq_generate.cli_main()
        assert str(error.value) == line
        assert not results.exists()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["hybrid", "lstm"])
def test_generate_skips_exactly_the_long_pairs_when_asked(checkpoints, sample_data, model):
    _, found = checkpoints
    pairs = np.maximum(lengths(sample_data, "test", "en"), lengths(sample_data, "test", "de"))
    proc = generate(sample_data, found[model], "--max-tokens", "10", "--skip-invalid-size-inputs-valid-test")
    assert proc.returncode == 0, proc.stderr[-3000:]
    translated = sorted(int(line.split("\t")[0][2:]) for line in hypotheses(proc.stdout, ("D-",)))
    assert translated == np.flatnonzero(pairs <= 10).tolist()


@pytest.mark.slow
def test_a_generate_that_fails_after_opening_its_result_file_leaves_none(checkpoints, sample_data, tmp_path):
    """A truncated checkpoint fails when fairseq loads it, after it created the result file."""
    _, found = checkpoints
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(found["lstm"].read_bytes()[:5000])
    for results, kept in ((tmp_path / "new", []), (tmp_path / "old", ["notes.txt"])):
        if kept:
            results.mkdir()
            (results / "notes.txt").write_text("mine\n")
            (results / "generate-test.txt").write_text("an older run's output\n")
        line = only_line(generate(sample_data, truncated, "--results-path", str(results)))
        assert "is not a readable fairseq checkpoint" in line
        if kept:  # the older output was truncated by fairseq: gone too; the rest stays
            assert sorted(p.name for p in results.iterdir()) == kept
        else:
            assert not results.exists()


@pytest.mark.slow
def test_an_unreadable_option_value_is_one_line_not_the_usage(sample_data, checkpoints):
    root, found = checkpoints
    proc = run_tool("fairseq-interactive", [str(sample_data / "bin"), "--user-dir", USER_DIR, "--path",
                                            str(found["lstm"]), "--buffer-size", ""], cwd=root, check=False)
    assert only_line(proc) == ("fairseq_hybrid: error: argument --buffer-size: invalid int value: '' "
                               "(see fairseq-interactive --help)")
    assert "usage:" not in proc.stderr
