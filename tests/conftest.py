"""Fixtures shared by every test suite (each kind lives in its own tests/fixtures module)."""

pytest_plugins = ["tests.fixtures.nats"]
