"""The import contracts of pyproject.toml ([tool.importlinter]) hold: imports point down the layers only and
no modules or packages import each other in a circle. CI runs `lint-imports` itself (.ci/run); this test
runs it with the suite, so the README's test command checks the layers too."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                    reason="import-linter is not installed (it is in the 'test' extra: pip install -e '.[test]')")
def test_imports_keep_to_the_layers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                               "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"lint-imports found imports against the layers:\n{run.stdout}{run.stderr}"


def _imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules a Python file imports (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return {name.split(".")[0] for name in names}


def test_no_test_file_imports_another_test_file_or_a_research_script():
    """Shared helpers live in helper modules of tests/ (tiny.py, reference.py, ...) and fixtures in
    tests/fixtures.py; a test file never imports another test file, and tests/ never imports benchmarks/
    (what a test needs from a research script moves into the package, or the test moves beside it)."""
    files = sorted((ROOT / "tests").rglob("test_*.py")) + sorted((ROOT / "benchmarks").glob("test_*.py"))
    assert len(files) > 50
    bad = [f"{f.relative_to(ROOT)} imports {m}" for f in files for m in sorted(_imported_modules(f))
           if m.startswith("test_") or (m == "benchmarks" and f.is_relative_to(ROOT / "tests"))]
    assert not bad, "\n".join(bad)


def test_tests_mirror_the_source():
    """Every test file sits in tests/ for a module speczoo/NAME.py, or in tests/PKG/ for the package
    speczoo/PKG (docs/architecture.md)."""
    packages = {p.name for p in (ROOT / "src" / "speczoo").iterdir() if (p / "__init__.py").is_file()}
    folders = {f.parent.name for f in (ROOT / "tests").rglob("test_*.py") if f.parent != ROOT / "tests"}
    assert folders <= packages, f"test folders without a package of that name: {sorted(folders - packages)}"
