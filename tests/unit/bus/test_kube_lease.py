"""Rule (issue #35): each leader's NATS lease is mirrored into a `coordination.k8s.io/v1`
Lease named after it (nodeflow_bus.kube_lease.lease_commands, pure)."""

from __future__ import annotations

from nodeflow_bus.kube_lease import (
    KubeLeaseTarget,
    lease_commands,
    lease_duration_seconds,
    micro_time,
)
from nodeflow_contracts.k8s import CreateObject, PatchObject

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
