"""nodewright's NodeStateMalformed (upstream operator/internal/controller/cluster_state_v2.go
UpdateNodeStateMalformedCondition, its test TestUpdateNodeStateMalformedCondition in
skyhook_controller_test.go; the controller fails closed on such a node: skyhook_controller.go
refreshSkyhookConditions, the runnable-package filter, UpsertConfigmaps, HandleFinalizer) and
the node-state entries whose stage or state is none of the anchor's names, which we read as
malformed too. Each test names its rule; docs/maintenance-scheduler.md (S55) points here.
Every rule holds for both kinds."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Skyhook, parse_skyhook
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    RoundPlan,
    SetSkyhookStatus,
    node_state_malformed,
)
from maintenance_scheduler.skyhook.stages import (
    PACKAGE_STATES,
    STAGES,
    parse_node_state,
)
from nodeflow_contracts.skyhook import FLAVORS, SkyhookNames
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    FakeCluster,
    cluster_nodes,
    run_until_settled,
)
from tests.unit.plan_checks import expect_actions

BOTH = pytest.mark.parametrize("names", FLAVORS, ids=[n.kind for n in FLAVORS])

PACKAGES: dict[str, Any] = {
    "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
    "tuning": {"version": "1.0.0", "image": "ghcr.io/x/tuning", "dependsOn": {"driver": "1.0.0"}},
}


def obj(names: SkyhookNames, *, annotations: dict[str, str] | None = None) -> Skyhook:
    return parse_skyhook(
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {
                "name": "gpu-init",
                "uid": f"uid-{names.kind}",
                "generation": 1,
                "annotations": annotations or {},
                "finalizers": [names.finalizer],
            },
            "spec": {"packages": PACKAGES},
        }
    )


def with_annotation(cluster: FakeCluster, names: SkyhookNames, node: str, raw: str | None) -> None:
    """The node's nodeState_ annotation of the object set to `raw` (None: removed)."""
    key = names.node_state_annotation("gpu-init")
    view = cluster.nodes[node]
    annotations = {k: v for k, v in view.annotations.items() if k != key}
    if raw is not None:
        annotations[key] = raw
    cluster.nodes[node] = replace(view, annotations=annotations)


def malformed(cluster: FakeCluster) -> dict[str, Any] | None:
    found = [c for c in cluster.status().get("conditions", []) if c["type"] == "NodeStateMalformed"]
    assert len(found) <= 1
    return found[0] if found else None


def touches(action: object, node: str) -> bool:
    """Whether the action acts on the node (a Job, a patch, conditions, a request, ...)."""
    target = getattr(action, "node", None)
    return target == node or getattr(target, "name", None) == node


def entry(stage: str, state: str, name: str = "driver") -> dict[str, Any]:
    return {
        "name": name,
        "version": "1.0.0",
        "image": f"ghcr.io/x/{name}",
        "stage": stage,
        "state": state,
    }


# --- the condition ------------------------------------------------------------------------------


@BOTH
def test_rule_node_state_malformed_names_the_nodes_whose_state_cannot_be_read(
    names: SkyhookNames,
) -> None:
    cluster = FakeCluster(skyhooks=[obj(names)], nodes=cluster_nodes(4))
    for node, raw in (("node-02", "{not json"), ("node-00", "[]"), ("node-03", '{"a": 1}')):
        with_annotation(cluster, names, node, raw)
    cluster.round()
    found = malformed(cluster)
    assert found is not None
    assert (found["status"], found["reason"]) == ("True", "ParseError")
    # Upstream's words; the names sorted, so the message does not churn.
    assert found["message"] == (
        "nodeState annotation cannot be parsed on 3 node(s): node-00, node-02, node-03"
    )
    assert found["observedGeneration"] == 1 and found["lastTransitionTime"]
    # Status unknown for them (fail closed), as before.
    assert cluster.status()["nodeStatus"]["node-00"] == "unknown"


def test_rule_node_state_malformed_names_at_most_five_nodes_and_counts_the_rest() -> None:
    eight = [f"node-{i}" for i in range(8, 0, -1)]
    assert node_state_malformed(eight) == {
        "type": "NodeStateMalformed",
        "status": "True",
        "reason": "ParseError",
        "message": "nodeState annotation cannot be parsed on 8 node(s): "
        "node-1, node-2, node-3, node-4, node-5 and 3 more",
    }
    five = node_state_malformed([f"node-{i}" for i in range(5)])
    assert five is not None and five["message"].endswith("node-3, node-4")
    # Each name is cut as upstream's truncateNodeName: ten characters and "...".
    long = node_state_malformed(["ip-10-0-1-234.us-west-2.compute.internal", "abcdefghij"])
    assert long is not None
    assert long["message"] == (
        "nodeState annotation cannot be parsed on 2 node(s): abcdefghij, ip-10-0-1-..."
    )
    assert node_state_malformed([]) is None


@BOTH
def test_rule_node_state_malformed_caps_the_names_in_the_status(names: SkyhookNames) -> None:
    cluster = FakeCluster(skyhooks=[obj(names)], nodes=cluster_nodes(12))
    for node in list(cluster.nodes)[:7]:
        with_annotation(cluster, names, node, "{")
    cluster.round()
    found = malformed(cluster)
    assert found is not None
    assert found["message"] == (
        "nodeState annotation cannot be parsed on 7 node(s): "
        "node-00, node-01, node-02, node-03, node-04 and 2 more"
    )


@BOTH
def test_rule_node_state_malformed_goes_once_the_annotation_is_fixed(names: SkyhookNames) -> None:
    cluster = FakeCluster(skyhooks=[obj(names)], nodes=cluster_nodes(2))
    cluster.round()
    assert malformed(cluster) is None  # never set while every node reads
    with_annotation(cluster, names, "node-01", '{"driver|1.0.0": "broken"}')
    cluster.round()
    assert malformed(cluster) is not None
    # Repaired (here: the entry written back whole), the condition is removed, not set False,
    # as upstream's RemoveSkyhookConditionTypes, and the node takes part again.
    with_annotation(
        cluster, names, "node-01", json.dumps({"driver|1.0.0": entry("apply", "in_progress")})
    )
    cluster.round()
    assert malformed(cluster) is None
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    assert malformed(cluster) is None


@BOTH
def test_rule_node_state_malformed_holds_while_paused(names: SkyhookNames) -> None:
    """Upstream refreshes it before it looks at pause or disable."""
    paused = obj(names, annotations={names.pause_annotation: "true"})
    cluster = FakeCluster(skyhooks=[paused], nodes=cluster_nodes(2))
    with_annotation(cluster, names, "node-01", "{")
    cluster.round()
    found = malformed(cluster)
    assert found is not None and found["message"].endswith("1 node(s): node-01")


# --- the node is left alone ---------------------------------------------------------------------


@BOTH
def test_rule_a_malformed_node_gets_no_job_and_no_write_while_the_others_roll_out(
    names: SkyhookNames,
) -> None:
    cluster = FakeCluster(skyhooks=[obj(names)], nodes=cluster_nodes(3))
    with_annotation(cluster, names, "node-01", "{broken")
    before = cluster.nodes["node-01"]
    plans: list[RoundPlan] = []
    for _ in range(20):
        plans.append(cluster.round())
    every = [a for plan in plans for a in plan.actions]
    assert [a for a in every if touches(a, "node-01")] == []
    assert cluster.nodes["node-01"] == before
    # The others ran (an empty plan would pass the check above) and are done.
    expect_actions(every, CreateJob, node="node-00")
    assert cluster.status()["nodeStatus"] == {
        "node-00": "complete",
        "node-01": "unknown",
        "node-02": "complete",
    }
    assert malformed(cluster) is not None


# --- unknown stage or state names ---------------------------------------------------------------


@BOTH
@pytest.mark.parametrize(
    ("stage", "state"),
    [
        # A stage we do not know, in progress: the old code ran a Job of that "stage".
        ("uninstall-later", "in_progress"),
        # A stage we do not know, complete: the old code took the driver as done there and
        # started its dependent.
        ("bogus", "complete"),
        # A state we do not know: the old code ran the apply again over it.
        ("apply", "done"),
        ("config", "Complete"),
    ],
)
def test_rule_an_unknown_stage_or_state_makes_the_node_state_malformed(
    names: SkyhookNames, stage: str, state: str
) -> None:
    raw = json.dumps({"driver|1.0.0": entry(stage, state)})
    assert parse_node_state(raw) == ({}, False)
    cluster = FakeCluster(skyhooks=[obj(names)], nodes=cluster_nodes(2))
    with_annotation(cluster, names, "node-00", raw)
    plans = [cluster.round() for _ in range(6)]
    every = [a for plan in plans for a in plan.actions]
    assert [a for a in every if touches(a, "node-00")] == []
    assert cluster.nodes["node-00"].annotations[names.node_state_annotation("gpu-init")] == raw
    expect_actions(every, CreateJob, node="node-01")
    found = malformed(cluster)
    assert found is not None and found["message"].endswith("1 node(s): node-00")
    assert cluster.status()["nodeStatus"]["node-00"] == "unknown"


def test_every_stage_and_state_of_the_anchor_still_reads() -> None:
    """The guard of the rule above: no name of the anchor is taken for a malformed one."""
    for stage in STAGES:
        for state in PACKAGE_STATES:
            entries, readable = parse_node_state(json.dumps({"driver|1.0.0": entry(stage, state)}))
            assert readable, (stage, state)
            assert (entries["driver"].stage, entries["driver"].state) == (stage, state)


# --- property -----------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_NAMES = st.sampled_from(STAGES) | st.text(max_size=12)
_STATES = st.sampled_from(PACKAGE_STATES) | st.text(max_size=12)


@st.composite
def _annotations(draw: st.DrawFn) -> str:
    """Garbage of every sort: text, any JSON, and entries whose fields are drawn at random (a
    stage or state name among the anchor's or not), the rest of the entry kept."""
    kind = draw(st.sampled_from(("text", "json", "entries")))
    if kind == "text":
        return draw(st.text(min_size=1, max_size=40))
    if kind == "json":
        return json.dumps(draw(_JSON))
    entries = {}
    for package in draw(st.lists(st.sampled_from(("driver", "tuning")), min_size=1, max_size=2)):
        one: dict[str, Any] = entry(draw(_NAMES), draw(_STATES), name=package)
        if draw(st.booleans()):
            one[draw(st.sampled_from(sorted(one)))] = draw(_JSON)
        entries[f"{package}|1.0.0"] = one
    return json.dumps(entries)


@settings(max_examples=150, deadline=None)
@given(raw=_annotations(), kind=st.sampled_from(FLAVORS), rounds=st.integers(1, 4))
def test_property_a_node_state_we_cannot_trust_never_leads_to_a_job_or_a_write_there(
    raw: str, kind: SkyhookNames, rounds: int
) -> None:
    """Whatever the annotation says: either it reads, and then every entry names a stage and a
    state of the anchor's, or the node gets no action of any kind, keeps its annotation, and
    NodeStateMalformed names it; the other node rolls out meanwhile."""
    entries, readable = parse_node_state(raw)
    if readable:
        assert all(e.stage in STAGES and e.state in PACKAGE_STATES for e in entries.values())
        return
    cluster = FakeCluster(skyhooks=[obj(kind)], nodes=cluster_nodes(2))
    with_annotation(cluster, kind, "node-00", raw)
    before = cluster.nodes["node-00"]
    plans = [cluster.round() for _ in range(rounds)]
    every = [a for plan in plans for a in plan.actions]
    assert [a for a in every if touches(a, "node-00")] == []
    assert cluster.nodes["node-00"] == before
    expect_actions(every, CreateJob, node="node-01")
    expect_actions(every, SetSkyhookStatus)
    found = malformed(cluster)
    assert found is not None and found["message"].endswith("1 node(s): node-00")
