"""The shared fixtures (tests/fixtures.py) for the tests here. Helpers that are not fixtures live in helper
modules (tiny.py, reference.py, offered.py, ...), never in a test file: no test file imports another."""

from fixtures import home, one_thread, session_home, trained  # noqa: F401  (fixtures are found by name in a conftest)
