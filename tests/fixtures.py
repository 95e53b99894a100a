"""Fixtures shared by test files here and beside the research scripts (benchmarks/test_*.py): both
conftest.py files import them, so a test names one in `pytestmark` or its arguments. Never imported by a
test file."""

import pytest
import torch


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
