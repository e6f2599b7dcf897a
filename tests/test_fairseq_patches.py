"""fairseq drops the last batch when its size is not a multiple of
--required-batch-size-multiple (default 8, fairseq #5036); with the plugin loaded nothing is
dropped: fairseq-generate translates every test sentence with its default options,
validation sees every sentence, and a long training sentence alone in its batch is trained."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fairseq_hybrid  # noqa: F401  (installs the patches)
from cli import USER_DIR, hypotheses, model_args, preprocess, run_tool, write_sample_subset
from cli import train_args as shared_train_args

SMALL = model_args(16, 1)
LONG = 60  # words of the one long training pair


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """60 sample pairs plus one long pair (last in fairseq's length order), 20 valid, 300 test."""
    root = tmp_path_factory.mktemp("batches")
    raw = root / "raw"
    write_sample_subset(raw, train=60, valid=20, test=300)
    for lang in ("en", "de"):
        with open(raw / f"train.{lang}", "a", encoding="utf-8") as handle:
            handle.write(" ".join(f"long{i}" for i in range(LONG)) + "\n")
    preprocess(raw, root / "bin")
    return root


def train_args(data: Path, *extra: str) -> list:
    return shared_train_args(data / "bin", SMALL, "--seed", "1", *extra, max_tokens=100)


def test_batch_by_size_keeps_the_last_batch():
    from fairseq.data import data_utils

    indices = np.arange(300, dtype=np.int64)
    sizes = np.full(300, 10, dtype=np.int64)
    for kwargs in ({"max_sentences": 64}, {"max_tokens": 330}, {"max_sentences": 1}):
        batches = data_utils.batch_by_size(indices, lambda i: 10, num_tokens_vec=sizes,
                                           required_batch_size_multiple=8, **kwargs)
        flat = np.concatenate([np.asarray(b) for b in batches])
        assert sorted(flat.tolist()) == list(range(300)), kwargs
        limit = kwargs.get("max_sentences") or kwargs["max_tokens"] // 10
        assert max(len(b) for b in batches) <= limit
    assert data_utils.batch_by_size(np.empty(0, dtype=np.int64), lambda i: 1, max_tokens=10,
                                    required_batch_size_multiple=8) == []


@pytest.mark.slow
def test_train_and_valid_iterators_cover_every_sentence(data):
    """fairseq's own Trainer builds the batches, with the default multiple of 8."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, train_args(data, "--cpu"))
    assert args.required_batch_size_multiple == 8
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)

    valid = [i for batch in trainer.get_valid_iterator("valid").next_epoch_itr(shuffle=False)
             for i in batch["id"].tolist()]
    assert sorted(valid) == list(range(20))

    train_itr = trainer.get_train_iterator(epoch=1)
    train = [batch["id"].tolist() for batch in train_itr.next_epoch_itr(shuffle=True)]
    assert sorted(i for batch in train for i in batch) == list(range(61))
    assert [60] in train  # the long pair, alone in its batch, is trained on


@pytest.mark.slow
def test_generate_translates_all_300_sentences_with_default_options(data, tmp_path):
    run_tool("fairseq-train", train_args(data, "--max-update", "2", "--save-dir", str(tmp_path)),
             cwd=tmp_path)
    proc = run_tool("fairseq-generate", [str(data / "bin"), "--user-dir", USER_DIR,
                                         "--path", str(tmp_path / "checkpoint_last.pt")], cwd=tmp_path)
    translated = sorted(int(line.split("\t")[0][2:]) for line in hypotheses(proc.stdout))
    assert translated == list(range(300))
    assert "Translated 300 sentences" in proc.stderr + proc.stdout

