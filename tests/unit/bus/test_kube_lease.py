"""Rule (issue #35): each leader's NATS lease is mirrored into a `coordination.k8s.io/v1`
Lease named after it (nodeflow_bus.kube_lease.lease_commands, pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from k8s_watcher.policy import Allowed, authorize
from nodeflow_bus.kube_lease import (
    KubeLeaseTarget,
    LeaseEvent,
    lease_commands,
    lease_duration_seconds,
    micro_time,
)
from nodeflow_contracts.k8s import CreateObject, PatchObject
from nodeflow_contracts.permissions import SERVICES, lease_names

TARGET = KubeLeaseTarget(sender="maintenance-scheduler", namespace="nodeflow-system")
NOW = 1_795_000_000.25


def test_lease_mirror_acquisition_creates_then_names_the_holder_with_the_nats_ttl() -> None:
    create, take = lease_commands(
        "acquired",
        name="maintenance-scheduler-skyhook",
        target=TARGET,
        holder="pod-a-1-ab",
        ttl=15.0,
        now=NOW,
    )
    assert isinstance(create.operation, CreateObject)
    lease = create.operation.object
    assert (lease["apiVersion"], lease["kind"]) == ("coordination.k8s.io/v1", "Lease")
    assert lease["metadata"]["name"] == "maintenance-scheduler-skyhook"
    assert lease["metadata"]["namespace"] == "nodeflow-system"
    spec = lease["spec"]
    assert spec == {
        "holderIdentity": "pod-a-1-ab",
        "leaseDurationSeconds": 15,
        "acquireTime": micro_time(NOW),
        "renewTime": micro_time(NOW),
    }
    assert isinstance(take.operation, PatchObject)
    assert take.operation.patch == {"spec": spec}
    for cmd in (create, take):
        assert cmd.sender == "maintenance-scheduler"
        assert cmd.subject.startswith("cmd.k8s.v1.maintenance-scheduler.")
        assert cmd.target.namespace == "nodeflow-system"
        assert cmd.target.name == "maintenance-scheduler-skyhook"
        assert cmd.expires_at == NOW + 15.0
    assert create.idempotency_key != take.idempotency_key
    # The patch follows the create on the same per-object queue.
    assert create.target.ordering_key == take.target.ordering_key


def test_lease_mirror_renewal_and_release_only_while_this_replica_holds_it() -> None:
    (renew,) = lease_commands(
        "renewed", name="topology-placer", target=TARGET, holder="me", ttl=15.0, now=NOW
    )
    (release,) = lease_commands(
        "released", name="topology-placer", target=TARGET, holder="me", ttl=15.0, now=NOW
    )
    for cmd in (renew, release):
        assert isinstance(cmd.operation, PatchObject)
        assert cmd.operation.patch_type == "json"
        # A late write of a replica that lost the lead fails its test, never overwrites.
        assert cmd.operation.patch[0] == {
            "op": "test",
            "path": "/spec/holderIdentity",
            "value": "me",
        }
    assert renew.operation.patch[1:] == [  # type: ignore[union-attr]
        {"op": "replace", "path": "/spec/renewTime", "value": micro_time(NOW)}
    ]
    assert {"op": "replace", "path": "/spec/holderIdentity", "value": ""} in (
        release.operation.patch  # type: ignore[union-attr]
    )


def test_lease_mirror_duration_and_time_formats() -> None:
    assert lease_duration_seconds(15.0) == 15
    assert lease_duration_seconds(0.4) == 1
    assert lease_duration_seconds(2.5) == 3
    assert micro_time(0.5) == "1970-01-01T00:00:00.500000Z"


@given(
    sender=st.sampled_from([s for s in SERVICES if lease_names(s)]),
    name=st.one_of(
        st.sampled_from([n for s in SERVICES for n in lease_names(s)]),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=30),
    ),
    holder=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40),
    ttl=st.floats(min_value=0.1, max_value=120.0),
    event=st.sampled_from(["acquired", "renewed", "released"]),
)
def test_lease_mirror_property_a_sender_writes_only_its_own_leases_and_never_a_successors(
    sender: str, name: str, holder: str, ttl: float, event: LeaseEvent
) -> None:
    """Whatever the names: k8s-watcher allows a Lease command exactly when the Lease is named
    after one of the sender's own NATS leases; every write but the acquisition first tests
    that this replica still holds it (a late write never overwrites a successor), and each
    carries a deadline no later than the TTL."""
    target = KubeLeaseTarget(sender=sender)
    for cmd in lease_commands(event, name=name, target=target, holder=holder, ttl=ttl, now=NOW):
        allowed = isinstance(authorize(cmd, cmd.subject), Allowed)
        assert allowed == (name in lease_names(sender))
        assert cmd.expires_at is not None and NOW < cmd.expires_at <= NOW + ttl
        if event != "acquired":
            assert isinstance(cmd.operation, PatchObject)
            assert cmd.operation.patch[0] == {
                "op": "test",
                "path": "/spec/holderIdentity",
                "value": holder,
            }
