"""One Go duration parser for every service: Go's time.ParseDuration grammar."""

from __future__ import annotations

import pytest

from nodeflow_contracts.durations import go_duration_seconds


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1.h", 3600.0),
        (".5s", 0.5),
        ("500ms", 0.5),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("0", 0.0),
        ("-2s", -2.0),
        ("+2s", 2.0),
        (" 10s ", 10.0),
    ],
)
def test_rule_a_go_duration_reads_as_go_parses_it(raw: str, seconds: float) -> None:
    assert go_duration_seconds(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["", "5", "ten minutes", "1d", "-", "1h 30m", ".s", "1.2.3s"])
def test_rule_what_go_refuses_is_no_duration(raw: str) -> None:
    with pytest.raises(ValueError, match="not a Go duration"):
        go_duration_seconds(raw)
