"""Where the quality study keeps its runs, and what a rerun does with each.

Finished runs are stored as soon as each one finishes, in git-sized files under
``results/quality/runs/<name>/``: ``<model>-seed<N>.json`` (settings, learning curve,
stopping point, speed, memory, length-penalty sweep, scores) and
``<model>-seed<N>.hyps.json.gz`` (its hypotheses, so the report can be recomputed from
the results alone). Checkpoints and logs stay in the work directory
(``work/quality/<name>/<model>-seed<N>/``, gitignored).

A rerun of the same command looks at each planned run (``status``):

- ``finished``: its record exists with the same settings: skipped;
- ``resume``: no record, but the work directory holds a training of the same settings
  (``settings.json`` matches and ``checkpoints/checkpoint_last.pt`` exists): fairseq
  resumes from that checkpoint, and generations already written are not redone;
- ``new``: nothing usable (a work directory of other settings is wiped first).

A record of *other* settings stops the study with one line (``SettingsMismatch``): hours of
finished runs are never overwritten silently; use another ``--name``.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .fairseq_runs import BenchmarkError


class SettingsMismatch(BenchmarkError):
    pass


def run_id(model: str, seed: int) -> str:
    return f"{model}-seed{seed}"


def write_text(path: Path, text: str) -> None:
    """Write ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
        tmp.write(text)
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)


def write_gzip_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
        # mtime=0: the same hypotheses give the same bytes (no spurious git changes)
        with gzip.GzipFile(fileobj=tmp, mode="wb", mtime=0) as handle:
            handle.write(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)


def read_gzip_json(path: Path) -> object:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


class Store:
    """The records of one study (``records``) and its work directory (``work``)."""

    def __init__(self, records: Path, work: Path):
        self.records, self.work = Path(records), Path(work)

    def record_path(self, model: str, seed: int) -> Path:
        return self.records / f"{run_id(model, seed)}.json"

    def hyps_path(self, model: str, seed: int) -> Path:
        return self.records / f"{run_id(model, seed)}.hyps.json.gz"

    def run_dir(self, model: str, seed: int) -> Path:
        return self.work / run_id(model, seed)

    def status(self, model: str, seed: int, settings: Dict[str, object]) -> str:
        record = self.record_path(model, seed)
        if record.exists():
            stored = json.loads(record.read_text(encoding="utf-8"))
            if stored.get("settings") != settings:
                changed = sorted(k for k in {*settings, *stored.get("settings", {})}
                                 if settings.get(k) != stored.get("settings", {}).get(k))
                raise SettingsMismatch(f"{record} was run with other settings ({', '.join(changed)} differ): "
                                       "use another --name for a new study, or move the old records away")
            if self.hyps_path(model, seed).exists():
                return "finished"
        run_dir = self.run_dir(model, seed)
        started = run_dir / "settings.json"
        if started.exists() and json.loads(started.read_text(encoding="utf-8")) == settings \
                and (run_dir / "checkpoints/checkpoint_last.pt").exists():
            return "resume"
        return "new"

    def begin(self, model: str, seed: int, settings: Dict[str, object], status: str) -> Path:
        """The run's work directory, wiped first unless the run resumes."""
        run_dir = self.run_dir(model, seed)
        if status != "resume":
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            write_text(run_dir / "settings.json", json.dumps(settings, indent=1, sort_keys=True))
        return run_dir

    def finish(self, record: Dict[str, object], hyps: Dict[str, List[str]]) -> None:
        """Store a finished run: hypotheses first, the record last (the record marks it done)."""
        write_gzip_json(self.hyps_path(record["model"], record["seed"]), hyps)
        write_text(self.record_path(record["model"], record["seed"]), json.dumps(record, indent=1) + "\n")

    def load(self, model: str, seed: int) -> Optional[Tuple[Dict[str, object], Dict[str, List[str]]]]:
        record, hyps = self.record_path(model, seed), self.hyps_path(model, seed)
        if not (record.exists() and hyps.exists()):
            return None
        return json.loads(record.read_text(encoding="utf-8")), read_gzip_json(hyps)


def plan(models_seeds: List[Tuple[str, int]], store: Store, settings: Dict[str, Dict[str, object]]) -> Dict[str, List]:
    """Each planned run (model, seed) by what a rerun does with it; ``settings`` by model.
    Every record is checked first, so a mismatch stops the study before any work."""
    out: Dict[str, List] = {"finished": [], "resume": [], "new": []}
    for model, seed in models_seeds:
        out[store.status(model, seed, settings[model])].append((model, seed))
    return out
