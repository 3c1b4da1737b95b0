"""topology-placer on the emulator stack: a gang of 4 bound inside one block, through
k8s-watcher commands, with its decision, PodGroup status and the topology's detailStatus."""

from __future__ import annotations

import json
import typing
from collections import Counter

import msgspec
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome, Outcome
from nodeflow_contracts.placement import PlacementDecision
from tests.integration.topology_placer.conftest import (
    BLOCK,
    PODGROUPS,
    TOPOLOGIES,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
    topology_object,
)
from topology_placer.commands import SENDER

OUTCOMES = [o for o in typing.get_args(Outcome) if o != "retrying"]
BLOCK_MUST = json.dumps({"gatherStrategy": [{"layer": "BlockLayer", "strategy": "MustGather"}]})


def _bound(stack: Stack, group: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in stack.pods(group)
        if p["spec"].get("nodeName")
    }


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_gang_of_four_is_bound_inside_one_block(stack: Stack) -> None:
    decisions: list[PlacementDecision] = []
    placed_before = _sample("nodeflow_topology_placer_placement_attempts_total", result="placed")
    passes_before = _sample("nodeflow_topology_placer_placement_seconds_count")

    async def collect(msg: Msg) -> None:
        decisions.append(msgspec.json.decode(msg.data, type=PlacementDecision))

    await stack.bus.nc.subscribe(subjects.placement_decision("default", "train"), cb=collect)
    stack.sim.store.create(TOPOLOGIES, topology_object())
    stack.sim.store.create(PODGROUPS, pod_group_object("train", 4, BLOCK_MUST))
    for rank in range(4):
        stack.sim.store.create("pods", gang_pod(f"train-{rank}", "train", gpus=4, index=rank))
    await stack.start_placer()

    bound = await eventually(lambda: len(_bound(stack, "train")) == 4 and _bound(stack, "train"))
    blocks = {stack.node_labels(node)[BLOCK] for node in bound.values()}
    assert len(blocks) == 1
    # Ranks kept: 0 and 1 share a node, 2 and 3 the other.
    assert bound["train-0"] == bound["train-1"] != bound["train-2"] == bound["train-3"]
    for pod in stack.pods("train"):
        assert pod["status"].get("nominatedNodeName") == pod["spec"]["nodeName"]

    await eventually(
        lambda: stack.pod_group("train").get("status", {}).get("phase") in ("Scheduled", "Running"),
        what="PodGroup status follows its pods",
    )
    topology = stack.sim.store.get(TOPOLOGIES, "default")
    detail = topology.get("status", {}).get("detailStatus") or []
    root = next(e for e in detail if e["topologyInfo"]["topologyLayer"] == "ClusterTopologyLayer")
    assert root["nodeNum"] == 8
    await eventually(lambda: any(d.kind == "bound" for d in decisions), what="bound decision")
    nominated = next(d for d in decisions if d.kind == "nominated")
    assert nominated.layer == "BlockLayer"
    # Metrics: the attempt, the passes, the gang by state, the topology's domains.
    placed = _sample("nodeflow_topology_placer_placement_attempts_total", result="placed")
    assert placed > placed_before
    assert _sample("nodeflow_topology_placer_placement_seconds_count") > passes_before
    await eventually(
        lambda: _sample("nodeflow_topology_placer_gangs", state="bound") == 1,
        what="the gang counted as bound",
    )
    assert _sample("nodeflow_topology_placer_topology_domains", layer="BlockLayer") == 4
    assert _sample("nodeflow_topology_placer_topology_domains", layer="NodeTopologyLayer") == 8


async def test_must_gather_failure_is_reported_in_numbers(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    stack.sim.store.create(PODGROUPS, pod_group_object("big", 3, BLOCK_MUST))
    for rank in range(3):
        stack.sim.store.create("pods", gang_pod(f"big-{rank}", "big", gpus=8))
    await stack.start_placer()

    def message() -> str:
        for pod in stack.pods("big"):
            for condition in pod.get("status", {}).get("conditions") or []:
                if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                    return str(condition.get("message"))
        return ""

    text = await eventually(message, what="PodScheduled=False on the gang's pods")
    assert text == (
        "MustGather BlockLayer: no BlockLayer domain offers 3 slots; best spine-0/block-0 offers 2"
    )
    assert not _bound(stack, "big")
    await eventually(lambda: stack.events("FailedScheduling"), what="a FailedScheduling Event")


async def test_published_messages_and_command_outcomes_are_counted(stack: Stack) -> None:
    published = 0
    seen: Counter[str] = Counter()

    async def count_published(_msg: Msg) -> None:
        nonlocal published
        published += 1

    async def count_outcome(msg: Msg) -> None:
        outcome = msgspec.json.decode(msg.data, type=CommandOutcome)
        if outcome.sender == SENDER and outcome.outcome != "retrying":
            seen[outcome.outcome] += 1

    # Everything the placer publishes: its commands and its decisions.
    await stack.bus.nc.subscribe(subjects.k8s_sender_commands(SENDER), cb=count_published)
    await stack.bus.nc.subscribe(subjects.PLACEMENT_DECISIONS, cb=count_published)
    await stack.bus.nc.subscribe(subjects.K8S_OUTCOMES, cb=count_outcome)
    messages = "nodeflow_topology_placer_messages_total"
    outcomes = "nodeflow_topology_placer_command_outcomes_total"
    messages_before = _sample(messages)
    outcomes_before = {name: _sample(outcomes, outcome=name) for name in OUTCOMES}

    stack.sim.store.create(PODGROUPS, pod_group_object("pair", 2))
    for rank in range(2):
        stack.sim.store.create("pods", gang_pod(f"pair-{rank}", "pair", gpus=8, index=rank))
    await stack.start_placer()
    await eventually(lambda: len(_bound(stack, "pair")) == 2, what="the pair bound")

    # Two nominations and two bindings at least, each applied; two decisions at least.
    await eventually(lambda: seen["applied"] >= 4, what="the commands' outcomes")
    await eventually(
        lambda: published >= 6 and _sample(messages) - messages_before == published,
        what="messages_total counts every command and decision published",
    )
    await eventually(
        lambda: all(
            _sample(outcomes, outcome=name) - outcomes_before[name] == seen[name]
            for name in OUTCOMES
        ),
        what="command_outcomes_total counts every outcome of the placer's commands, by outcome",
    )
