"""Volume topology of pods naming a PersistentVolumeClaim, as `plan()` decides it for what it
can see, as kube-scheduler's VolumeBinding and VolumeRestrictions would: a bound claim's
PersistentVolume node affinity confines the pods (and preemption's victims) to its nodes, a
volume without node affinity imposes nothing, a claim missing or not bound yet is refused
naming it (the placer binds no volumes), and a ReadWriteOncePod claim serves one pod."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import BLOCK, NS, pod, pod_group, reference_nodes
from tests.unit.topology_placer.simulate import state
from topology_placer.planner import Bind, Disrupt, MarkUnschedulable, Nominate, Plan, plan
from topology_placer.pods import placement_fields
from topology_placer.volumes import claim_fields, volume_fields


def _with_claim(obj: dict[str, Any], claim: str, volume: str = "data") -> dict[str, Any]:
    obj["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {}},
        {"name": volume, "persistentVolumeClaim": {"claimName": claim}},
    ]
    return obj


def _claim(
    name: str, volume_name: str = "", access: str = "ReadWriteMany", phase: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [access], "storageClassName": "shared"}
    if volume_name:
        spec["volumeName"] = volume_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-pvc-{name}"},
        "spec": spec,
        "status": {"phase": phase or ("Bound" if volume_name else "Pending")},
    }


def _volume(
    name: str, claim: str, terms: list[dict[str, Any]] | None = None, access: str = "ReadWriteMany"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Ti"},
        "accessModes": [access],
        "nfs": {"server": "nfs.example", "path": f"/{name}"},
        "claimRef": {"namespace": NS, "name": claim, "uid": f"uid-pvc-{claim}"},
    }
    if terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "uid": f"uid-pv-{name}"},
        "spec": spec,
        "status": {"phase": "Bound"},
    }


def _in_blocks(*blocks: str) -> list[dict[str, Any]]:
    return [{"matchExpressions": [{"key": BLOCK, "operator": "In", "values": list(blocks)}]}]


def _gang(size: int, claim: str = "shared", **kwargs: Any) -> list[dict[str, Any]]:
    return [_with_claim(pod(f"worker-{i}", "gang", gpus=8, **kwargs), claim) for i in range(size)]


def _placed(result: Plan) -> dict[str, str]:
    return {a.pod.name: a.node for a in result.actions if isinstance(a, Nominate) and a.node}


def _refusal(result: Plan) -> str:
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    marks = expect_actions(result.actions, MarkUnschedulable)
    assert {m.reason for m in marks} == {"Unschedulable"}
    return str(marks[0].message)


def test_rule_a_bound_read_write_many_claim_without_node_affinity_places_the_gang() -> None:
    """The training job mounting shared storage: its volume imposes no node, so the gang is
    placed as any other (read through the placer's own projections, as the service does)."""
    pods = [placement_fields(p) for p in _gang(2)]
    claims = [claim_fields(_claim("shared", "data"))]
    volumes = [volume_fields(_volume("data", "shared"))]
    result = plan(
        state(reference_nodes(), pods, [pod_group("gang", 2)], claims=claims, volumes=volumes)
    )
    assert len(_placed(result)) == 2


def test_rule_a_bound_volume_node_affinity_confines_the_gang_to_matching_nodes() -> None:
    """The volume is reachable from block b3 only: both members go there, every time."""
    claims = [claim_fields(_claim("shared", "data"))]
    volumes = [volume_fields(_volume("data", "shared", _in_blocks("b3")))]
    pods = [placement_fields(p) for p in _gang(2)]
    result = plan(
        state(reference_nodes(), pods, [pod_group("gang", 2)], claims=claims, volumes=volumes)
    )
    assert sorted(_placed(result).values()) == ["node5", "node6"]
    # Three full-node members do not fit in the volume's two nodes: refused, never misplaced.
    three = [placement_fields(p) for p in _gang(3)]
    result = plan(
        state(reference_nodes(), three, [pod_group("gang", 3)], claims=claims, volumes=volumes)
    )
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)


def test_rule_each_volume_of_a_pod_must_admit_its_node() -> None:
    """Two claims whose volumes reach blocks b2-b3 and b3-b4: only b3 serves both."""
    member = pod("worker-0", None, gpus=8)
    member["spec"]["volumes"] = [
        {"name": "a", "persistentVolumeClaim": {"claimName": "ckpt"}},
        {"name": "b", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    claims = [_claim("ckpt", "pv-ckpt"), _claim("data", "pv-data")]
    volumes = [
        _volume("pv-ckpt", "ckpt", _in_blocks("b2", "b3")),
        _volume("pv-data", "data", _in_blocks("b3", "b4")),
    ]
    result = plan(state(reference_nodes(), [member], claims=claims, volumes=volumes))
    assert _placed(result)["worker-0"] in {"node5", "node6"}


def test_rule_a_volume_node_affinity_with_no_term_matches_no_node() -> None:
    """Refused, saying how many nodes the volume ruled out."""
    claims = [_claim("shared", "data")]
    volumes = [_volume("data", "shared", [])]
    message = _refusal(
        plan(
            state(
                reference_nodes(),
                _gang(1),
                [pod_group("gang", 1)],
                claims=claims,
                volumes=volumes,
            )
        )
    )
    assert "nodes ruled out by volume node affinity: 8" in message


def test_rule_an_unbound_claim_is_refused_naming_it() -> None:
    """The placer binds no volumes (Immediate nor WaitForFirstConsumer): the pod waits."""
    claims = [claim_fields(_claim("shared"))]
    message = _refusal(
        plan(state(reference_nodes(), _gang(2), [pod_group("gang", 2)], claims=claims))
    )
    assert "PersistentVolumeClaim shared is not bound" in message
    assert "does not bind volumes (WaitForFirstConsumer)" in message


def test_rule_a_missing_claim_is_refused_naming_it() -> None:
    message = _refusal(plan(state(reference_nodes(), _gang(2), [pod_group("gang", 2)])))
    assert "PersistentVolumeClaim shared not found" in message


def test_rule_a_claim_bound_to_a_missing_volume_or_being_deleted_is_refused() -> None:
    claims = [_claim("shared", "gone")]
    message = _refusal(
        plan(state(reference_nodes(), _gang(1), [pod_group("gang", 1)], claims=claims))
    )
    assert "bound to PersistentVolume gone, which does not exist" in message
    deleting = _claim("shared", "data")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    volumes = [_volume("data", "shared")]
    message = _refusal(
        plan(
            state(
                reference_nodes(),
                _gang(1),
                [pod_group("gang", 1)],
                claims=[deleting],
                volumes=volumes,
            )
        )
    )
    assert "PersistentVolumeClaim shared is being deleted" in message


def test_rule_a_volume_bound_to_another_claim_is_refused() -> None:
    claims = [_claim("shared", "data")]
    volumes = [_volume("data", "someone-else")]
    message = _refusal(
        plan(
            state(
                reference_nodes(), _gang(1), [pod_group("gang", 1)], claims=claims, volumes=volumes
            )
        )
    )
    assert "PersistentVolume data is bound to another claim" in message


def test_rule_a_read_write_once_pod_claim_serves_one_pod_only() -> None:
    """VolumeRestrictions: alone, the pod places; while a bound pod (read through the
    placer's projection) uses the claim, another pod naming it is refused; two members of one
    gang naming it are refused too."""
    claims = [_claim("solo", "pv-solo", access="ReadWriteOncePod")]
    volumes = [_volume("pv-solo", "solo", access="ReadWriteOncePod")]
    alone = plan(
        state(
            reference_nodes(),
            _gang(1, "solo"),
            [pod_group("gang", 1)],
            claims=claims,
            volumes=volumes,
        )
    )
    assert len(_placed(alone)) == 1
    user = _with_claim(pod("user", None, gpus=1, node_name="node1", phase="Running"), "solo")
    pods = [placement_fields(p) for p in [user, *_gang(1, "solo")]]
    message = _refusal(
        plan(state(reference_nodes(), pods, [pod_group("gang", 1)], claims=claims, volumes=volumes))
    )
    assert "PersistentVolumeClaim solo is ReadWriteOncePod and already used by pod user" in message
    message = _refusal(
        plan(
            state(
                reference_nodes(),
                _gang(2, "solo"),
                [pod_group("gang", 2)],
                claims=claims,
                volumes=volumes,
            )
        )
    )
    assert "ReadWriteOncePod and already used by pod worker-" in message


def test_rule_preemption_evicts_only_where_the_volume_lets_the_gang_go() -> None:
    """Every node is full of lower-priority jobs; the volume reaches block b3: the victims are
    the pods on node5 and node6 alone."""
    nodes = reference_nodes()
    low = [
        pod(f"low-{i}", None, gpus=8, node_name=f"node{i}", phase="Running", owner=f"job-{i}")
        for i in range(1, 9)
    ]
    claims = [_claim("shared", "data")]
    volumes = [_volume("data", "shared", _in_blocks("b3"))]
    gang = _gang(2, priority=100)
    result = plan(
        state(nodes, [*low, *gang], [pod_group("gang", 2)], claims=claims, volumes=volumes)
    )
    victims = {a.pod.name for a in result.actions if isinstance(a, Disrupt)}
    assert victims == {"low-5", "low-6"}


_BLOCKS = ("b1", "b2", "b3", "b4")


@settings(max_examples=60, deadline=None)
@given(
    reach=st.lists(st.sets(st.sampled_from(_BLOCKS), max_size=4), min_size=1, max_size=3),
    members=st.integers(min_value=1, max_value=4),
    gpus=st.sampled_from([2, 4, 8]),
    busy=st.lists(st.integers(min_value=1, max_value=8), max_size=6),
    priority=st.sampled_from([0, 100]),
)
def test_property_no_plan_puts_a_pod_where_its_bound_volume_cannot_follow(
    reach: list[set[str]], members: int, gpus: int, busy: list[int], priority: int
) -> None:
    """Whatever the volumes reach, the gang's size and the pods already there (evictable or
    not), no nomination or binding of a member is on a node outside every one of its volumes'
    node affinity, and no pod is evicted off a node those volumes do not admit."""
    nodes = reference_nodes()
    block_of = {n["metadata"]["name"]: n["metadata"]["labels"][BLOCK] for n in nodes}
    claims, volumes, volume_entries = [], [], []
    for index, blocks in enumerate(reach):
        claims.append(_claim(f"c{index}", f"pv{index}"))
        volumes.append(_volume(f"pv{index}", f"c{index}", _in_blocks(*sorted(blocks))))
        volume_entries.append(
            {"name": f"v{index}", "persistentVolumeClaim": {"claimName": f"c{index}"}}
        )
    admitted = {name for name, block in block_of.items() if all(block in r for r in reach)}
    gang = []
    for i in range(members):
        member = pod(f"worker-{i}", "gang", gpus=gpus, priority=priority)
        member["spec"]["volumes"] = list(volume_entries)
        gang.append(member)
    others = [
        pod(f"low-{i}", None, gpus=8, node_name=f"node{n}", phase="Running", owner=f"job-{i}")
        for i, n in enumerate(dict.fromkeys(busy))
    ]
    result = plan(
        state(nodes, [*others, *gang], [pod_group("gang", members)], claims=claims, volumes=volumes)
    )
    for action in result.actions:
        if isinstance(action, Nominate | Bind) and action.node:
            assert action.node in admitted, (action, admitted)
        if isinstance(action, Disrupt):
            victim = next(p for p in others if p["metadata"]["name"] == action.pod.name)
            assert victim["spec"]["nodeName"] in admitted
