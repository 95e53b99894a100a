"""Fixtures shared by several test files (opt-in: a file names them in `pytestmark`)."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors: OpenMP's thread hand-offs cost more than the math on a loaded 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
