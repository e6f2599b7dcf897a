"""The code passes the linter configured in pyproject.toml ([tool.ruff]), and no source file
grows past the size a reader can hold (450 lines)."""
import ast
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


def test_shell_scripts_stay_under_450_lines_too():
    scripts = list((ROOT / "recipes").rglob("*.sh"))
    assert len(scripts) >= 4
    long = {str(p.relative_to(ROOT)): n for p in scripts
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


DEFERRED = "# deferred:"  # an import kept out of start-up on purpose, with the reason after it


def function_local_imports(source: str) -> list:
    """Imports inside functions that are neither an optional dependency (inside a ``try``
    whose handler catches ImportError) nor marked ``# deferred: <why>`` on their line (a
    heavy module that only some runs need; test_layering still sees it): (line, text)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool, optional: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, (ast.Import, ast.ImportFrom)) and in_function and not optional
                    and DEFERRED not in lines[child.lineno - 1]):
                found.append((child.lineno, ast.unparse(child)))
            inner_optional = optional or (isinstance(child, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in child.handlers))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                  inner_optional)

    visit(tree, False, False)
    return found


def test_the_package_imports_at_module_top():
    """One-way layers stay visible: an import inside a function hides a dependency (and
    used to hide an import circle); only optional dependencies and imports marked deferred
    (a heavy module few runs need) may be imported there."""
    local = {str(p.relative_to(ROOT)): found for p in (ROOT / "fairseq_hybrid").rglob("*.py")
             if (found := function_local_imports(p.read_text()))}
    assert local == {}
    assert function_local_imports("def f():\n    import os\n") == [(2, "import os")]
    assert function_local_imports("def f():\n    try:\n        import x\n    except ImportError:\n"
                                  "        pass\n") == []
    assert function_local_imports("def f():\n    import x  # deferred: 1 s, only for g\n") == []
