"""A live node that leaves the k8s_nodes view is not a gone node: k8s-watcher with
LABEL_SELECTORS Node=pool=a100 deletes a node's KV entry when its label stops matching,
though the node still exists (and stays cordoned). Within NODE_GONE_GRACE_SECONDS its
request keeps its finalizer and its slot, and a request deleted meanwhile still uncordons
the node once the view shows it again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.maintenance_scheduler.conftest import Stack, eventually, run_stack

FINALIZER = "maintenance.nvidia.com/finalizer"
POOL = "pool"


@pytest.fixture
async def filtered(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(
        nats_server.url, watcher_settings={"label_selectors": {"Node": f"{POOL}=a100"}}
    ) as running:
        yield running


def label(stack: Stack, node: str, value: str | None) -> None:
    stack.sim.store.patch(
        "nodes",
        node,
        {"metadata": {"labels": {POOL: value}}},
        "application/merge-patch+json",
    )


async def test_rule_a_node_leaving_a_label_filtered_view_keeps_its_slot_finalizer_and_cordon(
    filtered: Stack,
) -> None:
    stack = filtered
    busy, waiting = stack.node_names()[:2]
    for node in stack.node_names():
        label(stack, node, "a100")
    stack.set_config(maxParallelOperations=1)
    scheduler = await stack.start_scheduler()
    await eventually(
        lambda: {k.partition(".")[2] for k in scheduler.nodes.as_dict()} >= {busy, waiting},
        what="the labelled nodes in the view",
    )
    stack.request("first", busy)
    await eventually(lambda: stack.phase("first") == "Ready", what="first Ready")
    stack.request("second", waiting)
    await eventually(
        lambda: any(d.kind == "skipped" and d.name == "second" for d in stack.decisions),
        what="second waiting for the one slot",
    )

    # The label goes: the node leaves the view (a KV delete) while it exists, cordoned.
    label(stack, busy, None)
    await eventually(
        lambda: busy not in {k.partition(".")[2] for k in scheduler.nodes.as_dict()},
        what="the node out of the view",
    )
    rounds = scheduler.stats.rounds
    await eventually(lambda: scheduler.stats.rounds >= rounds + 4, what="rounds in the gap")
    first = stack.get_request("first")
    assert first is not None and FINALIZER in first["metadata"]["finalizers"]
    assert stack.phase("second") == "Pending"
    stack.delete_request("first")
    rounds = scheduler.stats.rounds
    await eventually(lambda: scheduler.stats.rounds >= rounds + 4, what="rounds after deletion")
    first = stack.get_request("first")
    assert first is not None and FINALIZER in first["metadata"]["finalizers"]
    assert stack.phase("second") == "Pending"
    assert stack.unschedulable(busy)

    # Back in the view: the deletion's cleanup uncordons it, and the slot goes to second.
    label(stack, busy, "a100")
    await eventually(lambda: stack.get_request("first") is None, what="first cleaned up")
    assert not stack.unschedulable(busy)
    await eventually(lambda: stack.phase("second") == "Ready", what="second Ready")
