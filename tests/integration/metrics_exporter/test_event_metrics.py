"""Slurm counts from KV, poll age, commands, outcomes and latency, decisions and dead letters,
all fed through real NATS into a running Exporter."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry

from metrics_exporter.exporter import Exporter
from nodeflow_bus import Bus
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome, DeleteObject, K8sCommand, ObjectRef
from nodeflow_contracts.nodeset import NodeSetDecision
from nodeflow_contracts.slurm import SlurmNodeState, SlurmPollResult
from nodeflow_contracts.topology import SLURM_NODES_BUCKET
from tests.integration.metrics_exporter.conftest import Clock, eventually

POD = ObjectRef(api_version="v1", kind="Pod", name="gpus-worker-3", namespace="team-a", uid="u3")


def slurm_node(cluster: str, name: str, base: str, *flags: str, **derived: bool) -> SlurmNodeState:
    state = SlurmNodeState(
        cluster=cluster,
        name=name,
        known=True,
        base_state=base,  # type: ignore[arg-type]
        flags=tuple(flags),
    )
    return msgspec.structs.replace(state, **derived)


def total(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_slurm_node_counts_follow_the_kv_bucket(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    kv = await bus.js.key_value(SLURM_NODES_BUCKET)
    nodes = [
        slurm_node("prod", "gpu-0", "Idle"),
        slurm_node("prod", "gpu-1", "Idle", "Drain", drain=True, drained=True),
        slurm_node("prod", "gpu-2", "Mixed", "Drain", drain=True, draining=True, busy=True),
        slurm_node("prod", "gpu-3", "Allocated", busy=True),
        slurm_node("dev", "cpu-0", "Down", "NotResponding"),
    ]
    last = 0
    for state in nodes:
        last = await kv.put(state.key, codec.encode(state))
    await eventually(lambda: exporter.slurm_nodes.last_revision >= last, what="slurm nodes")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("nodeflow_slurm_nodes", cluster="prod", state="Idle") == 2
    assert value("nodeflow_slurm_nodes", cluster="prod", state="Mixed") == 1
    assert value("nodeflow_slurm_nodes", cluster="prod", state="Allocated") == 1
    assert value("nodeflow_slurm_nodes", cluster="prod", state="Down") == 0
    assert value("nodeflow_slurm_node_flags", cluster="prod", flag="Drain") == 2
    assert value("nodeflow_slurm_nodes_drained", cluster="prod") == 1
    assert value("nodeflow_slurm_nodes_draining", cluster="prod") == 1
    assert value("nodeflow_slurm_nodes", cluster="dev", state="Down") == 1
    assert value("nodeflow_slurm_node_flags", cluster="dev", flag="NotResponding") == 1

    # gpu-1 undrained and gpu-2 removed from Slurm: counts follow at once.
    undrained = slurm_node("prod", "gpu-1", "Idle")
    await kv.put(undrained.key, codec.encode(undrained))
    await kv.delete("prod.gpu-2")
    await eventually(lambda: "prod.gpu-2" not in exporter.slurm_nodes, what="gpu-2 removed")
    await eventually(
        lambda: exporter.slurm_nodes.get("prod.gpu-1") == undrained, what="gpu-1 undrained"
    )
    assert value("nodeflow_slurm_nodes", cluster="prod", state="Mixed") == 0
    assert value("nodeflow_slurm_node_flags", cluster="prod", flag="Drain") == 0
    assert value("nodeflow_slurm_nodes_drained", cluster="prod") == 0
    assert value("nodeflow_slurm_nodes_draining", cluster="prod") == 0

    # The last node of a cluster gone: the cluster has no series left.
    await kv.delete("dev.cpu-0")
    await eventually(lambda: "dev.cpu-0" not in exporter.slurm_nodes, what="cpu-0 removed")
    assert value("nodeflow_slurm_nodes", cluster="dev", state="Down") is None


async def test_poll_age_and_success_from_poll_results(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry, clock: Clock
) -> None:
    ok = SlurmPollResult(cluster="prod", ok=True, started_at=clock.now - 12.0, duration_seconds=2.0)
    await bus.publish(ok.subject, ok)
    await eventually(lambda: "prod" in exporter.polls.clusters, what="poll recorded")
    labels = {"cluster": "prod"}
    assert registry.get_sample_value("nodeflow_slurm_last_poll_success", labels) == 1
    assert (
        registry.get_sample_value("nodeflow_slurm_last_successful_poll_age_seconds", labels) == 10.0
    )
    clock.now += 30.0
    assert (
        registry.get_sample_value("nodeflow_slurm_last_successful_poll_age_seconds", labels) == 40.0
    )

    failed = SlurmPollResult(
        cluster="prod", ok=False, started_at=clock.now - 1.0, duration_seconds=0.5, error="503"
    )
    await bus.publish(failed.subject, failed)
    await eventually(lambda: exporter.polls.clusters["prod"].failed == 1, what="failed poll")
    assert registry.get_sample_value("nodeflow_slurm_last_poll_success", labels) == 0
    assert (
        registry.get_sample_value("nodeflow_slurm_last_successful_poll_age_seconds", labels) == 40.0
    )


async def test_commands_outcomes_and_latency(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    command = K8sCommand(
        idempotency_key="delete-gpus-worker-3",
        sender="nodeset-controller",
        sent_at=100.0,
        target=POD,
        operation=DeleteObject(),
        reason="scale-in: rank 3 idle and drained",
    )
    # A publish retried with the same Msg-Id is one command.
    await bus.publish(command.subject, command, msg_id=command.idempotency_key)
    await bus.publish(command.subject, command, msg_id=command.idempotency_key)
    await eventually(
        lambda: total(registry, "nodeflow_k8s_commands_sent_total", {"op": "delete"}) >= 1,
        what="command counted",
    )

    def outcome(result: str, finished_at: float, attempt: int) -> CommandOutcome:
        return CommandOutcome(
            idempotency_key=command.idempotency_key,
            op="delete",
            sender=command.sender,
            target=POD,
            outcome=result,  # type: ignore[arg-type]
            message="the object has been modified",
            attempt=attempt,
            sent_at=command.sent_at,
            finished_at=finished_at,
        )

    for message in (outcome("retrying", 100.4, 1), outcome("applied", 101.5, 2)):
        await bus.publish(message.subject, message, msg_id=message.msg_id)
    await eventually(
        lambda: (
            total(registry, "nodeflow_k8s_command_latency_seconds_count", {"op": "delete"}) == 1
            and total(
                registry,
                "nodeflow_k8s_command_outcomes_total",
                {"op": "delete", "outcome": "retrying"},
            )
            == 1
        ),
        what="outcomes counted",
    )
    assert (
        total(
            registry, "nodeflow_k8s_command_outcomes_total", {"op": "delete", "outcome": "applied"}
        )
        == 1
    )
    assert total(registry, "nodeflow_k8s_command_latency_seconds_sum", {"op": "delete"}) == 1.5
    assert (
        total(
            registry, "nodeflow_k8s_command_latency_seconds_bucket", {"op": "delete", "le": "2.5"}
        )
        == 1
    )
    assert (
        total(
            registry, "nodeflow_k8s_command_latency_seconds_bucket", {"op": "delete", "le": "1.0"}
        )
        == 0
    )
    assert total(registry, "nodeflow_k8s_commands_sent_total", {"op": "delete"}) == 1


async def test_decisions_by_kind_and_reason(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    for index, (kind, reason) in enumerate(
        [
            ("delete-scheduled", "ScalingDeleteScheduled"),
            ("delete-scheduled", "ScalingDeleteScheduled"),
            ("create", "rank 4 has no pod"),
        ]
    ):
        decision = NodeSetDecision(
            decision_id=f"d-{index}",
            namespace="team-a",
            nodeset="gpus",
            kind=kind,  # type: ignore[arg-type]
            reason=reason,
            message=f"rank {index}: idle, drained, delete condition set",
            decided_at=float(index),
            pod=f"gpus-worker-{index}",
        )
        await bus.publish(decision.subject, decision)
    # Sources without a contract in nodeflow_contracts yet are counted leniently.
    await bus.publish(
        "maintenance.v1.nodemaintenance.team-a.nm-1.decision",
        msgspec.json.encode({"kind": "cordon", "reason": "NodeCordoned", "node": "gpu-0"}),
    )
    await bus.publish("placement.v1.team-a.gang.decision", msgspec.json.encode({"score": 3}))
    await eventually(
        lambda: (
            total(
                registry,
                "nodeflow_decisions_total",
                {"source": "maintenance", "kind": "cordon", "reason": "NodeCordoned"},
            )
            == 1
            and total(
                registry,
                "nodeflow_decisions_total",
                {"source": "placement", "kind": "other", "reason": "other"},
            )
            == 1
        ),
        what="other decisions counted",
    )
    await eventually(
        lambda: (
            total(
                registry,
                "nodeflow_decisions_total",
                {"source": "nodeset", "kind": "create", "reason": "other"},
            )
            == 1
            and total(
                registry,
                "nodeflow_decisions_total",
                {
                    "source": "nodeset",
                    "kind": "delete-scheduled",
                    "reason": "ScalingDeleteScheduled",
                },
            )
            == 2
        ),
        what="decisions counted",
    )
    text = "\n".join(str(s.labels) for f in registry.collect() for s in f.samples)
    assert "gpus-worker" not in text
    assert "idle, drained" not in text


async def test_undecodable_messages_are_dead_lettered_and_counted_by_subject_family(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    await bus.publish("outcome.k8s.v1.delete", b"{not json")
    await bus.publish("nodeset.v1.team-a.gpus.decision", msgspec.json.encode({"kind": "create"}))
    await bus.publish("slurm.v1.prod.poll", msgspec.json.encode({"cluster": "prod", "ok": "yes"}))

    def dead(subject: str) -> float:
        return total(
            registry, "nodeflow_dead_letters_total", {"subject": subject, "error_kind": "decode"}
        )

    await eventually(
        lambda: (
            dead("outcome.k8s.v1.delete") == 1
            and dead("nodeset.v1") == 1
            and dead("slurm.v1.poll") == 1
        ),
        what="dead letters counted",
    )
    stored = await bus.js.stream_info("DEAD_LETTERS")
    assert stored.state.messages == 3
    # Nothing was counted from the bad messages themselves.
    assert "prod" not in exporter.polls.clusters
    assert (
        registry.get_sample_value(
            "nodeflow_k8s_command_outcomes_total", {"op": "delete", "outcome": "applied"}
        )
        is None
    )


async def test_dead_letters_of_other_services_never_carry_names(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    await bus.publish(
        "dlq.k8s.v1.pod.team-a.gpus-worker-3",
        b"{}",
        headers={"Nodeflow-Error-Kind": "max_deliveries"},
    )
    await eventually(
        lambda: (
            total(
                registry,
                "nodeflow_dead_letters_total",
                {"subject": "k8s.v1.pod", "error_kind": "max_deliveries"},
            )
            == 1
        ),
        what="dead letter counted",
    )
