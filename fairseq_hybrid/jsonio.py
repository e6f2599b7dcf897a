"""The project's one way to write a JSON file (the advisor's report, the benchmarks', each
process's peak memory): written to a temporary file in the destination folder, then
renamed over the destination, so a reader (or an interrupted run) never sees half a file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union


def write_json_atomic(report: Any, path: Union[str, Path]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as tmp:
        try:
            json.dump(report, tmp, indent=2)
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, out)
