"""Training input that fairseq took and then failed on with a traceback, or answered with
a message blaming the wrong cause: sentences longer than the batch limits (fairseq-train for
every model, the advisor), numbers fairseq divides by or crashes on, a checkpoint trained
with other options or shared embeddings, an unreadable checkpoint to resume from, a balance
without devices, Hydra keys the model does not have."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import USER_DIR, model_args, train_args, train_error_in_process
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin import checkpoints, checks
from fairseq_hybrid.plugin.batch_limits import unfit_pairs_line
from fairseq_hybrid.plugin.fairseq_patches import error_of_a_rank
from helpers import make_dictionary, make_model

SPLIT = "the 'valid' split in 'bin'"


# ------------------------------------------------------------------ sentences and limits
@pytest.mark.parametrize("positions,max_tokens,every_pair,skip_long,message", [
    ((1024, 1024), 16, True, False, None),
    ((1024, 1024), 10, True, False,
     "--max-tokens 10 is smaller than 2 of the 4 sentence pairs of {s}: the longest needs 16 tokens "
     "(its longer side, with the end-of-sentence token); use --max-tokens 16 or more"),
    ((5, 1024), 100, True, False,
     "--max-source-positions 5 is shorter than 3 of the 4 source sentences of {s} (the longest has 16 "
     "tokens, with the end-of-sentence token): use --max-source-positions 16 or more, or leave such "
     "pairs out with --skip-invalid-size-inputs-valid-test"),
    ((1024, 7), 100, True, False, "--max-target-positions 7 is shorter than 2 of the 4 target"),
    ((5, 1024), 100, True, True, None),  # skipped, as asked
    ((5, 1024), 4, True, True, "--max-tokens 4 is smaller than 1 of the 4 sentence pairs"),  # not skipped
    ((1024, 1024), 10, False, False, None),  # training skips the longer ones
    ((1024, 1024), 3, False, False,
     "--max-tokens 3 is smaller than every sentence pair of {s}: the shortest needs 5"),
    ((3, 1024), 100, False, False,
     "--max-source-positions 3 is shorter than every source sentence of {s}: the shortest has 4 tokens"),
    ((1024, 4), 5, False, False,  # each limit alone leaves a pair, both together none
     "no sentence pair of {s} fits --max-source-positions 1024, --max-target-positions 4 and "
     "--max-tokens 5 together"),
])
def test_pairs_that_do_not_fit_the_limits_are_named(positions, max_tokens, every_pair, skip_long, message):
    src, tgt = [4, 16, 12, 6], [5, 9, 8, 4]  # a pair needs its longer side: 5, 16, 12, 6 tokens
    line = unfit_pairs_line(SPLIT, src, tgt, positions, max_tokens, every_pair=every_pair,
                            skip_long=skip_long)
    if message is None:
        assert line is None
    else:
        assert line is not None and line.startswith(message.format(s=SPLIT)), line


def hybrid_args(data, save, *extra):
    return train_args(data / "bin", model_args(8, 1), "--max-update", "1", *extra, save_dir=save)


@pytest.mark.slow
@pytest.mark.parametrize("extra,message", [
    (["--max-tokens", "10"], "--max-tokens 10 is smaller than 8 of the 20 sentence pairs of the 'valid' "
                             "split in '{d}': the longest needs 16 tokens (its longer side, with the "
                             "end-of-sentence token); use --max-tokens 16 or more (or --max-tokens-valid 16 "
                             "for the validation alone)"),
    (["--max-tokens", "20", "--max-tokens-valid", "12"], "--max-tokens-valid 12 is smaller than 3 of the 20"),
    (["--max-source-positions", "5"], "--max-source-positions 5 is shorter than 19 of the 20 source "
                                      "sentences of the 'valid' split"),
    (["--max-source-positions", "3", "--skip-invalid-size-inputs-valid-test"],
     "--max-source-positions 3 is shorter than every source sentence of the 'train' split"),
    (["--max-tokens", "-5"], "--max-tokens -5 is not allowed: an integer >= 1"),  # was "smaller than every pair"
])
@pytest.mark.parametrize("arch", ["hybrid_lstm", "lstm"])
def test_sentences_longer_than_the_limits_are_one_line_for_every_model(sample_data, tmp_path, monkeypatch,
                                                                       extra, message, arch):
    """hybrid_lstm refuses at parse time (before the model is built), fairseq's lstm when
    fairseq fails to batch the split (its AssertionError, 'Size of sample #16 is invalid',
    'The dataset is empty'). In this process; the command's own line: test_cli.py."""
    save = tmp_path / "save"
    args = hybrid_args(sample_data, save, *extra)
    if arch == "lstm":
        args += ["--arch", "lstm", "--criterion", "cross_entropy"]
    monkeypatch.chdir(sample_data)
    line = train_error_in_process(args, monkeypatch)
    assert line.startswith("fairseq_hybrid: error: " + message.format(d=sample_data / "bin")), line
    assert not save.exists() or list(save.iterdir()) == [] or arch == "lstm" and \
        [p.name for p in save.iterdir()] == ["training.lock"]  # removed at this process's exit


@pytest.mark.slow
def test_the_advisor_refuses_what_fairseq_train_refuses(sample_data):
    from fairseq_hybrid.tools.advise import parse

    with pytest.raises(HybridConfigError, match="--max-tokens 10 is smaller than 8 of the 20 sentence "
                                                "pairs of the 'valid' split"):
        parse([str(sample_data / "bin"), "--user-dir", USER_DIR, "--arch", "hybrid_lstm",
               "--max-tokens", "10"])


def test_the_advisor_measures_batches_without_the_pairs_training_skips():
    """fairseq-train skips training pairs longer than --max-tokens; the advisor's batches
    did not (fairseq's AssertionError)."""
    from fairseq.data import LanguagePairDataset

    from fairseq_hybrid.tools.advise import representative_batch

    dictionary = make_dictionary()
    lengths = [3, 5, 30, 4, 6, 25]
    sentences = [torch.full((n,), dictionary.nspecial, dtype=torch.long) for n in lengths]
    dataset = LanguagePairDataset(sentences, torch.tensor(lengths), dictionary,
                                  sentences, torch.tensor(lengths), dictionary)
    args = SimpleNamespace(max_source_positions=1024, max_target_positions=1024, batch_size=None,
                           required_batch_size_multiple=1)
    batch = representative_batch(dataset, 12, args)
    assert batch["net_input"]["src_tokens"].size(1) <= 12 and sorted(batch["id"].tolist()) != []


# ------------------------------------------------------------------ numbers fairseq fails on
def training_namespace(**values):
    return SimpleNamespace(**{"max_update": 0, "lr": [0.001], "update_freq": [1], **values})


@pytest.mark.parametrize("values,message", [
    ({"update_freq": [0]}, "--update-freq 0 is not allowed: an integer >= 1 (batches per update)"),  # ZeroDivisionError
    ({"required_batch_size_multiple": 0}, "--required-batch-size-multiple 0 is not allowed"),  # SIGFPE
    ({"log_interval": 0}, "--log-interval 0 is not allowed"),  # ZeroDivisionError
    ({"save_interval": 0}, "--save-interval 0 is not allowed"),  # at the epoch's end
    ({"num_workers": -1}, "--num-workers -1 is not allowed: an integer >= 0"),  # torch's ValueError
    ({"seed": -1}, "--seed -1 is not allowed: an integer from 0 to 4294967295"),  # numpy's ValueError
    ({"max_tokens": 0}, "--max-tokens 0 is not allowed"),  # "The dataset is empty"
    ({"lr": [0.5, -0.1]}, "--lr 0.5,-0.1 is not allowed: a number >= 0"),  # trained away from the data
    ({"warmup_updates": -5}, "--warmup-updates -5 is not allowed"),  # ZeroDivisionError
    ({"lr": [float("nan")]}, "--lr nan is not allowed"),
    ({"momentum": -1.0}, "--momentum -1 is not allowed: a number >= 0"),  # torch's ValueError (sgd)
    ({"max_tokens_valid": "12x"}, "--max-tokens-valid '12x' is not allowed: a number"),
    ({"max_tokens": 4000, "batch_size": None, "seed": 1, "clip_norm": 0.0}, None),
    ({"beam": 0, "max_tokens": -1}, None),  # a generation parser: not a training's options
])
def test_numbers_fairseq_train_fails_on_are_one_line(values, message):
    if message is None:
        checks.check_training_options(training_namespace(**values))
        return
    with pytest.raises(HybridConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checks.check_training_options(training_namespace(**values))


# ------------------------------------------------------------------ checkpoints that do not fit
@pytest.mark.parametrize("options,message", [
    ({"encoder_embed_dim": 10}, "--encoder-embed-dim 12 (this run: 10); give the options it was trained with"),
    ({"encoder_layers": 3, "decoder_layers": 3},
     "--encoder-layers 2 (this run: 3), --decoder-layers 2 (this run: 3)"),
    ({"share_decoder_input_output_embed": True, "decoder_out_embed_dim": 12},
     "--share-all-embeddings (or --share-decoder-input-output-embed) off (this run: on)"),
    ({"input_feeding": True}, "--input-feeding off (this run: on)"),
    ({"decoder_hidden_size": 10}, "--decoder-hidden-size 14 (this run: 10)"),
])
def test_a_checkpoint_of_other_options_names_them(options, message):
    dictionary = make_dictionary()
    saved = make_model(dictionary).state_dict()
    with pytest.raises(HybridConfigError) as refused:
        checks.check_state_dict(make_model(dictionary, **options).state_dict(), saved)
    assert str(refused.value).startswith("fairseq_hybrid: error: the checkpoint was trained with other "
                                         f"model options than this run's: {message}"), str(refused.value)
    assert "dictionary" not in str(refused.value)


def test_a_checkpoint_of_another_dictionary_says_so_and_only_then():
    saved = make_model(make_dictionary(40)).state_dict()
    with pytest.raises(HybridConfigError, match="the checkpoint's dictionary has 44 entries, the data "
                                                "directory's 54 .* binarized with another dictionary"):
        checks.check_state_dict(make_model(make_dictionary(50)).state_dict(), saved)
    checks.check_state_dict(make_model(make_dictionary(40)).state_dict(), saved)  # fits


def test_an_unreadable_checkpoint_to_resume_from_names_the_way_on(tmp_path):
    older, last = tmp_path / "checkpoint_1_4.pt", tmp_path / "checkpoint_last.pt"
    older.write_bytes(b"older")
    last.write_bytes(b"x")
    assert checkpoints.resume_hint(str(last)) == ("delete it (the training then starts over), or resume "
                                                  f"from an older checkpoint with --restore-file {older}")
    assert checkpoints.resume_hint(str(last), restore_file=True) == f"give another --restore-file, e.g. {older}"
    older.unlink()
    assert checkpoints.resume_hint(str(last)) == "delete it (the training then starts over)"
    assert checkpoints.resume_hint(str(last), restore_file=True) == "give another --restore-file"
    torch_error = ("PytorchStreamReader failed reading zip archive: failed finding central directory. "
                   "This is an internal miniz error. If you are seeing this error, there is a high ...")
    assert checkpoints.first_sentence(torch_error) == ("PytorchStreamReader failed reading zip archive: "
                                                       "failed finding central directory")
    assert checkpoints.first_sentence("word " * 100).endswith("word ...")


# ------------------------------------------------------------------ Hydra, spawned processes
def test_a_hydra_key_the_model_does_not_have_is_named():
    from omegaconf import OmegaConf

    from fairseq_hybrid.plugin.hydra_callback import check_model_types

    for key, hint in (("foo", "; its options: dropout, encoder_embed_dim"),
                      ("encoder_layer", ": did you mean model.encoder_layers?")):
        with pytest.raises(HybridConfigError) as refused:  # was "model.foo None is not allowed"
            check_model_types(OmegaConf.create({"model": {"_name": "hybrid_lstm", key: 1}}))
        assert str(refused.value).startswith(
            f"fairseq_hybrid: error: model.{key} is not an option of hybrid_lstm{hint}")


def test_the_one_line_of_a_spawned_process_stays_one_line():
    from torch.multiprocessing import ProcessRaisedException

    child = ("\n\n-- Process 0 terminated with the following error:\nTraceback (most recent call last):\n"
             '  File "x.py", line 1, in main\nfairseq_hybrid.errors.HybridConfigError: fairseq_hybrid: '
             "error: --save-dir 'c' is in use by another training\n")
    error = error_of_a_rank(ProcessRaisedException(child, 0, 1234))
    assert str(error) == "fairseq_hybrid: error: --save-dir 'c' is in use by another training"
    assert error_of_a_rank(ProcessRaisedException("Traceback ...\nValueError: x", 0, 1)) is None
    assert error_of_a_rank(ValueError("fairseq_hybrid: error: x")) is None


def test_more_processes_than_gpus_for_fairseq_to_start_is_one_line():
    from fairseq_hybrid.plugin.world_size import check_world_size

    with pytest.raises(HybridConfigError, match="--distributed-world-size 2 is not allowed here: fairseq "
                                                "starts one process per GPU of this machine and it has 0; "
                                                "start each of the 2 processes yourself"):
        check_world_size(2, 0)  # fairseq: AssertionError: world size is 2 but have 0 available devices
    with pytest.raises(HybridConfigError, match="it has 2; use --distributed-world-size 2 or less, or"):
        check_world_size(4, 2)
    check_world_size(2, 2)


# ------------------------------------------------------------------ any model's checkpoint
def test_a_checkpoint_of_other_options_names_them_for_fairseqs_own_models():
    from argparse import Namespace

    from fairseq_hybrid.plugin import checkpoint_fit

    saved = Namespace(arch="lstm", encoder_embed_dim=16, dropout=0.1, lr=[0.1], max_update=5)
    current = Namespace(arch="lstm", encoder_embed_dim=32, dropout=0.3, lr=[0.2], max_update=9)
    # only the model's own options, and none that changes no tensor
    assert checkpoint_fit.differing(saved, current) == "--encoder-embed-dim 16 (this run: 32)"
    try:
        try:
            raise RuntimeError("Error(s) in loading state_dict for LSTMModel:\n\tsize mismatch for "
                               "encoder.embed_tokens.weight: copying a param with shape torch.Size([3008, 16]) "
                               "from checkpoint, the shape in current model is torch.Size([3008, 32]).")
        except RuntimeError:
            raise Exception(f"{checkpoint_fit.CANNOT_LOAD} x.pt; please ensure that the architectures match.")
    except Exception as error:  # noqa: BLE001 - fairseq's own
        assert checkpoint_fit.first_mismatch(error) == ("its encoder.embed_tokens.weight is [3008, 16], "
                                                        "this model's [3008, 32]")


@pytest.mark.slow
def test_fairseqs_lstm_resumed_with_another_size_is_one_line(sample_data, tmp_path, monkeypatch):
    from cli import run_tool

    save = tmp_path / "save"
    lstm = ["--arch", "lstm", "--criterion", "cross_entropy", "--no-epoch-checkpoints"]
    run_tool("fairseq-train", hybrid_args(sample_data, save, *lstm), cwd=sample_data)
    monkeypatch.chdir(sample_data)
    line = train_error_in_process(hybrid_args(sample_data, save, *lstm, "--encoder-embed-dim", "16"),
                                  monkeypatch)  # was: Cannot load model parameters ... (a traceback)
    assert line == (f"fairseq_hybrid: error: the checkpoint {save}/checkpoint_last.pt does not fit this "
                    "run's model (its encoder.embed_tokens.weight is [3008, 8], this model's [3008, 16]): "
                    "it was trained with --encoder-embed-dim 8 (this run: 16); give the options it was "
                    "trained with (or another --save-dir to start a new training)")


@pytest.mark.parametrize("extra,message", [
    (["--max-update", "1.5"], "argument --max-update: invalid int value: '1.5'"),
    (["--foo", "3"], "unrecognized arguments: --foo 3"),
])
def test_fairseq_trains_parser_errors_are_one_line_not_its_usage(extra, message, capsys, monkeypatch):
    import sys

    from fairseq import options

    monkeypatch.setattr(sys, "argv", ["fairseq-train"])  # argparse's prog
    with pytest.raises(HybridConfigError) as refused:  # was ~110 lines of usage, then the error
        options.parse_args_and_arch(options.get_training_parser(), ["data", "--arch", "lstm", *extra])
    assert str(refused.value) == f"fairseq_hybrid: error: {message} (see fairseq-train --help)"
    with pytest.raises(HybridConfigError, match="argument --beam: invalid int value: 'x'"):  # every tool's
        options.parse_args_and_arch(options.get_generation_parser(), ["data", "--beam", "x"])
    assert "usage:" not in capsys.readouterr().err
