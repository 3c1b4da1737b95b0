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
from hypothesis import HealthCheck, settings

pytest_plugins = ["tests.fixtures.nats"]

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE, else "ci" under CI=true, else "dev".
# - ci: derandomized (the examples follow from each test alone), no example database, and a
#   failure prints the blob that replays it (@reproduce_failure): a property test passes or
#   fails the same way on every CI run, and a failure found there can be replayed anywhere.
# - dev: Hypothesis's random search with its local database, so repeated runs on a
#   developer's machine keep exploring and replay what failed before.
# - thorough (`make test-thorough`): ten times the examples of every property test, random
#   and without deadlines, for a long hunt before a release or after touching a safety rule.
# No profile has a deadline: this suite makes no timed assertions (speed is `make bench`'s),
# and a shared 2-core machine would make one flaky.
THOROUGH_FACTOR = 10
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.register_profile(
    "thorough",
    max_examples=100 * THOROUGH_FACTOR,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") == "true" else "dev"
)
settings.load_profile(HYPOTHESIS_PROFILE)


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the thorough profile, a property test that names its own max_examples (which a
    profile cannot override) runs THOROUGH_FACTOR times that many."""
    if HYPOTHESIS_PROFILE != "thorough":
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if test is None or own is None or not getattr(test, "is_hypothesis_test", False):
            continue
        wanted = max(own.max_examples * THOROUGH_FACTOR, settings().max_examples)
        test._hypothesis_internal_use_settings = settings(own, max_examples=wanted)
