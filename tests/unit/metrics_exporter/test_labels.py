"""Label values taken from messages stay in bounded sets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrics_exporter.labels import (
    OTHER,
    LabelLimiter,
    RecentIds,
    command_op_of_subject,
    dead_letter_error_kind,
    decision_source,
    machine_kind,
    machine_reason,
    subject_family,
)
from nodeflow_contracts import subjects


@pytest.mark.parametrize(
    ("subject", "family"),
    [
        ("cmd.k8s.v1.nodeset-controller.delete", "cmd.k8s.v1.delete"),
        ("cmd.k8s.v1.nodeset-controller.update-status", "cmd.k8s.v1.update-status"),
        ("cmd.k8s.v1.nodeset-controller.launch-missiles", "cmd.k8s.v1.other"),
        ("outcome.k8s.v1.evict", "outcome.k8s.v1.evict"),
        (subjects.k8s_object_event("Pod", "default", "worker-0"), "k8s.v1.pod"),
        (subjects.k8s_object_event("Node", None, "gpu-17"), "k8s.v1.node"),
        ("k8s.v1.secret.default.db", "k8s.v1.other"),
        (subjects.slurm_command("prod", "drain"), "cmd.slurm.v1.drain"),
        (subjects.slurm_node_event("prod", "gpu-1"), "slurm.v1.node"),
        (subjects.slurm_poll_event("prod"), "slurm.v1.poll"),
        (subjects.nodeset_decision("team-a", "gpus"), "nodeset.v1"),
        ("maintenance.v1.ns.x.decision", "maintenance.v1"),
        ("worker-0.default", OTHER),
        ("", OTHER),
    ],
)
def test_subject_family_keeps_only_fixed_tokens_and_closed_vocabularies(
    subject: str, family: str
) -> None:
    assert subject_family(subject) == family


@given(st.text(alphabet="abcdefghij-.", min_size=1, max_size=20))
def test_subject_family_never_carries_a_name_from_the_subject(name: str) -> None:
    token = subjects.token(name)
    for subject in (
        f"k8s.v1.pod.default.{token}",
        f"slurm.v1.{token}.node.{token}",
        f"cmd.slurm.v1.{token}.drain",
        f"nodeset.v1.{token}.{token}.decision",
    ):
        family = subject_family(subject)
        assert family.count(".") <= 3
        assert family in {"k8s.v1.pod", "slurm.v1.node", "cmd.slurm.v1.drain", "nodeset.v1"}


def test_command_op_is_read_from_the_command_subject() -> None:
    assert command_op_of_subject(subjects.k8s_command("topology-placer", "bind")) == "bind"
    assert command_op_of_subject("cmd.k8s.v1.slurm-syncer.unknown-op") == OTHER
    assert command_op_of_subject("cmd.k8s.v1.slurm-syncer.delete.extra") == OTHER


def test_machine_reason_accepts_condition_reasons_and_refuses_free_text() -> None:
    assert machine_reason("ScalingDeleteScheduled") == "ScalingDeleteScheduled"
    assert machine_reason("rank 2: idle, drained") == OTHER
    assert machine_reason("") == OTHER
    assert machine_reason("A" * 65) == OTHER
    assert machine_kind("delete-scheduled") == "delete-scheduled"
    assert machine_kind("Delete Pod worker-0") == OTHER


def test_dead_letter_error_kind_is_bounded() -> None:
    assert dead_letter_error_kind("decode") == "decode"
    assert dead_letter_error_kind("max_deliveries") == "max_deliveries"
    assert dead_letter_error_kind("whatever") == OTHER
    assert dead_letter_error_kind(None) == OTHER


def test_decision_source_is_the_subject_root() -> None:
    assert decision_source("placement.v1.x") == "placement"
    assert decision_source("cmd.k8s.v1.x") == OTHER


def test_label_limiter_keeps_the_first_values_and_folds_the_rest_into_other() -> None:
    limiter = LabelLimiter(2)
    assert limiter.admit("A") == "A"
    assert limiter.admit("B") == "B"
    assert limiter.admit("C") == OTHER
    assert limiter.admit("A") == "A"
    assert len(limiter) == 2
    with pytest.raises(ValueError):
        LabelLimiter(0)


def test_recent_ids_forget_the_oldest_beyond_capacity() -> None:
    recent = RecentIds(2)
    assert not recent.seen_before("a")
    assert recent.seen_before("a")
    assert not recent.seen_before("b")
    assert not recent.seen_before("c")
    assert len(recent) == 2
    assert not recent.seen_before("a")
