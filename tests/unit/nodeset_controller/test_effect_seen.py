"""Rule 11: an applied command's slot is free once KV shows its effect.

A delete's effect is the object gone from the view, whatever its kind: the NodeSet's
PodDisruptionBudget, deleted to be made again after a spec change, was once counted as seen
only for pods, so its create waited `IN_FLIGHT_TIMEOUT_SECONDS` (20 s) with busy pods and no
budget at all.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

from nodeflow_bus import KVView
from nodeflow_contracts.k8s import (
    CommandOutcome,
    CreateObject,
    DeleteObject,
    K8sCommand,
    ObjectRef,
)
from nodeflow_contracts.ledger import LedgerEntry
from nodeflow_contracts.pod_protocol import POD_PROTECT_LABEL
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.protection import budget_name, budget_object
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import CLUSTER, DEFAULTS, NS, T0, node, nodeset, pod
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster, MemoryView

KEY = f"{NS}.gpu"


def _busy(name: str) -> SlurmNodeState:
    return SlurmNodeState(
        cluster=CLUSTER,
        name=name,
        known=True,
        base_state="Allocated",
        flags=(),
        busy=True,
        drain=False,
        drained=False,
        draining=False,
    )


def test_rule_a_deleted_budget_is_seen_gone_and_its_create_follows_at_once() -> None:
    cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
    budgets: MemoryView[dict[str, Any]] = MemoryView(cluster.controller._on_budget)
    cluster.controller.budgets = cast(KVView[dict[str, Any]], budgets)
    loop = asyncio.new_event_loop()
    for i in range(2):
        name = f"gpu-001-{i + 1:03d}"
        cluster.nodes.put(f"_.n{i}", node(f"n{i}", f"10.0.1.{i + 1}", claim=KEY))
        raw = pod(name, f"n{i}")
        raw["metadata"]["uid"] = cluster.next_uid()
        raw["metadata"]["labels"][POD_PROTECT_LABEL] = "true"
        cluster.pods.put(f"{NS}.{name}", raw)
        cluster.slurm.put(f"{CLUSTER}.{name}", _busy(name))
    obj = nodeset(replicas=2)
    cluster.nodesets.put(KEY, obj)
    # Our budget, edited by someone to another shape: it is deleted and made again.
    edited = budget_object(parse(obj, DEFAULTS))
    edited["metadata"].update(uid="uid-b1", resourceVersion="900")
    edited["spec"] = {**edited["spec"], "maxUnavailable": 1}
    edited["spec"].pop("minAvailable", None)
    budget_key = f"{NS}.{budget_name('gpu')}"
    budgets.put(budget_key, edited)

    def budget_commands(now: float) -> list[K8sCommand]:
        cluster.clusters.put(
            CLUSTER,
            SlurmClusterStatus(
                cluster=CLUSTER,
                reachable=True,
                last_poll_at=now,
                last_success_at=now,
                poll_interval_seconds=10.0,
                nodes_revision=cluster.slurm.last_revision,
            ),
        )
        sent = loop.run_until_complete(cluster.round(KEY, now))
        return [c for c in sent if c.target.kind == "PodDisruptionBudget"]

    try:
        first = budget_commands(T0)
        assert [type(c.operation) for c in first] == [DeleteObject]
        delete = first[0]
        budgets.delete(budget_key)  # applied: the view drops the key
        loop.run_until_complete(
            cluster.report(
                CommandOutcome(
                    idempotency_key=delete.idempotency_key,
                    op=delete.op,
                    sender=delete.sender,
                    target=delete.target,
                    outcome="applied",
                    sent_at=delete.sent_at,
                    finished_at=T0 + 0.2,
                    resource_version="901",
                )
            )
        )
        # The next round, well inside IN_FLIGHT_TIMEOUT_SECONDS, makes the budget again.
        again = budget_commands(T0 + 1)
        assert [type(c.operation) for c in again] == [CreateObject]
    finally:
        loop.close()


def test_rule_an_applied_command_is_held_past_the_in_flight_timeout_while_the_view_lags() -> None:
    """`IN_FLIGHT_TIMEOUT_SECONDS` frees an applied command's slot on time alone only when the
    view cannot show it lags: a pod the view still holds at a resourceVersion before the
    outcome's keeps the slot (a plan on that view would spend it again) until the view
    reaches the write."""
    config = NodeSetControllerConfig(nats_url=("nats://unused",))
    cluster = MemoryCluster(config)
    controller = cluster.controller
    loop = asyncio.new_event_loop()
    name = "gpu-001-001"
    raw = pod(name, "n0")
    raw["metadata"].update(uid=cluster.next_uid(), resourceVersion="150")
    cluster.pods.put(f"{NS}.{name}", raw)
    target = ObjectRef(api_version="v1", kind="Pod", name=name, namespace=NS)
    slot = f"pod:{NS}/{name}"
    entry = LedgerEntry(
        idempotency_key="mark-1",
        slots=(slot,),
        target=target,
        op="patch",
        sent_at=T0,
        expires_at=T0 + 20.0,
    )
    controller.ledger.ledger.record(entry)
    controller.ledger.settle(
        CommandOutcome(
            idempotency_key="mark-1",
            op="patch",
            sender=controller.ledger.sender,
            target=target,
            outcome="applied",
            sent_at=T0,
            finished_at=T0 + 0.5,
            resource_version="200",
        )
    )
    after_timeout = T0 + config.in_flight_timeout_seconds + 5
    assert after_timeout < entry.may_land_until()
    try:
        loop.run_until_complete(controller.reconcile_dirty(after_timeout))
        assert controller.ledger.ledger.holds(slot, after_timeout)
        raw = copy.deepcopy(raw)
        raw["metadata"]["resourceVersion"] = "200"
        cluster.pods.put(f"{NS}.{name}", raw)
        loop.run_until_complete(controller.reconcile_dirty(after_timeout + 1))
        assert not controller.ledger.ledger.holds(slot, after_timeout + 1)
    finally:
        loop.close()
