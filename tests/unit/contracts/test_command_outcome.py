"""What a command's outcome says of its change: whether it can still be made."""

from __future__ import annotations

import pytest

from nodeflow_contracts.k8s import CommandOutcome, ObjectRef, Outcome


@pytest.mark.parametrize(
    ("outcome", "attempt", "never_lands"),
    [
        ("conflict", 1, True),
        ("not-found", 2, True),
        ("invalid", 1, True),
        ("forbidden", 1, True),
        ("expired", 1, True),  # never sent
        ("expired", 2, False),  # after an attempt that may have been applied
        ("failed", 3, False),  # the last request went unanswered
        ("applied", 1, False),
        ("retrying", 1, False),
    ],
)
def test_rule_an_outcome_says_the_change_can_never_be_made_only_when_it_is_sure(
    outcome: Outcome, attempt: int, never_lands: bool
) -> None:
    report = CommandOutcome(
        idempotency_key="k",
        op="update-status",
        sender="maintenance-scheduler",
        target=ObjectRef(api_version="v1", kind="Node", name="n"),
        outcome=outcome,
        attempt=attempt,
        sent_at=1.0,
        finished_at=2.0,
    )
    assert report.never_lands is never_lands
