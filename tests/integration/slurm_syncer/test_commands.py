"""SlurmNodeCommand (drain/undrain) through the durable consumer of SLURM_COMMANDS."""

from __future__ import annotations

import time

from clustersim.slurm import RunningSlurm
from nodeflow_bus import Bus, PullConsumer
from nodeflow_contracts.slurm import SlurmNodeCommand
from slurm_syncer.syncer import Syncer
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    KubeKV,
    eventually,
    make_nodeset,
    send_command,
)


async def dead_letters(bus: Bus) -> list[str]:
    subscription = await bus.js.subscribe("dlq.>", stream="DEAD_LETTERS", ordered_consumer=True)
    found: list[str] = []
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=0.3)
            except Exception:
                return found
            found.append(msg.subject)
    finally:
        await subscription.unsubscribe()


async def test_drain_and_undrain_commands_are_applied_and_external_reasons_refused(
    topology: Bus,
    slurm: RunningSlurm,
    kube: KubeKV,
    syncer: Syncer,
    consumer: PullConsumer[SlurmNodeCommand],
) -> None:
    for name in ("n1", "n2"):
        slurm.emulator.register_node(name, cpus=2, real_memory=1024)
    await kube.put_nodeset(make_nodeset())
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)

    await send_command(topology, "drain", "n1", "slurm-operator: maintenance: firmware")
    await eventually(lambda: slurm.emulator.node_state("n1") == ["IDLE", "DRAIN"])
    assert slurm.cluster.nodes["n1"].reason == "slurm-operator: maintenance: firmware"
    # The read-back state is published without waiting for the next poll.
    await eventually(lambda: syncer.clusters[CLUSTER].states["n1"].drained)
    # A command's drain is not the cordon model's: a reconcile pass leaves it alone.
    await syncer.poll_once(CLUSTER)
    assert slurm.emulator.node_state("n1") == ["IDLE", "DRAIN"]

    await send_command(topology, "undrain", "n1")
    await eventually(lambda: slurm.emulator.node_state("n1") == ["IDLE"])

    # An admin's drain is never overwritten or lifted; bad commands are dead-lettered.
    slurm.cluster.update_node("n2", "root", ["DRAIN"], "admin: PSU", None)
    await send_command(topology, "undrain", "n2")
    await send_command(topology, "drain", "n1", "no prefix")
    await send_command(topology, "drain", "n1", "nodeflow: x", cluster="elsewhere")
    await send_command(topology, "drain", "missing", "nodeflow: x")
    await eventually(lambda: consumer.in_flight == 0)
    letters: list[str] = []

    async def four_letters() -> bool:
        letters[:] = await dead_letters(topology)
        return len(letters) == 4

    deadline = time.monotonic() + 5
    while not await four_letters():
        assert time.monotonic() < deadline, letters
    assert sorted(letters) == sorted(
        [
            "dlq.cmd.slurm.v1.a.undrain",
            "dlq.cmd.slurm.v1.a.drain",
            "dlq.cmd.slurm.v1.elsewhere.drain",
            "dlq.cmd.slurm.v1.a.drain",
        ]
    )
    assert slurm.cluster.nodes["n2"].reason == "admin: PSU"
    assert slurm.emulator.node_state("n2") == ["IDLE", "DRAIN"]
    assert slurm.emulator.node_state("n1") == ["IDLE"]
