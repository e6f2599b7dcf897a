"""The tests mirror the modules: every module of fairseq_hybrid/{model,parallel,chunking,planning}
has tests/test_<module>.py, and that file imports it (read from the source, so the mirror
cannot drift as modules are added, renamed or moved)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRRORED = ("model", "parallel", "chunking", "planning")


def mirrored_modules():
    """(package, module) of every module the tests mirror."""
    return [(package, path.stem) for package in MIRRORED
            for path in sorted((ROOT / "fairseq_hybrid" / package).glob("*.py")) if path.stem != "__init__"]


def imported_modules(path: Path) -> set:
    """Dotted names of the modules a file imports, anywhere in it (``import a.b``,
    ``from a.b import c``: a.b, and a.b.c in case c is a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_module_names_are_unique_across_the_mirrored_packages():
    found = mirrored_modules()
    assert {package for package, _ in found} == set(MIRRORED)  # every package was found
    modules = [module for _, module in found]
    assert sorted(m for m in set(modules) if modules.count(m) > 1) == []


def test_every_mirrored_module_has_a_test_file_named_after_it_that_imports_it():
    missing, not_imported = [], []
    for package, module in mirrored_modules():
        test_file = ROOT / "tests" / f"test_{module}.py"
        if not test_file.exists():
            missing.append(f"{package}/{module}.py")
        elif f"fairseq_hybrid.{package}.{module}" not in imported_modules(test_file):
            not_imported.append(f"{test_file.name} does not import fairseq_hybrid.{package}.{module}")
    assert missing == [], "modules without tests/test_<module>.py"
    assert not_imported == []


def test_the_import_reader_sees_every_form_of_import(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text("import fairseq_hybrid.model.loss as loss\n"
                      "from fairseq_hybrid.parallel import pipeline\n"
                      "def test():\n    from fairseq_hybrid.planning.sizes import ModelSize\n"
                      "from .relative import thing\n")
    names = imported_modules(source)
    assert {"fairseq_hybrid.model.loss", "fairseq_hybrid.parallel.pipeline",
            "fairseq_hybrid.planning.sizes"} <= names
    assert not any("relative" in name for name in names)
