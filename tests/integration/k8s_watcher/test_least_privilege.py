"""Least privilege that holds: every service's NATS user against every Kubernetes operation it
must not perform, on a real nats-server with the generated authorization and a running
k8s-watcher against the emulator. Each attempt is refused by NATS (the publish never reaches
the stream) or by k8s-watcher's policy (outcome `forbidden`, dead letter); nothing changes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError

from clustersim.kube.errors import NotFound
from k8s_watcher.policy import Allowed, authorize
from nodeflow_bus import dead_letter
from nodeflow_bus.credentials import Secret
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import (
    BindPod,
    CommandOperation,
    CordonNode,
    CreateObject,
    DeleteObject,
    EvictPod,
    K8sCommand,
    NominatePod,
    ObjectRef,
    PatchObject,
    RecordEvent,
    UncordonNode,
    UpdateStatus,
    deadline_after,
)
from nodeflow_contracts.permissions import (
    ADMIN_USER,
    SERVICES,
    inbox_prefix,
    nats_publish_allow,
)
from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_contracts.topology import subject_matches
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.k8s_watcher.conftest import Harness, node, pod, wait_until

BUSY = ObjectRef(api_version="v1", kind="Pod", name="busy", namespace="default")
NODE = ObjectRef(api_version="v1", kind="Node", name="node-a")
NODESET = ObjectRef(
    api_version="nodeflow.dev/v1alpha1", kind="NodeSet", name="workers", namespace="default"
)


def new_pod(labelled: bool) -> dict[str, Any]:
    return pod("intruder", **({NODESET_LABEL: "workers"} if labelled else {}))


# Every kind of thing a command can do to the busy pod (no NodeSet label), its node or a NodeSet.
OPERATIONS: list[tuple[CommandOperation, ObjectRef]] = [
    (DeleteObject(), BUSY),
    (DeleteObject(propagation_policy="Background", grace_period_seconds=0), BUSY),
    (EvictPod(), BUSY),
    (CreateObject(object=new_pod(labelled=False)), BUSY),
    (CreateObject(object=new_pod(labelled=True)), BUSY),
    (PatchObject(patch_type="merge", patch={"metadata": {"labels": {"x": "y"}}}), BUSY),
    (
        PatchObject(
            patch_type="strategic",
            patch={"status": {"conditions": [{"type": "SlurmDelete", "status": "True"}]}},
            subresource="status",
        ),
        BUSY,
    ),
    (
        PatchObject(
            patch_type="strategic",
            patch={"status": {"conditions": [{"type": "SlurmNodeStateIdle", "status": "True"}]}},
            subresource="status",
        ),
        BUSY,
    ),
    (BindPod(node_name="node-a"), BUSY),
    (NominatePod(node_name="node-a"), BUSY),
    (CordonNode(), NODE),
    (UncordonNode(), NODE),
    (PatchObject(patch_type="merge", patch={"spec": {"taints": []}}), NODE),
    (
        PatchObject(
            patch_type="merge", patch={"metadata": {"annotations": {"nodeflow.dev/nodeset": "x"}}}
        ),
        NODE,
    ),
    (UpdateStatus(status={"replicas": 7}), NODESET),
    (RecordEvent(reason="Forged", message="m"), BUSY),
]


def as_command(sender: str, operation: CommandOperation, target: ObjectRef, n: int) -> K8sCommand:
    return K8sCommand(
        idempotency_key=f"attempt-{sender}-{n}-{time.time_ns()}",
        sender=sender,
        sent_at=time.time(),
        target=target,
        operation=operation,
        reason="least privilege test",
        expires_at=deadline_after(60),
    )


def must_not(sender: str, cmd: K8sCommand) -> bool:
    """Whether `sender` must not achieve `cmd` on these objects: its policy refuses it, or
    the object lacks the label the policy requires (the busy pod is no NodeSet pod)."""
    verdict = authorize(cmd, subjects.k8s_command(sender, cmd.op))
    return not isinstance(verdict, Allowed) or verdict.required_label is not None


class RawClient:
    """A plain NATS client as `user`, collecting the server's errors (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.client: Client | None = None

    async def connect(self, url: str, user: str, password: Secret) -> RawClient:
        async def on_error(error: Exception) -> None:
            self.errors.append(str(error))

        self.client = await nats.connect(
            url,
            inbox_prefix=inbox_prefix(user),
            user=user,
            password=password.reveal(),
            error_cb=on_error,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )
        return self

    async def publish(self, subject: str, cmd: K8sCommand) -> None:
        assert self.client is not None
        await self.client.publish(
            subject, msgspec.json.encode(cmd), headers={"Nats-Msg-Id": cmd.idempotency_key}
        )
        await self.client.flush(timeout=2)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def stored_commands(harness: Harness) -> int:
    info = await harness.bus.js.stream_info("K8S_COMMANDS")
    return int(info.state.last_seq)


async def refused_by_nats(client: RawClient) -> None:
    await wait_until(lambda: bool(client.errors), 5.0)
    assert "permissions violation" in client.errors.pop().lower()


async def reaches_the_stream(harness: Harness, stored_before: int) -> None:
    """Wait until a permitted publish is stored, so the next count starts after it."""
    deadline = time.monotonic() + 5.0
    while await stored_commands(harness) <= stored_before:
        assert time.monotonic() < deadline, "a permitted command never reached the stream"
        await asyncio.sleep(0.02)


def version_of(harness: Harness, resource: str, name: str, namespace: str | None) -> str | None:
    try:
        found = harness.store.get(resource, name, namespace)
    except NotFound:
        return None
    return str(found["metadata"]["resourceVersion"])


async def objects_state(harness: Harness) -> dict[str, Any]:
    return {
        "busy": version_of(harness, "pods", "busy", "default"),
        "node": version_of(harness, "nodes", "node-a", None),
        "intruder": version_of(harness, "pods", "intruder", "default"),
    }


async def test_anonymous_clients_are_refused(nats_server: NatsServerProcess) -> None:
    with pytest.raises(NatsError):
        await nats.connect(
            nats_server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
        )


async def test_a_wrong_password_is_refused(nats_server: NatsServerProcess) -> None:
    with pytest.raises(NatsError):
        await nats.connect(
            nats_server.url,
            user="nodeset-controller",
            password="guessed",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )


async def test_a_delete_payload_on_another_ops_subject_is_refused_and_dead_lettered(
    harness: Harness,
) -> None:
    harness.store.create("pods", pod("busy"))
    await harness.start_watcher()
    cmd = await harness.send(
        BUSY, DeleteObject(), subject=subjects.k8s_command(ADMIN_USER, "record-event")
    )
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert outcome.outcome == "forbidden"
    assert "operation 'record-event'" in outcome.message
    dead = await harness.bus.js.get_last_msg(
        "DEAD_LETTERS", subjects.dead_letter(subjects.k8s_command(ADMIN_USER, "record-event"))
    )
    assert dead.headers is not None
    assert dead.headers[dead_letter.ERROR_KIND] == "permanent"
    assert "operation 'record-event'" in dead.headers[dead_letter.ERROR]
    assert version_of(harness, "pods", "busy", "default") is not None


async def test_a_command_past_its_deadline_is_reported_expired_and_not_applied(
    harness: Harness,
) -> None:
    harness.store.create("pods", pod("busy"))
    await harness.start_watcher()
    cmd = await harness.send(BUSY, DeleteObject(), expires_at=time.time() - 5)
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert outcome.outcome == "expired"
    assert version_of(harness, "pods", "busy", "default") is not None
    fresh = await harness.send(BUSY, DeleteObject(), expires_at=deadline_after(30))
    assert (await harness.final_outcome(fresh.idempotency_key)).outcome == "applied"


async def test_nodeset_controller_may_delete_a_pod_only_when_it_carries_the_nodeset_label(
    harness: Harness,
) -> None:
    harness.store.create("pods", pod("busy"))
    harness.store.create("pods", pod("member", **{NODESET_LABEL: "workers"}))
    controller = await harness.connect_as("nodeset-controller")
    await harness.start_watcher()
    refused = await harness.send(BUSY, DeleteObject(), sender="nodeset-controller", bus=controller)
    assert (await harness.final_outcome(refused.idempotency_key)).outcome == "forbidden"
    member = ObjectRef(api_version="v1", kind="Pod", name="member", namespace="default")
    applied = await harness.send(
        member, DeleteObject(), sender="nodeset-controller", bus=controller
    )
    assert (await harness.final_outcome(applied.idempotency_key)).outcome == "applied"
    assert version_of(harness, "pods", "busy", "default") is not None


async def test_every_service_is_refused_every_operation_it_must_not_perform(
    harness: Harness, nats_server: NatsServerProcess, nats_users: dict[str, Secret]
) -> None:
    harness.store.create("pods", pod("busy"))
    harness.store.create("nodes", node("node-a"))
    await harness.start_watcher()
    before = await objects_state(harness)
    expected_forbidden: list[str] = []
    for service in SERVICES:
        client = await RawClient().connect(nats_server.url, service, nats_users[service])
        try:
            for n, (operation, target) in enumerate(OPERATIONS):
                cmd = as_command(service, operation, target, n)
                if not must_not(service, cmd):
                    continue
                own_prefix = any(
                    subject_matches(allowed, cmd.subject) for allowed in nats_publish_allow(service)
                )
                stored = await stored_commands(harness)
                await client.publish(cmd.subject, cmd)
                if own_prefix:
                    expected_forbidden.append(cmd.idempotency_key)
                    await reaches_the_stream(harness, stored)
                else:
                    await refused_by_nats(client)
                    assert await stored_commands(harness) == stored, (service, cmd.op)
                # Under another service's name: NATS refuses the subject.
                for other in SERVICES:
                    if other == service:
                        continue
                    forged = msgspec.structs.replace(cmd, sender=other)
                    stored = await stored_commands(harness)
                    await client.publish(forged.subject, forged)
                    await refused_by_nats(client)
                    assert await stored_commands(harness) == stored, (service, other, cmd.op)
                # Under its own subject, claiming another sender: k8s-watcher refuses.
                if own_prefix:
                    claimed = msgspec.structs.replace(
                        cmd, sender=ADMIN_USER, idempotency_key=cmd.idempotency_key + "-claim"
                    )
                    stored = await stored_commands(harness)
                    await client.publish(cmd.subject, claimed)
                    expected_forbidden.append(claimed.idempotency_key)
                    await reaches_the_stream(harness, stored)
        finally:
            await client.close()
    assert expected_forbidden, "no service has a command prefix: the test tried nothing"
    for key in expected_forbidden:
        outcome = await harness.final_outcome(key, timeout=15.0)
        assert outcome.outcome == "forbidden", (key, outcome.message)
    assert await objects_state(harness) == before


async def test_a_service_cannot_read_another_services_replies_or_deliveries(
    nats_server: NatsServerProcess, nats_users: dict[str, Secret]
) -> None:
    """Replies and JetStream deliveries go to per-user inboxes (`_INBOX.<user>.…`): another
    service cannot subscribe to them and read, say, the commands delivered to k8s-watcher."""
    spy = await RawClient().connect(
        nats_server.url, "metrics-exporter", nats_users["metrics-exporter"]
    )
    try:
        assert spy.client is not None
        for subject in ("_INBOX.>", "_INBOX.k8s-watcher.>", "k8s.v1.>"):
            await spy.client.subscribe(subject)
            await spy.client.flush(timeout=2)
            await refused_by_nats(spy)
        # Its own inboxes work: a JetStream API request answers.
        reply = await spy.client.request("$JS.API.INFO", b"", timeout=2)
        assert b"memory" in reply.data
    finally:
        await spy.close()


async def test_a_late_repeat_of_an_applied_command_is_reported_already_applied(
    harness: Harness,
) -> None:
    """The deadline guards against applying late, not against telling the truth: a repeat of a
    command that was applied in time still answers `already-applied`."""
    harness.store.create("nodes", node("node-a"))
    await harness.start_watcher()
    first = await harness.send(NODE, CordonNode(), key="cordon-once", expires_at=deadline_after(30))
    assert (await harness.final_outcome(first.idempotency_key)).outcome == "applied"
    await harness.send(
        NODE, CordonNode(), key="cordon-once", msg_id="cordon-once:late", expires_at=time.time() - 1
    )
    await wait_until(lambda: len(harness.outcomes_of("cordon-once")) == 2, 5.0)
    assert [o.outcome for o in harness.outcomes_of("cordon-once")] == [
        "applied",
        "already-applied",
    ]


async def test_rule_the_placer_may_delete_a_preemption_victim_but_never_a_nodeset_pod(
    harness: Harness,
) -> None:
    """topology-placer deletes its preemption victims; a NodeSet (slurmd) pod may run Slurm
    jobs it cannot see, so k8s-watcher reads the target and refuses when it carries the
    NodeSet label, whatever the placer's plan says."""
    harness.store.create("pods", pod("slurmd", **{NODESET_LABEL: "workers"}))
    harness.store.create("pods", pod("victim"))
    await harness.start_watcher()
    slurmd = ObjectRef(api_version="v1", kind="Pod", name="slurmd", namespace="default")
    victim = ObjectRef(api_version="v1", kind="Pod", name="victim", namespace="default")
    refused = await harness.send(slurmd, DeleteObject(), sender="topology-placer")
    outcome = await harness.final_outcome(refused.idempotency_key)
    assert outcome.outcome == "forbidden"
    assert NODESET_LABEL in outcome.message
    assert version_of(harness, "pods", "slurmd", "default") is not None
    allowed = await harness.send(victim, DeleteObject(), sender="topology-placer")
    assert (await harness.final_outcome(allowed.idempotency_key)).outcome == "applied"
