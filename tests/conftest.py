"""Fixtures shared by every test suite (each kind lives in its own tests/fixtures module), and
the one rule about skips: under CI=true a skipped test is a failure.

A test skips where this machine lacks something it needs (kubectl, a real Slurm, Linux
features). On a developer's machine that is a skip; in CI, where `make test` installs all of
it, the same skip would hide a test that never ran, so this hook reports it as a failure with
the skip's reason. Tests that do not apply to a target at all (the emulator-only conformance
tests against a real API server) are deselected, not skipped, so they never reach this rule.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

pytest_plugins = ["tests.fixtures.nats"]


def skips_fail() -> bool:
    return os.environ.get("CI") == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and skips_fail() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may skip: {reason}"
