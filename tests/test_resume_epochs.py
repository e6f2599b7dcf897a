"""Resuming after the first epoch makes exactly the updates of the uninterrupted run.

fairseq builds a training split's batches when it creates the epoch iterator, breaking
ties between sentences of equal length with the seed ``--seed + epoch``; an uninterrupted
run builds them at epoch 1 and keeps them, a run resumed in epoch 2 or later built others
(``fairseq_patches.same_batches_after_resume``). Tested at both boundaries a user meets:
the checkpoint written at an epoch's end (``--max-epoch``/``--max-update`` reached there)
and a mid-epoch one after the first epoch, with dropout and validation, on 1 and 2 devices,
each against the one uninterrupted one-device run (on CPU devices the hybrid model's numbers
are the one device's: ``model/dropout.py``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import model_args, run_tool, train_args
from helpers import make_dictionary

UPDATES = 10  # the 400 pairs of sample_data at --max-tokens 1000: 6 batches an epoch,
# epoch 1 ends at update 6


def batches_built_at(epoch: int, rebuild: bool = False) -> list:
    """The batches a fresh task's iterator for epoch ``epoch`` holds (what a run that
    starts, or resumes, in that epoch trains on)."""
    from types import SimpleNamespace

    from fairseq.data import LanguagePairDataset
    from fairseq.tasks import FairseqTask

    dictionary = make_dictionary()
    lengths = torch.tensor([3, 5, 3, 5, 3, 5, 3, 5, 4, 4, 4, 4] * 4)
    sentences = [torch.full((int(n),), 5) for n in lengths]
    dataset = LanguagePairDataset(sentences, lengths, dictionary, sentences, lengths, dictionary)
    task = FairseqTask(SimpleNamespace(rebuild_batches=rebuild))
    iterator = task.get_batch_iterator(dataset, max_sentences=4, seed=7, epoch=epoch)
    assert iterator.epoch == epoch
    if rebuild:
        return [list(b) for b in iterator.batch_sampler(dataset, epoch)]
    return [list(b) for b in iterator.frozen_batches]


def test_a_resumed_epoch_gets_the_first_epochs_batches():
    first = batches_built_at(1)
    assert sorted(np.concatenate(first).tolist()) == list(range(48))
    assert batches_built_at(2) == first and batches_built_at(5) == first
    # --rebuild-batches builds per epoch (the same in both runs): left alone
    assert batches_built_at(3, rebuild=True) != first


@pytest.fixture
def data(sample_data):
    return sample_data  # conftest: binarized once per session


def args(data, save_dir, devices, *extra):
    return train_args(
        data / "bin", model_args(32, 2, "--dropout", "0.3"), "--hybrid-devices", devices,
        "--log-format", "json", "--log-interval", "1", "--seed", "3",
        "--no-epoch-checkpoints", *extra, save_dir=save_dir, max_tokens=1000,
    )


def validation_losses(log: str) -> dict:
    import json

    return {int(json.loads(line[line.index("{"):])["valid_num_updates"]):
            json.loads(line[line.index("{"):])["valid_loss"]
            for line in log.splitlines() if "valid_loss" in line and "{" in line}


def perplexities(log: str) -> dict:
    """update -> training perplexity (2 decimals: finer than the loss's 3)."""
    import json

    return {int(record["num_updates"]): float(record["ppl"]) for record in (
        json.loads(line[line.index("{"):]) for line in log.splitlines()
        if "train_inner" in line and "{" in line)}


def weights(path) -> dict:
    return torch.load(path, map_location="cpu")["model"]


@pytest.fixture(scope="module")
def whole(sample_data, tmp_path_factory):
    """The uninterrupted run on one device (run once; tests only read): its log and its
    last checkpoint's path."""
    save = tmp_path_factory.mktemp("whole")
    run = run_tool("fairseq-train", args(sample_data, save, "cpu", "--max-update", str(UPDATES)),
                   cwd=sample_data)
    return run.stdout, save / "checkpoint_last.pt"


@pytest.mark.slow
@pytest.mark.parametrize("devices,stops", [
    # epoch end reached by --max-epoch, then a mid-epoch checkpoint in epoch 2
    ("cpu", [("--max-epoch", "1"), ("--max-update", "8"), ("--max-update", "10")]),
    # epoch end reached by --max-update (the 6 + 4)
    ("cpu,cpu", [("--max-update", "6"), ("--max-update", "10")]),
])
def test_resume_at_and_after_an_epoch_end_is_exact(data, tmp_path, whole, devices, stops):
    whole_log, whole_checkpoint = whole
    assert sorted(perplexities(whole_log)) == list(range(1, UPDATES + 1))

    resumed, valid = {}, {}
    for stop in stops:
        run = run_tool("fairseq-train", args(data, tmp_path / "resumed", devices, *stop), cwd=data)
        resumed.update(perplexities(run.stdout))
        valid.update(validation_losses(run.stdout))
    expected_valid = validation_losses(whole_log)  # at the epoch end and the last update
    assert sorted(expected_valid) == [6, UPDATES]
    final, expected = weights(tmp_path / "resumed/checkpoint_last.pt"), weights(whole_checkpoint)
    if devices == "cpu":  # bit for bit
        assert resumed == perplexities(whole_log)
        assert {u: valid[u] for u in expected_valid} == expected_valid  # (a stop validates too)
        assert all(torch.equal(final[name], expected[name]) for name in expected)
    else:  # two uninterrupted cpu,cpu runs already differ by ~1e-7 in the weights (the
        # engine's summation order); without the fix the difference is ~1e-3, ppl +-0.5
        assert resumed.keys() == perplexities(whole_log).keys()
        for update, ppl in perplexities(whole_log).items():
            assert abs(resumed[update] - ppl) <= 0.011, (update, resumed[update], ppl)
        for name in expected:
            torch.testing.assert_close(final[name], expected[name], rtol=0, atol=2e-6)
