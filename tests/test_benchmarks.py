"""The research scripts in benchmarks/ stay runnable: each imports and parses its arguments as
`python -m benchmarks.NAME` would (their arithmetic is tested beside the code it judges)."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                 if p.stem != "__init__" and "def main(" in p.read_text(encoding="utf-8"))


def test_every_script_is_found():
    assert {"auto_replay", "draft_replay", "drafters", "eagle_speed", "kernel_bench",
            "ngram_situations"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_parses_its_arguments(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_script_runs_from_the_repository_root():
    done = subprocess.run([sys.executable, "-m", "benchmarks.auto_replay", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
