"""Fixtures shared by test files here and beside the research scripts (benchmarks/test_*.py): both
conftest.py files import them, so a test names one in `pytestmark` or its arguments. Never imported by a
test file."""

import os

import pytest
import torch

# The speczoo home the test session was started with (CI gives each run a fresh one; a developer's
# default is ~/.cache/speczoo): where the real models were pulled.
SESSION_SPECZOO_HOME = os.environ.get("SPECZOO_HOME")


@pytest.fixture
def one_thread():
    """Tiny tensors: OpenMP's thread hand-offs cost more than the math on a loaded 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model, args, head): a tiny qwen2 target and an EAGLE head trained on it (tests/tiny_eagle.py),
    once per test module."""
    from tiny_eagle import train_tiny_head

    return train_tiny_head(tmp_path_factory)


@pytest.fixture
def session_home(monkeypatch):
    """The speczoo home the session started with, for real-model tests in a file whose autouse fixture
    points SPECZOO_HOME at a temporary one: their pulls are then the session's, reused."""
    if SESSION_SPECZOO_HOME is None:
        monkeypatch.delenv("SPECZOO_HOME", raising=False)
    else:
        monkeypatch.setenv("SPECZOO_HOME", SESSION_SPECZOO_HOME)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh speczoo home for the test (SPECZOO_HOME): its zoo, empty, to pull into and inspect."""
    h = tmp_path / "home"
    monkeypatch.setenv("SPECZOO_HOME", str(h))
    return h
