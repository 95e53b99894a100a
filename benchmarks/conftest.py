"""The tests beside the research scripts (benchmarks/test_*.py) use the shared fixtures of tests/fixtures.py;
their helpers come from tests/ too (pyproject's pythonpath)."""

from fixtures import one_thread, trained  # noqa: F401  (fixtures are found by name in a conftest)
