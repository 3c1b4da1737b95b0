"""One package on one node: the stage machine and what a Job's end means."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Interrupt, Package
from maintenance_scheduler.skyhook.stages import (
    COMPLETE,
    ERRORING,
    IN_PROGRESS,
    JobFacts,
    PackageState,
    parse_node_state,
    render_node_state,
    step_package,
)

PLAIN = Package(name="driver", version="1.0.0", image="ghcr.io/x/driver")
REBOOTING = Package(
    name="kernel", version="2.0.0", image="ghcr.io/x/kernel", interrupt=Interrupt("reboot")
)
NOW = 1_000.0


def done(name: str = "job") -> JobFacts:
    return JobFacts(name=name, outcome="complete")


def walk(package: Package, entry: PackageState | None = None) -> list[str]:
    """Every stage the package runs, each Job completing at once."""
    seen: list[str] = []
    job: JobFacts | None = None
    for _ in range(10):
        outcome = step_package(package, entry, job, now=NOW, pull_grace_seconds=120)
        entry = outcome.entry
        assert entry is not None
        if entry.state == COMPLETE:
            return seen
        assert outcome.run_job
        seen.append(entry.stage)
        job = done()
    raise AssertionError("did not finish")


def test_stages_without_interrupt_are_apply_then_config() -> None:
    assert walk(PLAIN) == ["apply", "config"]


def test_stages_with_interrupt_are_apply_config_interrupt_post_interrupt() -> None:
    assert walk(REBOOTING) == ["apply", "config", "interrupt", "post-interrupt"]


def test_a_version_change_runs_upgrade_instead_of_apply() -> None:
    old = PackageState("driver", "0.9.0", "ghcr.io/x/driver", "config", COMPLETE)
    assert walk(PLAIN, old) == ["upgrade", "config"]


def test_a_removed_package_runs_uninstall_and_leaves_the_node_state() -> None:
    entry = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", COMPLETE)
    first = step_package(None, entry, None, now=NOW, pull_grace_seconds=120)
    assert first.entry is not None and first.entry.stage == "uninstall" and first.run_job
    second = step_package(None, first.entry, done(), now=NOW, pull_grace_seconds=120)
    assert second.entry is None


def test_post_interrupt_completion_releases_the_maintenance_request() -> None:
    entry = PackageState("kernel", "2.0.0", "ghcr.io/x/kernel", "post-interrupt", IN_PROGRESS)
    outcome = step_package(REBOOTING, entry, done(), now=NOW, pull_grace_seconds=120)
    assert outcome.entry is not None and outcome.entry.state == COMPLETE
    assert outcome.interrupt_done


@pytest.mark.parametrize("reason", ["BackoffLimitExceeded", "DeadlineExceeded", "OOMKilled"])
def test_failed_job_marks_the_package_erroring_with_the_reason(reason: str) -> None:
    entry = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "apply", IN_PROGRESS)
    failed = JobFacts(name="j1", outcome="failed", reason=reason)
    outcome = step_package(PLAIN, entry, failed, now=NOW, pull_grace_seconds=120)
    assert outcome.entry is not None and outcome.entry.state == ERRORING
    assert reason in outcome.entry.message
    assert not outcome.run_job  # the failed Job stays, for its logs; nothing retries by itself
    again = step_package(PLAIN, outcome.entry, failed, now=NOW + 60, pull_grace_seconds=120)
    assert again.entry == outcome.entry and not again.run_job


def test_deleting_the_failed_job_retries_the_stage_and_counts_a_restart() -> None:
    entry = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", ERRORING, message="x")
    outcome = step_package(PLAIN, entry, None, now=NOW, pull_grace_seconds=120)
    assert outcome.run_job
    assert outcome.entry == PackageState(
        "driver", "1.0.0", "ghcr.io/x/driver", "config", IN_PROGRESS, restarts=1
    )


def test_image_pull_stuck_past_the_grace_fails_the_job_naming_the_image() -> None:
    entry = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "apply", IN_PROGRESS)
    stuck = JobFacts(
        name="j1", outcome="running", pull_stuck_since=NOW - 50, pull_image="ghcr.io/x/driver:1"
    )
    early = step_package(PLAIN, entry, stuck, now=NOW, pull_grace_seconds=120)
    assert early.entry == entry and not early.fail_job
    late = step_package(PLAIN, entry, stuck, now=NOW + 80, pull_grace_seconds=120)
    assert late.fail_job
    assert late.entry is not None and late.entry.state == ERRORING
    assert "ghcr.io/x/driver:1" in late.entry.message
    # The Job's own Failed condition (DeadlineExceeded) keeps the image in the message.
    failed = JobFacts(name="j1", outcome="failed", reason="DeadlineExceeded")
    final = step_package(PLAIN, late.entry, failed, now=NOW + 90, pull_grace_seconds=120)
    assert final.entry is not None and "ghcr.io/x/driver:1" in final.entry.message


def test_node_state_round_trips_and_unreadable_state_is_flagged() -> None:
    entries = {
        "driver": PackageState("driver", "1.0.0", "img", "config", COMPLETE, restarts=2),
        "kernel": PackageState("kernel", "2.0.0", "img2", "interrupt", IN_PROGRESS),
    }
    parsed, readable = parse_node_state(render_node_state(entries))
    assert readable and parsed == entries
    assert parse_node_state("{not json") == ({}, False)
    assert parse_node_state('{"driver|1": {"name": "driver"}}') == ({}, False)
    assert parse_node_state(None) == ({}, True)


@settings(max_examples=300, deadline=None)
@given(
    interrupt=st.booleans(),
    outcomes=st.lists(st.sampled_from(["complete", "failed", "running", "missing"]), max_size=20),
)
def test_a_stage_never_advances_without_its_job_complete(
    interrupt: bool, outcomes: list[str]
) -> None:
    package = REBOOTING if interrupt else PLAIN
    entry: PackageState | None = None
    order = ["apply", "config", "interrupt", "post-interrupt"] if interrupt else ["apply", "config"]
    for seen in outcomes:
        job = None if seen == "missing" else JobFacts(name="j", outcome=seen)  # type: ignore[arg-type]
        if entry is None:
            job = None
        outcome = step_package(package, entry, job, now=NOW, pull_grace_seconds=120)
        new = outcome.entry
        assert new is not None
        if entry is not None and new.stage != entry.stage:
            assert job is not None and job.outcome == "complete"
            assert order.index(new.stage) == order.index(entry.stage) + 1
        if new.state == ERRORING:
            assert not outcome.run_job
        entry = new
