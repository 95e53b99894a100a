"""The import contracts of pyproject.toml ([tool.importlinter]) hold: imports point down the layers only and
no modules or packages import each other in a circle. CI runs `lint-imports` itself (.ci/run); this test
runs it with the suite, so the README's test command checks the layers too."""

from __future__ import annotations

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
