"""The package's layers (fairseq_hybrid/__init__.py draws them): every module's imports,
read from the source (the ``import`` statements anywhere in the file, inside functions
too), point only down the table below; the package's docstring lists the same table."""
import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fairseq_hybrid"

# Lowest first. A unit (a subpackage, or a module directly under the package) imports its
# own modules and units of lower rows only; units on one row do not import each other
# (plugin/ runs inside fairseq-train, planning/ only plans: neither needs the other).
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("errors", "jsonio"),
    ("model",),
    ("parallel",),
    ("chunking",),
    ("plugin", "planning"),
    ("tools",),
)
LEVEL: Dict[str, int] = {unit: level for level, row in enumerate(LAYERS) for unit in row}
OUTSIDE = ("benchmarks", "tests", "recipes")  # never imported by the package


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = ROOT) -> Iterator[Tuple[int, str]]:
    """(line, absolute dotted name) of everything ``path`` imports, relative imports
    resolved; ``from package import name`` yields ``package.name``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def unit_of(dotted: str) -> str:
    """The layer unit of a dotted name inside the package ('' for the package itself)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(paths: List[Path], root: Path = ROOT) -> List[str]:
    found = []
    for path in paths:
        here = unit_of(module_name(path, root))
        for line, target in imported_modules(path, root):
            where = f"{path.relative_to(root)}:{line}"
            top = target.split(".")[0]
            if top in OUTSIDE:
                found.append(f"{where}: imports {target} from outside the package")
                continue
            if top != PACKAGE or here == "":  # the package's own __init__ sits on top
                continue
            there = unit_of(target)
            if there in ("", here) or there not in LEVEL:
                continue
            if here not in LEVEL:
                found.append(f"{where}: {here!r} is in no row of LAYERS")
            elif LEVEL[there] >= LEVEL[here]:
                found.append(f"{where}: {here} (row {LEVEL[here]}) imports {target} "
                             f"({there}, row {LEVEL[there]}): only rows below it may be imported")
    return found


def package_files() -> List[Path]:
    return sorted((ROOT / PACKAGE).rglob("*.py"))


def test_every_import_points_down_the_layers():
    assert violations(package_files()) == []


def test_every_unit_of_the_package_has_a_row():
    units: Set[str] = {unit_of(module_name(p)) for p in package_files()} - {""}
    assert units == set(LEVEL)


def test_a_lower_layer_importing_a_higher_one_is_reported(tmp_path):
    """The check itself: the engine importing the plugin, the plugin the planning models,
    a relative import inside a function and a benchmark imported by the package are each
    caught; imports down the table are not."""
    files = {
        "parallel/engine.py": "from ..plugin.config import PRESETS\n",
        "plugin/hybrid_lstm.py": "def f():\n    from fairseq_hybrid.planning import sizes\n",
        "chunking/wavefront.py": "from ..parallel.schedule import Key\nfrom .. import errors\n",
        "model/loss.py": "def g():\n    from .. import chunking\n",
        "planning/measure.py": "from ..chunking import auto_chunks\nimport benchmarks.models\n",
    }
    paths = []
    for name, text in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    found = violations(paths, tmp_path)
    assert [line.split(":")[0] for line in found] == [
        "fairseq_hybrid/parallel/engine.py", "fairseq_hybrid/plugin/hybrid_lstm.py",
        "fairseq_hybrid/model/loss.py", "fairseq_hybrid/planning/measure.py"]
    assert "imports fairseq_hybrid.plugin.config.PRESETS (plugin, row 4)" in found[0]


def docstring_layers() -> List[Tuple[str, ...]]:
    """The rows the package's docstring draws: lines of four spaces, then names joined by
    ', ' (a folder with its '/'), then two or more spaces and what the row holds."""
    doc = ast.get_docstring(ast.parse((ROOT / PACKAGE / "__init__.py").read_text()))
    rows = re.findall(r"^    ([a-z_]+/?(?:, [a-z_]+/?)*) {2,}\S", doc, flags=re.M)
    return [tuple(name.rstrip("/") for name in row.split(", ")) for row in rows]


def test_the_package_docstring_draws_these_layers():
    assert docstring_layers() == list(LAYERS)
