"""Beam search for the quality study, and the made-up long-sentence probe set.

``python -m benchmarks.quality_generate JOBS.json`` runs several ``fairseq-generate``
jobs (subset x length penalty x data directory) in one process, so fairseq and torch are
imported once per run instead of once per job; each job writes its output atomically and
is skipped when its output exists (a killed run continues where it stopped). The output is
``fairseq-generate``'s own (S-, T-, H-, D- lines); ``read_output`` puts it back in corpus
order.

The probe set (``probe_groups``, ``write_probe``): consecutive test pairs joined into
pairs of 30-60 source words. It is made up (no human wrote these as one sentence); it
only asks how a model fares on inputs as long as the real long sentences of WMT, which the
sample's test set (at most 26 words) lacks. Its binarized form is the test set's token ids
concatenated (end-of-sentence markers dropped inside a group), so it needs no tokenizer;
its references are the raw references joined with spaces.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from .fairseq_runs import USER_DIR, BenchmarkError
from .quality_runs import Schedule, environment, run_checked

PROBE_WORDS = (30, 60)


def job(data: str, subset: str, checkpoint: Path, schedule: Schedule, lenpen, remove_bpe: str | None,
        out: str, cpu: bool = True) -> Dict[str, object]:
    """One generation: the fairseq-generate arguments and where its output goes (``lenpen``
    "best": the sweep's choice, filled in with ``{lenpen}`` in ``out``)."""
    args = [data, "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", subset,
            "--beam", str(schedule.beam), "--lenpen", "{lenpen}" if lenpen == "best" else str(lenpen),
            "--batch-size", "64",
            "--max-len-a", str(schedule.max_len_a), "--max-len-b", str(schedule.max_len_b),
            "--required-batch-size-multiple", "1", "--num-workers", "0", *(["--cpu"] if cpu else []),
            *(["--remove-bpe", remove_bpe] if remove_bpe else [])]
    return {"args": args, "out": str(out), "lenpen": lenpen}


def run_jobs(sweep: Dict[float, Dict[str, object]], final: Dict[str, Dict[str, object]], default: float,
             log_path: Path, threads: int, timeout: float, visible: str = "") -> Dict[str, object]:
    """In one subprocess: the ``sweep`` jobs (one per length penalty, on the validation
    set), the best length penalty by their BLEU against fairseq's T- lines (ties: the one
    nearest ``default``), then the ``final`` jobs, whose ``lenpen`` "best" and ``{lenpen}``
    in ``out`` are filled in. Outputs already written are not redone. Returns the sweep's
    BLEU by length penalty, the best one and the final outputs' paths."""
    spec = log_path.with_suffix(".jobs.json")
    spec.write_text(json.dumps({"sweep": {str(k): v for k, v in sweep.items()}, "final": final,
                                "default": default, "result": str(log_path.with_suffix(".result.json"))}, indent=1))
    result = log_path.with_suffix(".result.json")
    if not result.exists():
        env = environment(threads, None, visible) | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        run_checked([sys.executable, "-m", "benchmarks.quality_generate", str(spec)], log_path, env, timeout)
    return json.loads(result.read_text())


def sweep_bleu(path: Path) -> float:
    import sacrebleu

    out = read_output(path)
    return round(sacrebleu.BLEU().corpus_score(out["D"], [out["T"]]).score, 2)


def best_lenpen(bleu: Dict[str, float], default: float) -> float:
    """The length penalty with the highest BLEU; ties go to the one nearest ``default``."""
    return float(max(bleu, key=lambda lp: (bleu[lp], -abs(float(lp) - default))))


def read_output(path: Path) -> Dict[str, List[str]]:
    """Hypotheses (D-), references (T-) and sources (S-) in corpus order."""
    lines: Dict[str, Dict[int, str]] = {"S": {}, "T": {}, "D": {}}
    for line in path.read_text(encoding="utf-8").splitlines():
        kind = line[:2]
        if kind in ("S-", "T-", "D-") and "\t" in line:
            parts = line.split("\t")
            lines[kind[0]][int(parts[0][2:])] = parts[-1] if kind == "D-" else parts[1]
    count = len(lines["S"])
    missing = [i for i in range(count) if i not in lines["D"]]
    if count == 0 or missing:
        raise BenchmarkError(f"{path}: {len(missing)} of {count} sentences have no hypothesis")
    return {key: [lines[key].get(i, "") for i in range(count)] for key in ("S", "T", "D")}


def probe_groups(source_lengths: Sequence[int], low: int = PROBE_WORDS[0],
                 high: int = PROBE_WORDS[1]) -> List[List[int]]:
    """Runs of consecutive sentence indices whose source lengths add up to ``low``..``high``
    words: a run grows until it reaches ``low``; a sentence that would take it past
    ``high`` starts a new run instead (the short run is dropped)."""
    groups, current, words = [], [], 0
    for i, length in enumerate(source_lengths):
        if words + length > high:
            current, words = [], 0
        if length > high:
            continue
        current.append(i)
        words += length
        if words >= low:
            groups.append(current)
            current, words = [], 0
    return groups


def write_probe(data: Path, groups: List[List[int]], out: Path) -> Path:
    """A fairseq data directory whose ``test`` split is the joined groups of ``data``'s test
    split (the dictionaries copied; token ids concatenated, inner end-of-sentence dropped)."""
    from fairseq.data import Dictionary, data_utils, indexed_dataset

    import torch

    if (out / ".done").exists():
        return out
    pair = sorted({p.name.split(".")[1] for p in data.glob("test.*-*.*.idx")})[0]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for lang in pair.split("-"):
        shutil.copy(data / f"dict.{lang}.txt", tmp / f"dict.{lang}.txt")
        dictionary = Dictionary.load(str(data / f"dict.{lang}.txt"))
        dataset = data_utils.load_indexed_dataset(str(data / f"test.{pair}.{lang}"), None)
        prefix = str(tmp / f"test.{pair}.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", "mmap", vocab_size=len(dictionary))
        for group in groups:
            pieces = [dataset[i][:-1] if dataset[i][-1] == dictionary.eos() else dataset[i] for i in group]
            builder.add_item(torch.cat([*pieces, torch.tensor([dictionary.eos()], dtype=pieces[0].dtype)]))
        builder.finalize(prefix + ".idx")
    (tmp / "groups.json").write_text(json.dumps(groups))
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def join(lines: Sequence[str], groups: List[List[int]]) -> List[str]:
    return [" ".join(lines[i] for i in group) for group in groups]


def main(spec_path: str) -> None:
    """Run ``spec_path``'s jobs with fairseq_cli.generate in this process (see ``run_jobs``)."""
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate

    def run(entry: Dict[str, object]) -> None:
        out = Path(entry["out"])
        if out.exists():
            return
        parser = options.get_generation_parser()
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, entry["args"]))
        started = time.time()
        tmp = out.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            generate._main(cfg, handle)
        os.replace(tmp, out)
        print(f"generated {out.name} in {time.time() - started:.1f} s", file=sys.stderr, flush=True)

    spec = json.loads(Path(spec_path).read_text())
    started = time.time()
    bleu = {}
    for lenpen, entry in spec["sweep"].items():
        run(entry)
        bleu[lenpen] = sweep_bleu(Path(entry["out"]))
    best = best_lenpen(bleu, spec["default"])
    outputs = {}
    for label, entry in spec["final"].items():
        lenpen = best if entry["lenpen"] == "best" else float(entry["lenpen"])
        args = [str(lenpen) if a == "{lenpen}" else a for a in entry["args"]]
        out = entry["out"].format(lenpen=lenpen)
        run({"args": args, "out": out})
        outputs[label] = out
    Path(spec["result"]).write_text(json.dumps({"lenpen_valid_bleu": bleu, "best_lenpen": best,
                                                "outputs": outputs, "seconds": time.time() - started}))


if __name__ == "__main__":
    main(sys.argv[1])
