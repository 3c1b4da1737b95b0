"""The stage machine's smaller rules, each one a slip mutation testing found no test noticed
(issue 37: `make mutate MODULES=services/maintenance_scheduler/skyhook/stages.py`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from maintenance_scheduler.skyhook import stages
from maintenance_scheduler.skyhook.api import EnvVar, Interrupt, Package
from maintenance_scheduler.skyhook.stages import (
    COMPLETE,
    ERRORING,
    IN_PROGRESS,
    JobFacts,
    PackageState,
    StepOutcome,
    config_hash,
    config_key_digests,
    effective_interrupt,
    is_downgrade,
    merge_interrupt_list,
    next_stage,
    parse_node_state,
    render_node_state,
    stages_of,
    step_package,
)

PLAIN = Package(name="driver", version="1.0.0", image="ghcr.io/x/driver")
REBOOTING = Package(
    name="kernel", version="2.0.0", image="ghcr.io/x/kernel", interrupt=Interrupt("reboot")
)
NOW = 1_000.0


def test_a_package_s_stages_start_at_apply_and_its_own_interrupt_decides_the_rest() -> None:
    assert stages_of(PLAIN) == ("apply", "config")
    assert stages_of(REBOOTING) == ("apply", "config", "interrupt", "post-interrupt")
    assert stages_of(REBOOTING, upgrading=True)[0] == "upgrade"
    # An explicit answer overrides the package's own interrupt either way.
    assert stages_of(REBOOTING, interrupts=False) == ("apply", "config")
    assert stages_of(PLAIN, interrupts=True)[2:] == ("interrupt", "post-interrupt")


def test_merged_interrupt_a_reboot_wins_whatever_its_owner_s_name() -> None:
    due = [("a", Interrupt("service", ("x",))), ("z", Interrupt("reboot"))]
    assert merge_interrupt_list(due) == ("z", Interrupt("reboot"))


def test_merged_interrupt_restart_all_services_covers_a_service_and_a_service_a_noop() -> None:
    restart_all = Interrupt("restartAllServices")
    service = Interrupt("service", ("kubelet",))
    noop = Interrupt("noop")
    # The winner is owned by its own package, whichever name sorts first.
    assert merge_interrupt_list([("a", service), ("b", restart_all)]) == ("b", restart_all)
    assert merge_interrupt_list([("a", restart_all), ("b", service)]) == ("a", restart_all)
    assert merge_interrupt_list([("a", noop), ("b", service)]) == ("b", service)
    assert merge_interrupt_list([("a", service), ("b", noop)]) == ("a", service)
    assert merge_interrupt_list([("a", noop), ("b", restart_all)]) == ("b", restart_all)


def test_rule_merged_interrupt_services_keep_declared_order_then_append_new_ones() -> None:
    # upstream's mergeInterrupt: an ordered union under the first owner, never sorted.
    due = [
        ("b", Interrupt("service", ("sshd", "kubelet"))),
        ("a", Interrupt("service", ("kubelet", "containerd"))),
    ]
    assert merge_interrupt_list(due) == (
        "a",
        Interrupt("service", ("kubelet", "containerd", "sshd")),
    )
    three = [
        ("a", Interrupt("service", ("z", "y"))),
        ("b", Interrupt("service", ("x", "z"))),
        ("c", Interrupt("service", ("w", "y"))),
    ]
    assert merge_interrupt_list(three) == ("a", Interrupt("service", ("z", "y", "x", "w")))
    # Two noops are one noop, owned by the first.
    assert merge_interrupt_list([("b", Interrupt("noop")), ("a", Interrupt("noop"))]) == (
        "a",
        Interrupt("noop"),
    )


def test_merged_interrupt_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="no interrupt"):
        merge_interrupt_list([])


def test_node_state_writes_the_optional_fields_only_when_set_and_reads_every_one_back() -> None:
    bare = PackageState("driver", "1.0.0", "img", "apply", IN_PROGRESS)
    assert json.loads(render_node_state({"driver": bare})) == {
        "driver|1.0.0": {
            "name": "driver",
            "version": "1.0.0",
            "image": "img",
            "stage": "apply",
            "state": IN_PROGRESS,
            "restarts": 0,
            # Always: what the controller wrote (stages.rerun_by_hand).
            "writtenAs": "apply/in_progress",
        }
    }
    full = PackageState(
        "kernel",
        "2.0.0",
        "img2",
        "config",
        ERRORING,
        restarts=3,
        message="config Job j failed: OOMKilled",
        run="r1",
        config="c1",
        config_keys=(("a.conf", "0123abcd"), ("b.conf", "4567ef01")),
        rerun="config",
        interrupt_keys=("a.conf",),
    )
    raw = render_node_state({"kernel": full, "driver": bare})
    assert json.loads(raw)["kernel|2.0.0"] == {
        "name": "kernel",
        "version": "2.0.0",
        "image": "img2",
        "stage": "config",
        "state": ERRORING,
        "restarts": 3,
        "message": "config Job j failed: OOMKilled",
        "run": "r1",
        "config": "c1",
        "configKeys": {"a.conf": "0123abcd", "b.conf": "4567ef01"},
        "rerun": "config",
        "interruptKeys": ["a.conf"],
        "writtenAs": "config/erroring",
    }
    assert parse_node_state(raw) == ({"kernel": full, "driver": bare}, True)
    assert full.as_json == full.to_json()


def test_node_state_fields_of_the_wrong_type_read_as_unset() -> None:
    raw = json.dumps(
        {
            "driver|1.0.0": {
                "name": "driver",
                "version": "1.0.0",
                "stage": "config",
                "state": IN_PROGRESS,
                "restarts": "two",
                "configKeys": ["a.conf"],
                "interruptKeys": {"a.conf": 1},
            }
        }
    )
    assert parse_node_state(raw) == (
        {"driver": PackageState("driver", "1.0.0", "", "config", IN_PROGRESS)},
        True,
    )


def test_node_state_an_entry_missing_a_required_field_makes_the_whole_annotation_unreadable() -> (
    None
):
    good = {"name": "driver", "version": "1.0.0", "stage": "apply", "state": IN_PROGRESS}
    for field in ("name", "version", "stage", "state"):
        for bad in ("", None, 7):
            broken = {**good, field: bad}
            raw = json.dumps({"driver|1.0.0": good, "other|1": broken})
            assert parse_node_state(raw) == ({}, False), (field, bad)
    assert parse_node_state(json.dumps({"driver|1.0.0": good, "x": "text"})) == ({}, False)
    assert parse_node_state(json.dumps([good])) == ({}, False)
    assert parse_node_state("") == ({}, True)
    # Read twice (the second time from the memo), the answer is the same.
    raw = json.dumps({"driver|1.0.0": good})
    assert parse_node_state(raw) == parse_node_state(raw)
    # Every optional field missing: its default (no restarts yet).
    assert parse_node_state(raw)[0]["driver"] == PackageState(
        "driver", "1.0.0", "", "apply", IN_PROGRESS
    )


def test_config_hash_of_plain_env_is_the_name_value_pair_form_so_an_upgrade_reruns_nothing() -> (
    None
):
    package = replace(
        PLAIN,
        config_map=(("a.conf", "1"),),
        env=(EnvVar("MODE", "fast"),),
    )
    text = json.dumps([[["a.conf", "1"]], [["MODE", "fast"]]], separators=(",", ":"))
    assert config_hash(package) == hashlib.sha256(text.encode()).hexdigest()[:16]
    from_secret = replace(package, env=(EnvVar("MODE", "", '{"secretKeyRef":{}}'),))
    assert config_hash(from_secret) != config_hash(replace(package, env=(EnvVar("MODE"),)))


def test_a_downgrade_is_a_lower_semantic_version() -> None:
    assert is_downgrade("1.2.0", "1.1.9")
    assert not is_downgrade("1.1.9", "1.2.0")
    assert not is_downgrade("1.2.0", "1.2.0")
    # Each of major, minor and patch counts, as numbers, in that order.
    assert is_downgrade("2.1.3", "1.2.3")
    assert is_downgrade("1.3.1", "1.2.3")
    assert is_downgrade("1.2.4", "1.2.3")
    assert is_downgrade("10.0.0", "9.0.0")
    # `1.2` is `1.2.0`; a leading v and build metadata change nothing.
    assert not is_downgrade("1.2.0", "1.2") and not is_downgrade("1.2", "1.2.0")
    assert not is_downgrade("v1.2.3", "1.2.3") and not is_downgrade("1.2.3", "v1.2.3+build.7")


def test_a_pre_release_comes_before_its_release_in_semantic_version_order() -> None:
    assert is_downgrade("1.0.0", "1.0.0-rc.1")
    assert not is_downgrade("1.0.0-rc.1", "1.0.0")
    # Numeric identifiers compare as numbers and before alphanumeric ones.
    assert is_downgrade("1.0.0-rc.10", "1.0.0-rc.2")
    assert is_downgrade("1.0.0-alpha", "1.0.0-1")
    assert not is_downgrade("1.0.0-1", "1.0.0-alpha")


def test_config_key_digests_cover_the_keys_with_a_config_interrupt_only() -> None:
    package = replace(
        PLAIN,
        config_map=(("a.conf", "1"), ("b.conf", "2")),
        config_interrupts=(("a.conf", Interrupt("reboot")), ("gone.conf", Interrupt("noop"))),
    )
    assert config_key_digests(package) == (
        ("a.conf", hashlib.sha256(b"1").hexdigest()[:8]),
        ("gone.conf", hashlib.sha256(b"").hexdigest()[:8]),
    )


def test_a_config_rerun_interrupts_only_for_the_changed_keys_config_interrupts() -> None:
    package = replace(
        REBOOTING,
        config_interrupts=(
            ("a.conf", Interrupt("service", ("kubelet",))),
            ("b.conf", Interrupt("noop")),
        ),
    )
    first_run = PackageState("kernel", "2.0.0", "img", "config", IN_PROGRESS)
    assert effective_interrupt(package, first_run) == Interrupt("reboot")
    rerun = replace(first_run, rerun="config", interrupt_keys=("a.conf",))
    assert effective_interrupt(package, rerun) == Interrupt("service", ("kubelet",))
    assert effective_interrupt(package, replace(rerun, interrupt_keys=("c.conf",))) is None
    # Without an interrupt the re-run ends at config.
    assert next_stage(package, replace(rerun, interrupt_keys=())) is None
    assert next_stage(package, rerun) == "interrupt"


def test_next_stage_of_the_last_or_a_foreign_stage_is_none() -> None:
    entry = PackageState("kernel", "2.0.0", "img", "post-interrupt", IN_PROGRESS)
    assert next_stage(REBOOTING, entry) is None
    assert next_stage(REBOOTING, replace(entry, stage="uninstall")) is None
    assert next_stage(REBOOTING, replace(entry, stage="upgrade")) == "config"
    assert next_stage(PLAIN, replace(entry, stage="config")) is None


def step(
    package: Package | None, entry: PackageState | None, job: JobFacts | None = None, **kw: str
) -> StepOutcome:
    return step_package(package, entry, job, now=NOW, pull_grace_seconds=120, **kw)


DONE = JobFacts(name="j", outcome="complete")


def test_a_downgrade_uninstalls_the_installed_version_then_applies_the_wanted_one() -> None:
    installed = PackageState("driver", "2.0.0", "img", "config", COMPLETE, message="old")
    first = step(PLAIN, installed, None, run="r2", config="c2")
    assert first == StepOutcome(
        replace(installed, stage="uninstall", state=IN_PROGRESS, message=""),
        run_job=True,
        event="downgrade to 1.0.0: uninstall 2.0.0",
    )
    assert first.entry is not None
    running = step(PLAIN, first.entry, JobFacts(name="j", outcome="running"))
    assert running.entry == first.entry and not running.run_job
    # Its uninstall Job missing (not created yet, or deleted): it is created.
    assert step(PLAIN, first.entry, None) == StepOutcome(first.entry, run_job=True)
    after = step(PLAIN, first.entry, DONE, run="r2", config="c2")
    assert after.event == "uninstalled: started" and after.run_job
    # Afresh: apply, not upgrade, at the wanted version with the new run.
    assert after.entry == PackageState(
        "driver",
        "1.0.0",
        "ghcr.io/x/driver",
        "apply",
        IN_PROGRESS,
        run="r2",
        config="c2",
    )


def test_an_upgrade_starts_at_upgrade_with_the_new_run_and_config() -> None:
    installed = PackageState("driver", "0.9.0", "img", "config", COMPLETE, run="r1")
    outcome = step(PLAIN, installed, None, run="r2", config="c2")
    assert outcome == StepOutcome(
        PackageState(
            "driver", "1.0.0", "ghcr.io/x/driver", "upgrade", IN_PROGRESS, run="r2", config="c2"
        ),
        run_job=True,
        event="started",
    )


def test_a_complete_package_stays_complete_without_a_job_unless_its_config_changed() -> None:
    complete = PackageState("driver", "1.0.0", "img", "config", COMPLETE, config="c1")
    assert step(PLAIN, complete, None, config="c1") == StepOutcome(complete)
    # No config to compare (""), or an entry written before the config hash: nothing re-runs.
    assert step(PLAIN, complete, None, config="") == StepOutcome(complete)
    older = replace(complete, config="")
    assert step(PLAIN, older, None, config="c2") == StepOutcome(older)
    changed = step(PLAIN, complete, None, config="c2")
    assert changed.run_job and changed.event == "config changed"
    assert changed.entry is not None
    assert (changed.entry.stage, changed.entry.state, changed.entry.config) == (
        "config",
        IN_PROGRESS,
        "c2",
    )
    assert changed.entry.rerun == "config"


def test_a_config_change_before_config_ran_reruns_the_stage_under_way() -> None:
    for stage in ("apply", "upgrade"):
        entry = PackageState("driver", "1.0.0", "img", stage, ERRORING, message="x", config="c1")
        outcome = step(PLAIN, entry, None, config="c2")
        assert outcome.entry == replace(entry, state=IN_PROGRESS, message="", config="c2")
    # A first run past config runs config again and keeps its own interrupt due.
    entry = PackageState("kernel", "2.0.0", "img", "interrupt", IN_PROGRESS, config="c1")
    outcome = step(REBOOTING, entry, None, config="c2")
    assert outcome.entry == replace(entry, stage="config", config="c2")
    assert outcome.entry is not None and effective_interrupt(REBOOTING, outcome.entry) == (
        Interrupt("reboot")
    )


def test_a_config_rerun_interrupts_for_the_keys_changed_since_the_last_complete_run() -> None:
    package = replace(
        PLAIN,
        config_map=(("a.conf", "1"), ("b.conf", "1")),
        config_interrupts=(("a.conf", Interrupt("noop")), ("b.conf", Interrupt("reboot"))),
    )
    complete = PackageState(
        "driver",
        "1.0.0",
        "img",
        "config",
        COMPLETE,
        config="c1",
        config_keys=config_key_digests(package),
    )
    edited = replace(package, config_map=(("a.conf", "2"), ("b.conf", "1")))
    first = step(edited, complete, None, config="c2")
    assert first.entry is not None
    assert (first.entry.rerun, first.entry.interrupt_keys) == ("config", ("a.conf",))
    assert first.entry.config_keys == config_key_digests(edited)
    # Edited again before the re-run completed: the keys accumulate.
    again = replace(edited, config_map=(("a.conf", "2"), ("b.conf", "2")))
    second = step(again, first.entry, None, config="c3")
    assert second.entry is not None
    assert second.entry.interrupt_keys == ("a.conf", "b.conf")
    # Once complete, the next edit counts only its own keys.
    done = replace(second.entry, state=COMPLETE)
    back = replace(again, config_map=(("a.conf", "2"), ("b.conf", "3")))
    third = step(back, done, None, config="c4")
    assert third.entry is not None and third.entry.interrupt_keys == ("b.conf",)


def test_a_stage_whose_job_is_missing_runs_it_and_only_a_failed_one_counts_a_restart() -> None:
    entry = PackageState("driver", "1.0.0", "img", "config", IN_PROGRESS, restarts=1)
    assert step(PLAIN, entry) == StepOutcome(entry, run_job=True)
    erroring = replace(entry, state=ERRORING, message="boom")
    assert step(PLAIN, erroring) == StepOutcome(
        replace(entry, restarts=2), run_job=True, event="retry"
    )


def test_a_failed_job_s_message_names_stage_job_reason_and_its_message_and_is_told_once() -> None:
    entry = PackageState("driver", "1.0.0", "img", "config", IN_PROGRESS)
    failed = JobFacts(name="j1", outcome="failed", reason="BackoffLimitExceeded", message="m")
    outcome = step(PLAIN, entry, failed)
    assert outcome == StepOutcome(
        replace(entry, state=ERRORING, message="config Job j1 failed: BackoffLimitExceeded: m"),
        event="config failed: BackoffLimitExceeded",
    )
    assert outcome.entry is not None
    again = step(PLAIN, outcome.entry, failed)
    assert again == StepOutcome(outcome.entry)
    # An erroring entry without a message takes the Job's.
    bare = step(PLAIN, replace(entry, state=ERRORING), replace(failed, message=""))
    assert bare == StepOutcome(
        replace(entry, state=ERRORING, message="config Job j1 failed: BackoffLimitExceeded")
    )


def test_a_failed_job_s_message_is_read_again_when_its_pods_tell_more_but_ours_is_kept() -> None:
    entry = PackageState("driver", "1.0.0", "img", "apply", IN_PROGRESS)
    # The Job's Failed condition was mirrored before its OOM-killed pod.
    early = JobFacts(name="j1", outcome="failed", reason="BackoffLimitExceeded")
    first = step(PLAIN, entry, early).entry
    assert first is not None and first.message == "apply Job j1 failed: BackoffLimitExceeded"
    later = step(PLAIN, first, replace(early, reason="OOMKilled"))
    assert later == StepOutcome(replace(first, message="apply Job j1 failed: OOMKilled"))
    # A message the controller wrote when it failed the Job itself (the image) stays when
    # the Job's own Failed condition (its deadline) follows.
    ours = replace(first, message="image img:1 could not be pulled for 120s (apply Job j1 failed)")
    deadline = replace(early, reason="DeadlineExceeded")
    assert step(PLAIN, ours, deadline) == StepOutcome(ours)


def test_an_image_pull_fails_the_job_at_the_grace_exactly_and_never_twice() -> None:
    entry = PackageState("driver", "1.0.0", "img", "apply", IN_PROGRESS)
    stuck = JobFacts(name="j1", outcome="running", pull_stuck_since=NOW - 120.5, pull_image="img:1")
    outcome = step(PLAIN, entry, stuck)
    assert outcome == StepOutcome(
        replace(
            entry,
            state=ERRORING,
            message="image img:1 could not be pulled for 120s (apply Job j1 failed)",
        ),
        fail_job=True,
        event="apply failed: image img:1 not pullable",
    )
    at_grace = replace(stuck, pull_stuck_since=NOW - 120)
    assert step(PLAIN, entry, at_grace).fail_job
    assert not step(PLAIN, entry, replace(stuck, pull_stuck_since=NOW - 119)).fail_job
    # Failed by us, the Job still running until its own Failed condition: nothing more.
    assert outcome.entry is not None
    assert step(PLAIN, outcome.entry, stuck) == StepOutcome(outcome.entry)


def test_only_the_post_interrupt_stage_completing_releases_the_maintenance_request() -> None:
    config = PackageState("driver", "1.0.0", "img", "config", IN_PROGRESS, message="x")
    outcome = step(PLAIN, config, DONE)
    assert outcome == StepOutcome(
        replace(config, state=COMPLETE, message=""), event="config complete"
    )
    interrupt = PackageState("kernel", "2.0.0", "img", "interrupt", IN_PROGRESS, message="x")
    outcome = step(REBOOTING, interrupt, DONE)
    assert outcome == StepOutcome(
        replace(interrupt, stage="post-interrupt", message=""),
        run_job=True,
        event="interrupt complete",
    )


def test_a_removed_package_s_uninstall_follows_its_job_and_nothing_is_left_without_entry() -> None:
    assert step(None, None) == StepOutcome(None)
    entry = PackageState("driver", "1.0.0", "img", "uninstall", IN_PROGRESS)
    failed = JobFacts(name="j1", outcome="failed", reason="DeadlineExceeded")
    outcome = step(None, entry, failed)
    assert outcome.entry is not None and outcome.entry.state == ERRORING
    assert step(None, entry, DONE) == StepOutcome(None, event="uninstalled")
    assert step(None, entry, None) == StepOutcome(entry, run_job=True)


def test_the_node_state_memo_is_bounded_however_many_annotations_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stages, "_PARSED", {})
    monkeypatch.setattr(stages, "_PARSED_LIMIT", 2)
    for version in range(10):
        entry = PackageState("driver", f"1.0.{version}", "img", "apply", IN_PROGRESS)
        raw = render_node_state({"driver": entry})
        assert parse_node_state(raw) == ({"driver": entry}, True)
        assert len(stages._PARSED) <= 2


def test_a_failed_job_s_message_replaces_a_message_the_entry_carried_while_not_erroring() -> None:
    # A package whose interrupt was merged into another's, then removed from the Skyhook.
    entry = PackageState(
        "driver", "1.0.0", "img", "uninstall", IN_PROGRESS, message="interrupt merged into kernel"
    )
    failed = JobFacts(name="j1", outcome="failed", reason="DeadlineExceeded")
    outcome = step(None, entry, failed)
    assert outcome.entry is not None
    assert outcome.entry.message == "uninstall Job j1 failed: DeadlineExceeded"


def test_rule_a_marker_of_the_live_entrys_version_yields_to_the_live_entry() -> None:
    """A retained marker (`name|version`) of the version the package is live at again: the
    rendered node state holds the live entry under that key, never the marker."""
    live = stages.PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", "in_progress")
    marker = replace(live, stage="config", state="complete", retained=True)
    for entries in ({"driver": live, marker.key: marker}, {marker.key: marker, "driver": live}):
        rendered = json.loads(stages.render_node_state(entries))
        assert list(rendered) == ["driver|1.0.0"]
        assert rendered["driver|1.0.0"]["state"] == "in_progress"
        assert "retained" not in rendered["driver|1.0.0"]
