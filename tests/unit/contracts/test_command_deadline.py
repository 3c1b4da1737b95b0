"""A command's deadline (`expires_at`): set with `deadline_after`, optional on the wire so that
commands sent before it existed still decode."""

from __future__ import annotations

import msgspec
import pytest

import nodeflow_contracts as c
from nodeflow_contracts import subjects


def command(expires_at: float | None) -> c.K8sCommand:
    return c.K8sCommand(
        idempotency_key="k",
        sender="slurm-syncer",
        sent_at=100.0,
        target=c.ObjectRef(api_version="v1", kind="Pod", name="p", namespace="slurm"),
        operation=c.DeleteObject(),
        expires_at=expires_at,
    )


def test_deadline_after_is_that_many_seconds_from_now() -> None:
    assert c.deadline_after(5.0, now=100.0) == 105.0
    with pytest.raises(ValueError, match="future"):
        c.deadline_after(0)


def test_a_command_expires_only_after_its_deadline() -> None:
    cmd = command(c.deadline_after(5.0, now=100.0))
    assert not cmd.expired(105.0)
    assert cmd.expired(105.001)
    assert not command(None).expired(1e12)


def test_a_command_without_a_deadline_still_decodes() -> None:
    payload = msgspec.json.encode(command(None))
    old = msgspec.json.decode(payload, type=dict)
    del old["expires_at"]
    decoded = c.decode(c.K8sCommand, msgspec.json.encode(old), subject="cmd.k8s.v1.x.delete")
    assert decoded.expires_at is None


def test_expired_is_a_final_outcome() -> None:
    assert "expired" in c.FINAL_OUTCOMES


def test_the_command_subject_names_its_sender_and_op() -> None:
    assert command(None).subject == "cmd.k8s.v1.slurm-syncer.delete"
    assert subjects.parse_k8s_command(command(None).subject) == ("slurm-syncer", "delete")
    assert subjects.parse_k8s_command("cmd.k8s.v1.delete") is None
