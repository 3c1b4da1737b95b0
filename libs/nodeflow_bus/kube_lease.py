"""A `coordination.k8s.io/v1` Lease that mirrors each leader's NATS lease, so that
`kubectl get leases -n nodeflow-system` shows which replica leads each controller.

The NATS KV lease (lease.py) alone decides who leads; the Kubernetes Lease is written after
the fact and never read back. Each service sends it through k8s-watcher like any other write
(`cmd.k8s.v1.<service>.create|patch`, allowed for the Leases named after the service's own
NATS leases only: `nodeflow_contracts.permissions.lease_names`). k8s-watcher mirrors its own
leadership the same way, through its own executor: one code path writes every Lease, and
every write is an audited command with an outcome.

- On taking the lead: create the Lease (a conflict means it exists), then a merge patch that
  names this replica (`holderIdentity` = the instance id, `acquireTime`, `renewTime`,
  `leaseDurationSeconds` = the NATS lease TTL).
- While leading, every TTL/3 (as the NATS lease renews): a JSON patch of `renewTime` that
  first tests `holderIdentity` is still this replica, so a late renewal of a replica that
  has lost the lead never overwrites its successor's.
- On a graceful stop: the same test, then `holderIdentity` emptied (as client-go releases).
  Losing the lead otherwise writes nothing: the next leader's acquisition overwrites it.

A write that fails is logged and left: the next renewal (or acquisition) writes it again,
and leadership never waits for the mirror.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

from nodeflow_contracts.k8s import (
    CreateObject,
    K8sCommand,
    ObjectRef,
    PatchObject,
    deadline_after,
)

if TYPE_CHECKING:
    from nodeflow_bus.connection import Bus
    from nodeflow_bus.lease import LeaderLease

log = structlog.get_logger("nodeflow_bus.kube_lease")

LEASE_API_VERSION = "coordination.k8s.io/v1"
# Where the services keep their own objects (k8s/base/namespace.yaml, the Helm release's).
DEFAULT_LEASE_NAMESPACE = "nodeflow-system"
MANAGED_BY = "nodeflow"

LeaseEvent = Literal["acquired", "renewed", "released"]


@dataclass(frozen=True, kw_only=True)
class KubeLeaseTarget:
    """Where a service mirrors its leases: `sender` is its NATS user (the commands' sender),
    `namespace` the namespace of its Leases."""

    sender: str
    namespace: str = DEFAULT_LEASE_NAMESPACE


def micro_time(epoch: float) -> str:
    """A Lease's MicroTime (`2026-11-28T03:04:05.123456Z`)."""
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_duration_seconds(ttl: float) -> int:
    """The NATS lease TTL in whole seconds (the field is an integer), never below one."""
    return max(1, math.ceil(ttl))


def lease_commands(
    event: LeaseEvent,
    *,
    name: str,
    target: KubeLeaseTarget,
    holder: str,
    ttl: float,
    now: float,
) -> list[K8sCommand]:
    """The commands that mirror one leadership event of the NATS lease `name` held by
    `holder` (pure: the clock is `now`)."""
    ref = ObjectRef(
        api_version=LEASE_API_VERSION, kind="Lease", name=name, namespace=target.namespace
    )
    stamp = micro_time(now)
    # Unique per event and holder; a publish retried after a lost ack reuses it.
    key_prefix = f"lease:{target.namespace}:{name}:{holder}:{event}:{now:.6f}"
    # A write older than the lease it mirrors says nothing true any more.
    expires_at = deadline_after(ttl, now=now)

    def command(op_key: str, operation: CreateObject | PatchObject, reason: str) -> K8sCommand:
        return K8sCommand(
            idempotency_key=f"{key_prefix}:{op_key}",
            sender=target.sender,
            sent_at=now,
            target=ref,
            operation=operation,
            reason=reason,
            expires_at=expires_at,
        )

    holder_is_me: dict[str, Any] = {"op": "test", "path": "/spec/holderIdentity", "value": holder}
    if event == "acquired":
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": lease_duration_seconds(ttl),
            "acquireTime": stamp,
            "renewTime": stamp,
        }
        lease = {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": target.namespace,
                "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
            },
            "spec": spec,
        }
        reason = f"{holder} leads {name} (NATS lease)"
        return [
            # AlreadyExists (the Lease of an earlier leader) ends as `conflict`: the patch
            # that follows, applied after it (same ordering key), names the new holder.
            command("create", CreateObject(object=lease), reason),
            command("take", PatchObject(patch_type="merge", patch={"spec": spec}), reason),
        ]
    if event == "renewed":
        renew = [holder_is_me, {"op": "replace", "path": "/spec/renewTime", "value": stamp}]
        return [
            command(
                "renew",
                PatchObject(patch_type="json", patch=renew),
                f"{holder} renewed {name}",
            )
        ]
    release = [
        holder_is_me,
        {"op": "replace", "path": "/spec/holderIdentity", "value": ""},
        {"op": "replace", "path": "/spec/renewTime", "value": stamp},
    ]
    return [
        command(
            "release",
            PatchObject(patch_type="json", patch=release),
            f"{holder} released {name}",
        )
    ]


class KubeLeaseMirror:
    """Mirrors one LeaderLease into its Kubernetes Lease (LeaderLease creates it when the
    bus names a `KubeLeaseTarget`); driven by the lease's leadership listener."""

    def __init__(self, bus: Bus, lease: LeaderLease, target: KubeLeaseTarget) -> None:
        self.bus = bus
        self.lease = lease
        self.target = target
        self._holding: asyncio.Task[None] | None = None

    async def on_leadership(self, leader: bool) -> None:
        if leader:
            if self._holding is None or self._holding.done():
                self._holding = asyncio.create_task(
                    self._hold(), name=f"kube lease {self.lease.name}"
                )
            return
        holding, self._holding = self._holding, None
        if holding is not None:
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await holding
        if self.lease.last_transition == "stopped":
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(self.lease.ttl / 3):
                    await self._send("released")

    async def _hold(self) -> None:
        await self._send("acquired")
        while True:
            await asyncio.sleep(self.lease.ttl / 3)
            if not self.lease.is_leader:
                return
            await self._send("renewed")

    async def _send(self, event: LeaseEvent) -> None:
        commands = lease_commands(
            event,
            name=self.lease.name,
            target=self.target,
            holder=self.lease.holder,
            ttl=self.lease.ttl,
            now=time.time(),
        )
        for cmd in commands:
            try:
                await self.bus.publish(cmd.subject, cmd, msg_id=cmd.idempotency_key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The mirror never holds leadership up: the next renewal writes it again.
                log.warning(
                    "kube_lease.send_failed",
                    lease=self.lease.name,
                    event=event,
                    error=f"{type(exc).__name__}: {exc}",
                )
                return
