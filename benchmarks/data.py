"""Training data for the benchmarks: the bundled sample at a given sentencepiece
vocabulary (built with the sample recipe's own stages), or synthetic sentences of a given
vocabulary and lengths; and the length statistics the FLOP count needs.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .fairseq_runs import BIN, ROOT, BenchmarkError


@dataclass(frozen=True)
class LengthStats:
    source_per_target: float  # source tokens per target token (with EOS)
    attended_source_length: float  # mean source length seen by a target token
    sentences: int


def sample_data(vocab: int, work: Path) -> Path:
    """The bundled corpus encoded with a ``vocab``-piece joint sentencepiece model and
    binarized (cached under ``work``; the recipe's .done markers make reruns free)."""
    env = dict(os.environ, WORK=str(work), SPM_VOCAB=str(vocab),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    for stage in ("spm", "binarize"):
        proc = subprocess.run(["bash", str(ROOT / "recipes/sample/run.sh"), stage], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchmarkError(f"preparing the sample at vocab {vocab} ({stage}) failed:\n{proc.stderr[-2000:]}")
    return work / "bin"


def synthetic_data(vocab: int, sentences: int, min_len: int, max_len: int, work: Path,
                   seed: int = 1) -> Path:
    """Random sentences of ``vocab`` word types (Zipf-like frequencies) with target length
    = source length +-20%, binarized; for timing only (nothing to learn)."""
    out = work / "bin"
    if (out / ".done").exists():
        return out
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(vocab)]
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    splits = {"train": sentences, "valid": max(100, sentences // 100), "test": max(100, sentences // 100)}
    for split, count in splits.items():
        with open(raw / f"{split}.src", "w") as src, open(raw / f"{split}.tgt", "w") as tgt:
            for _ in range(count):
                length = rng.randint(min_len, max_len)
                tgt_length = max(1, round(length * rng.uniform(0.8, 1.2)))
                src.write(" ".join(f"w{i}" for i in rng.choices(range(vocab), weights, k=length)) + "\n")
                tgt.write(" ".join(f"w{i}" for i in rng.choices(range(vocab), weights, k=tgt_length)) + "\n")
    tmp = work / "bin.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [str(BIN / "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
         "--testpref", str(raw / "test"), "--destdir", str(tmp), "--workers", "2",
         "--nwordssrc", str(vocab), "--nwordstgt", str(vocab)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise BenchmarkError(f"fairseq-preprocess of the synthetic data failed:\n{proc.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    (out / ".done").write_text("ok\n")
    return out


def length_stats(data: Path, subset: str = "train") -> LengthStats:
    """Token counts of the binarized ``subset`` (fairseq's .idx sizes, EOS included)."""
    from fairseq.data import data_utils

    pairs = [p.name.split(".")[1] for p in data.glob(f"{subset}.*-*.*.idx")]
    if not pairs:
        raise BenchmarkError(f"no binarized '{subset}' split in {data}")
    source_lang, target_lang = pairs[0].split("-")
    source = data_utils.load_indexed_dataset(str(data / f"{subset}.{pairs[0]}.{source_lang}"), None)
    target = data_utils.load_indexed_dataset(str(data / f"{subset}.{pairs[0]}.{target_lang}"), None)
    s, t = np.asarray(source.sizes, dtype=np.float64), np.asarray(target.sizes, dtype=np.float64)
    return LengthStats(float(s.sum() / t.sum()), float((s * t).sum() / t.sum()), len(s))
