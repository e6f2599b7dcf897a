"""The code passes the linter configured in pyproject.toml ([tool.ruff]), and no source file
grows past the size a reader can hold (450 lines)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_no_source_file_is_longer_than_450_lines():
    sources = [p for folder in ("fairseq_hybrid", "benchmarks", "recipes", "tests")
               for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 50
    long = {str(p.relative_to(ROOT)): n for p in sources
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
