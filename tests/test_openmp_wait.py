"""The OpenMP wait policy (speczoo/openmp_wait.py): speczoo leaves it to the user (a bounded spin costs quiet
speed, docs/results.md "One core busy") and records what the runtime will use, for `speczoo doctor`."""

import os
import subprocess
import sys

import pytest

from speczoo import openmp_wait


@pytest.fixture(autouse=True)
def keep_state(monkeypatch):
    monkeypatch.setattr(openmp_wait, "_state", openmp_wait.state())


def test_leaves_the_environment_alone_and_says_the_default_and_what_to_set():
    env = {"PATH": "/bin"}
    said = openmp_wait.note(env, runtime_loaded=False)
    assert env == {"PATH": "/bin"} and "default" in said and f"GOMP_SPINCOUNT={openmp_wait.SPIN_COUNT}" in said
    assert openmp_wait.state() == said


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "1000")])
def test_the_users_setting_is_reported(name, value):
    env = {name: value}
    said = openmp_wait.note(env, runtime_loaded=False)
    assert env == {name: value} and said == f"yours: {name}={value}"


def test_an_empty_setting_is_no_choice():
    assert "default" in openmp_wait.note({"OMP_WAIT_POLICY": " "}, runtime_loaded=False)


def test_a_setting_made_after_torch_loaded_is_flagged():
    said = openmp_wait.note({"GOMP_SPINCOUNT": "1000"}, runtime_loaded=True)
    assert said.startswith("yours: GOMP_SPINCOUNT=1000") and "torch was imported before speczoo" in said


def test_importing_speczoo_sets_nothing():
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", "import os, speczoo.cli; from speczoo import openmp_wait\n"
                           "print(os.environ.get('GOMP_SPINCOUNT'), '|', openmp_wait.state())"],
                          env=base, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None | the OpenMP runtime's default")
