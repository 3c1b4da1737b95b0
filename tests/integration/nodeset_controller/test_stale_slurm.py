"""Stale Slurm state on the whole stack: when slurm-syncer stops, its last states (read from
KV slurm_clusters as no longer fresh) count as unknown, and nothing is deleted on them."""

from __future__ import annotations

import asyncio

from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.nodeset_controller.conftest import (
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
)


async def test_rule_stale_slurm_state_is_unknown_on_the_whole_stack(stack: Stack) -> None:
    await stack.start_controller(slurm_state_max_age_seconds=1.0)
    stack.create_nodeset("gpu", 2)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 2)
    names = sorted(p["metadata"]["name"] for p in stack.pods("gpu"))
    await eventually(lambda: all(stack.slurm_node(n) for n in names))
    # An administrator drains one node: its last read state is drained and idle.
    victim = names[0]
    stack.sim.slurm["sim"].cluster.update_node(victim, "root", ["DRAIN"], "maintenance", None)
    await eventually(lambda: stack.status("gpu").get("numberDrain") == 1, what="drained seen")
    syncer = stack.syncer
    assert syncer is not None
    clients = syncer.clusters
    await syncer.stop()
    # The syncer is gone: after the maximum age its states are unknown. The status says so
    # (SlurmStateUnknown) and keeps the last known numberDrain rather than a zero.
    await eventually(
        lambda: any(
            c.get("type") == "SlurmStateUnknown" and c.get("status") == "True"
            for c in stack.status("gpu").get("conditions") or []
        ),
        what="went stale",
    )
    assert stack.status("gpu").get("numberDrain") == 1
    stack.patch_nodeset("gpu", {"replicas": 1})
    await eventually(
        lambda: condition(stack.sim.store.get("pods", victim, "default"), SLURM_DELETE),
        what="the drained pod is chosen",
    )
    await asyncio.sleep(1.0)  # several rounds: a stale "drained and idle" deletes nothing
    assert len(stack.live_pods("gpu")) == 2
    # A syncer polls again: the state is fresh, the pod goes.
    syncer = Syncer(
        stack.bus,
        {name: view.client for name, view in clients.items()},
        SyncerOptions(poll_interval=0.2, resend_after=3.0),
    )
    await syncer.start()
    try:
        await eventually(lambda: len(stack.live_pods("gpu")) == 1, timeout=20, what="deleted")
        assert victim not in {p["metadata"]["name"] for p in stack.live_pods("gpu")}
    finally:
        await syncer.stop()
