"""An epoch resumed with other batches (another --max-tokens, --update-freq, process count
...) trains on each of its sentences exactly once; an unchanged resume is fairseq's own;
fairseq-train end to end."""
from __future__ import annotations

import json
from typing import List

import numpy as np
import pytest
import torch
from fairseq.data.iterators import EpochBatchIterator

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import model_args, run_tool, train_args
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin import resumed_epoch

SENTENCES = 40


class Sentences(torch.utils.data.Dataset):
    """Sentence i is the number i (a batch collates to the list of its sentences)."""

    def __init__(self, size: int = SENTENCES) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return int(index)


def iterators(batch: int, shards: int = 1, size: int = SENTENCES) -> List[EpochBatchIterator]:
    """One iterator per process over contiguous batches of ``batch`` sentences (fairseq's
    batches are contiguous runs of the length-sorted order)."""
    batches = [np.arange(i, min(i + batch, size)) for i in range(0, size, batch)]
    return [EpochBatchIterator(Sentences(size), collate_fn=list, batch_sampler=batches, seed=3,
                               num_shards=shards, shard_id=shard) for shard in range(shards)]


def steps(epochs, count: int) -> List[int]:
    """The sentences ``count`` lock-step updates of every process take."""
    taken = []
    for _ in range(count):
        for epoch in epochs:
            taken += next(epoch)
    return taken


def rest(resumed: List[EpochBatchIterator], state: dict) -> List[int]:
    for iterator in resumed:
        iterator.load_state_dict(state)
    return [i for iterator in resumed for batch in iterator.next_epoch_itr(shuffle=True) for i in batch]


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("before,after", [(2, 3), (3, 2), (4, 7), (5, 40)])
def test_an_epoch_resumed_with_other_batches_trains_each_sentence_once(shards, before, after):
    first = iterators(before, shards)
    trained = steps([iterator.next_epoch_itr(shuffle=True) for iterator in first], 3)
    state = first[0].state_dict()
    assert state["iterations_in_epoch"] == 3 and resumed_epoch.SEEN in state
    resumed = iterators(after, shards)
    left = rest(resumed, state)
    assert sorted(trained + left) == list(range(SENTENCES))  # fairseq: skipped 3 of the new batches
    assert all(iterator.end_of_epoch() and iterator.next_epoch_idx == 2 for iterator in resumed)
    following = rest(resumed, resumed[0].state_dict())  # the next epoch: every sentence again
    assert sorted(following) == list(range(SENTENCES))
    assert resumed_epoch.SEEN not in resumed[0].state_dict()  # at an epoch's end: nothing to keep


def test_an_unchanged_resume_is_fairseqs_own():
    whole = steps([iterators(2)[0].next_epoch_itr(shuffle=True)], SENTENCES // 2)
    first = iterators(2)[0]
    trained = steps([first.next_epoch_itr(shuffle=True)], 5)
    resumed = iterators(2)[0]
    assert trained + rest([resumed], first.state_dict()) == whole
    assert getattr(resumed, resumed_epoch.REST, None) is None


def test_stopped_twice_in_one_epoch_with_three_batch_sizes():
    first = iterators(2)[0]
    trained = steps([first.next_epoch_itr(shuffle=True)], 4)
    second = iterators(3)[0]
    second.load_state_dict(first.state_dict())
    trained += steps([second.next_epoch_itr(shuffle=True)], 2)
    state = second.state_dict()
    assert np.unpackbits(state[resumed_epoch.SEEN]["bits"].numpy(), count=SENTENCES).sum() == len(trained)
    left = rest(iterators(5), state)
    assert sorted(trained + left) == list(range(SENTENCES))


def test_a_checkpoint_of_another_training_split_is_one_line():
    first = iterators(2)[0]
    steps([first.next_epoch_itr(shuffle=True)], 2)
    with pytest.raises(HybridConfigError, match="the checkpoint stopped in the middle of an epoch of "
                                                "a training split of 40 sentences, this one has 30"):
        iterators(2, size=30)[0].load_state_dict(first.state_dict())


def test_a_state_without_the_record_is_fairseqs_resume():
    first = iterators(2)[0]
    trained = steps([first.next_epoch_itr(shuffle=True)], 3)
    state = {k: v for k, v in first.state_dict().items() if k != resumed_epoch.SEEN}
    left = rest(iterators(2), state)
    assert sorted(trained + left) == list(range(SENTENCES))  # same batches: fairseq is exact
    assert len(rest(iterators(4), state)) == SENTENCES - 3 * 4  # fairseq skips 3 batches of 4


# ------------------------------------------------------------------ end to end
def sentences_per_epoch(log: str) -> dict:
    """epoch -> sentences trained on, from --log-interval 1 train_inner records."""
    counts: dict = {}
    for line in log.splitlines():
        if "train_inner" in line and "{" in line:
            record = json.loads(line[line.index("{"):])
            counts[record["epoch"]] = counts.get(record["epoch"], 0) + int(float(record["bsz"]))
    return counts


@pytest.mark.slow
def test_fairseq_train_resumed_with_twice_the_max_tokens_trains_the_rest_of_the_epoch(sample_data, tmp_path):
    def args(max_tokens, updates, *extra):
        return train_args(sample_data / "bin", model_args(16, 2), "--max-update", str(updates),
                          "--save-interval-updates", "4", "--no-epoch-checkpoints",
                          "--disable-validation", "--log-format", "json", "--log-interval", "1",
                          "--required-batch-size-multiple", "1", *extra, save_dir=tmp_path / "save",
                          max_tokens=max_tokens)

    first = sentences_per_epoch(run_tool("fairseq-train", args(300, 8), cwd=sample_data).stdout)
    assert list(first) == [1] and first[1] < 400
    resumed = run_tool("fairseq-train", args(600, 100, "--update-freq", "2", "--max-epoch", "1"),
                       cwd=sample_data)
    assert "epoch 1 is resumed with other batches than the checkpoint's" in resumed.stdout
    counts = sentences_per_epoch(resumed.stdout)
    assert list(counts) == [1] and first[1] + counts[1] == 400  # each sentence once (fairseq: ~140)
