"""The decision loop outlives a failed round, and its end stops the process.

nodeset-controller's loop once let any exception of a round end it for good (a JetStream
timeout storing a ledger record, `LedgerNotReady` after the lease lapsed during the debounce)
while the lease task kept renewing: the replica led and planned nothing. A failed round is
logged and skipped, the next one plans everything again (`nodeflow_bus.leader_loop.run_round`);
if the loop task ends anyway, `LeaderLoop.watch` raises so the service exits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from nodeflow_bus import KVView
from nodeflow_bus.leader_loop import LeaderLoop
from nodeflow_bus.ledger import LedgerNotReady
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeset_controller.config import NodeSetControllerConfig
from tests.unit.nodeset_controller.builders import CLUSTER, NS, node, nodeset
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster, MemoryView

KEY = f"{NS}.gpu"


def _leading_cluster(**settings: Any) -> MemoryCluster:
    cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",), **settings))
    controller = cluster.controller
    controller.budgets = cast(KVView[dict[str, Any]], MemoryView(controller._on_budget))
    now = time.time()
    cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=KEY))
    cluster.clusters.put(
        CLUSTER,
        SlurmClusterStatus(
            cluster=CLUSTER,
            reachable=True,
            last_poll_at=now,
            last_success_at=now,
            poll_interval_seconds=10.0,
        ),
    )
    return cluster


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_rule_a_failed_send_does_not_end_the_loop_and_the_next_round_plans() -> None:
    cluster = _leading_cluster(debounce_seconds=0.0)
    controller = cluster.controller
    failures = 0
    store_record = cluster.sink.publish

    async def one_timeout(subject: str, message: Any, *, msg_id: str | None = None) -> None:
        # The fault: one JetStream ack that does not come (cannot be made on a real server
        # at will); the next store succeeds.
        nonlocal failures
        if failures == 0:
            failures += 1
            raise TimeoutError("nats: timeout")
        await store_record(subject, message, msg_id=msg_id)

    cluster.sink.publish = one_timeout  # type: ignore[method-assign]
    loop = asyncio.create_task(controller._run())
    try:
        cluster.nodesets.put(KEY, nodeset(replicas=1))
        await _until(lambda: failures == 1, "the first send failed")
        await _until(lambda: bool(cluster.sink.sent), "a later round sent the create")
        assert not loop.done()
        assert any(s.command.op == "create" for s in cluster.sink.sent)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_rule_a_lapsed_lease_during_the_round_skips_it_and_the_loop_goes_on() -> None:
    cluster = _leading_cluster(debounce_seconds=0.0)
    controller = cluster.controller
    plans_before_lapse = controller.stats.plans
    real_reconcile = controller.reconcile_dirty
    lapsed = False

    async def lapse_then_reconcile(now: float | None = None) -> None:
        # The lease lapses between the loop's leadership check and the send.
        nonlocal lapsed
        if not lapsed:
            lapsed = True
            ready = controller.ledger.ledger
            controller.ledger._set_ready(False)
            try:
                await real_reconcile(now)
            finally:
                controller.ledger.adopt(ready)
            return
        await real_reconcile(now)

    controller.reconcile_dirty = lapse_then_reconcile  # type: ignore[method-assign]
    loop = asyncio.create_task(controller._run())
    try:
        cluster.nodesets.put(KEY, nodeset(replicas=1))
        await _until(lambda: bool(cluster.sink.sent), "a round after the lapse sent")
        assert lapsed and controller.stats.plans > plans_before_lapse + 1
        assert not loop.done()
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_rule_a_leader_loop_that_ends_unexpectedly_fails_its_watch() -> None:
    async def ends_with_an_error() -> None:
        raise ValueError("a bug")

    leader_loop = LeaderLoop(
        cast(Any, None),
        cast(Any, None),
        (),
        outcomes_subject="unused",
        on_outcome=cast(Any, None),
        on_leadership=lambda leader: None,
        loop=ends_with_an_error,
        name="test loop",
    )
    leader_loop.task = asyncio.create_task(ends_with_an_error())
    with pytest.raises(RuntimeError, match="ended unexpectedly"):
        await leader_loop.watch()


async def test_rule_a_lease_lapsing_while_the_records_are_stored_publishes_no_command() -> None:
    """Leadership is asked again before each record and before the commands: a lease that
    lapses between planning and publishing (a slow JetStream ack) sends nothing."""
    cluster = _leading_cluster()
    store_record = cluster.sink.publish

    async def lapse_while_storing(subject: str, message: Any, *, msg_id: str | None = None) -> None:
        cluster.lease.is_leader = False  # the renewal did not come back in time
        await store_record(subject, message, msg_id=msg_id)

    cluster.sink.publish = lapse_while_storing  # type: ignore[method-assign]
    cluster.nodesets.put(KEY, nodeset(replicas=1))
    with pytest.raises(LedgerNotReady):
        await cluster.controller.reconcile_dirty()
    assert cluster.sink.records, "the round got as far as storing its record"
    assert cluster.sink.sent == []
