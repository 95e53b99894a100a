"""The OpenMP wait policy (speczoo/openmp_wait.py): a bounded spin set when the package is imported, before
torch loads libgomp; the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins; too late once torch is loaded."""

import os
import subprocess
import sys

import pytest

from speczoo import openmp_wait


@pytest.fixture(autouse=True)
def keep_state(monkeypatch):
    monkeypatch.setattr(openmp_wait, "_state", openmp_wait.state())


def test_sets_a_bounded_spin_when_the_user_chose_none():
    env = {"PATH": "/bin"}
    said = openmp_wait.apply(env, runtime_loaded=False)
    assert env["GOMP_SPINCOUNT"] == str(openmp_wait.SPIN_COUNT) and "set by speczoo" in said
    assert openmp_wait.state() == said


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "infinite")])
def test_the_users_setting_wins(name, value):
    env = {name: value}
    said = openmp_wait.apply(env, runtime_loaded=False)
    assert env == {name: value} and said == f"yours: {name}={value}"


def test_an_empty_setting_is_no_choice():
    env = {"OMP_WAIT_POLICY": " "}
    openmp_wait.apply(env, runtime_loaded=False)
    assert env["GOMP_SPINCOUNT"] == str(openmp_wait.SPIN_COUNT)


def test_leaves_the_environment_alone_once_the_runtime_is_loaded():
    env: dict[str, str] = {}
    said = openmp_wait.apply(env, runtime_loaded=True)
    assert env == {} and "torch was imported before speczoo" in said


def test_a_peer_gets_the_users_environment(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    openmp_wait.apply(os.environ, runtime_loaded=False)       # monkeypatch restores os.environ after the test
    assert os.environ["GOMP_SPINCOUNT"] == str(openmp_wait.SPIN_COUNT)
    assert "GOMP_SPINCOUNT" not in openmp_wait.environ_of_the_user()
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    openmp_wait.apply(os.environ, runtime_loaded=False)
    assert openmp_wait.environ_of_the_user()["GOMP_SPINCOUNT"] == "7"


def _spin_seen(code: str, **env: str) -> str:
    """GOMP_SPINCOUNT as a fresh interpreter running `code` then sees it, and what speczoo said."""
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code + "\nimport os; from speczoo import openmp_wait\n"
                           "print(os.environ.get('GOMP_SPINCOUNT'), '|', openmp_wait.state())"],
                          env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_speczoo_sets_it_before_torch_and_the_cli_imports_torch_after():
    seen = _spin_seen("import sys; import speczoo.cli; assert 'torch' in sys.modules")
    assert seen.startswith(f"{openmp_wait.SPIN_COUNT} | GOMP_SPINCOUNT={openmp_wait.SPIN_COUNT}, set by speczoo")
    assert _spin_seen("import speczoo", OMP_WAIT_POLICY="passive") == "None | yours: OMP_WAIT_POLICY=passive"
    late = _spin_seen("import torch; import speczoo")
    assert late.startswith("None | ") and "torch was imported before speczoo" in late
