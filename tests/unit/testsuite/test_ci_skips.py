"""The suite's own rule: under CI=true a skipped test fails, with the skip's reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SKIPPING_TEST = """
import pytest

def test_needs_a_tool():
    pytest.skip("the tool is not installed")

@pytest.mark.xfail(reason="known gap", strict=True)
def test_known_gap():
    assert False
"""


def run_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_sample.py").write_text(SKIPPING_TEST)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_skip_fails_under_ci(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "skipped under CI=true" in result.stdout
    assert "the tool is not installed" in result.stdout
    assert "1 failed" in result.stdout and "1 xfailed" in result.stdout


def test_a_skip_is_a_skip_outside_ci(tmp_path: Path) -> None:
    result = run_suite(tmp_path, None)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout and "1 xfailed" in result.stdout
