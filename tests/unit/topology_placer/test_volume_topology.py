"""Volume topology of pods naming a PersistentVolumeClaim, as `plan()` decides it for what it
can see, as kube-scheduler's VolumeBinding and VolumeRestrictions would: a bound claim's
PersistentVolume node affinity confines the pods (and preemption's victims) to its nodes, a
volume without node affinity imposes nothing, a claim missing or not bound yet is refused
naming it (the placer binds no volumes), and a ReadWriteOncePod claim serves one pod."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import BLOCK, NS, pod, pod_group, reference_nodes
from tests.unit.topology_placer.simulate import apply, state
from topology_placer.planner import (
    Bind,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Plan,
    SelectNode,
    plan,
)
from topology_placer.pods import placement_fields
from topology_placer.volumes import (
    VolumeIndex,
    claim_fields,
    storage_class_fields,
    volume_fields,
)


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
    assert "nodes ruled out by volume node affinity or zone: 8" in message


def _class(
    name: str = "local",
    mode: str = "WaitForFirstConsumer",
    provisioner: str = "csi.example.com",
    blocks: tuple[str, ...] = (),
) -> dict[str, Any]:
    made: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "uid": f"uid-sc-{name}"},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
        "parameters": {"type": "nvme"},
    }
    if blocks:
        made["allowedTopologies"] = [
            {"matchLabelExpressions": [{"key": BLOCK, "values": list(blocks)}]}
        ]
    return made


def _unbound(
    storage_class: str = "local", size: str = "100Gi", access: str = "ReadWriteOnce"
) -> dict[str, Any]:
    made = _claim("shared", access=access)
    made["spec"]["storageClassName"] = storage_class
    made["spec"]["resources"] = {"requests": {"storage": size}}
    return made


def _local_volume(
    name: str, node_name: str, size: str = "1Ti", storage_class: str = "local"
) -> dict[str, Any]:
    """A static local volume, available (no claim yet), reachable from one node."""
    made = _volume(
        name,
        "x",
        [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}
                ]
            }
        ],
    )
    del made["spec"]["claimRef"]
    made["spec"].update(
        {
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": size},
        }
    )
    made["status"] = {"phase": "Available"}
    return made


def _unbound_refusal(
    claim: dict[str, Any],
    classes: list[dict[str, Any]],
    volumes: list[dict[str, Any]] | None = None,
) -> str:
    """The refusal of a one-pod gang naming `claim`, read through the placer's projections."""
    return _refusal(
        plan(
            state(
                reference_nodes(),
                [placement_fields(p) for p in _gang(1)],
                [pod_group("gang", 1)],
                claims=[claim_fields(claim)],
                volumes=[volume_fields(v) for v in volumes or []],
                storage_classes=[storage_class_fields(c) for c in classes],
            )
        )
    )


def test_rule_an_unbound_claim_of_an_immediate_class_waits_for_the_volume_controller() -> None:
    """VolumeBinding: an unbound claim that binds at once is not the scheduler's to bind: the
    pod waits, the refusal naming the claim and its class."""
    message = _unbound_refusal(_unbound("fast"), [_class("fast", mode="Immediate")])
    assert "PersistentVolumeClaim shared is not bound (phase Pending)" in message
    assert "StorageClass fast binds it at once (Immediate)" in message


def test_rule_an_unbound_claim_without_a_class_or_with_a_missing_class_is_refused() -> None:
    message = _unbound_refusal(_unbound(""), [])
    assert (
        "PersistentVolumeClaim shared is not bound (phase Pending) and names no StorageClass"
        in (message)
    )
    message = _unbound_refusal(_unbound("gone"), [_class("local")])
    assert "its StorageClass gone does not exist" in message


def _wffc_passes(
    claim: dict[str, Any], classes: list[dict[str, Any]], passes: int
) -> tuple[list[Plan], list[dict[str, Any]], dict[str, Any]]:
    """`passes` passes over a two-pod gang naming `claim` (one claim each: shared-0, shared-1),
    each applying the last one's nominations, bindings and selected-node annotations, as
    k8s-watcher and the API server would; read through the placer's projections."""
    claims = []
    gang = []
    for rank in range(2):
        made = copy.deepcopy(claim)
        made["metadata"]["name"] = f"shared-{rank}"
        made["metadata"]["uid"] = f"uid-pvc-shared-{rank}"
        made["metadata"]["resourceVersion"] = "1"
        claims.append(made)
        gang.append(_with_claim(pod(f"worker-{rank}", "gang", gpus=8), f"shared-{rank}"))
    results: list[Plan] = []
    for _ in range(passes):
        result = plan(
            state(
                reference_nodes(),
                [placement_fields(p) for p in gang],
                [pod_group("gang", 2)],
                claims=[claim_fields(c) for c in claims],
                storage_classes=[storage_class_fields(c) for c in classes],
            )
        )
        results.append(result)
        gang = apply(gang, result)
        for action in result.actions:
            if isinstance(action, SelectNode):
                made = next(c for c in claims if c["metadata"]["name"] == action.claim)
                annotations = made["metadata"].setdefault("annotations", {})
                annotations["volume.kubernetes.io/selected-node"] = action.node
                made["metadata"]["resourceVersion"] = "2"
    return results, gang, {c["metadata"]["name"]: c for c in claims}


def test_rule_wait_for_first_consumer_claims_are_annotated_with_the_node_before_the_bind() -> None:
    """VolumeBinding on a delayed claim its class provisions: the members are placed on nodes
    of its allowedTopologies (blocks b3, b4), each claim is annotated with its pod's node
    (volume.kubernetes.io/selected-node, so the provisioner makes the volume there), and only
    once KV shows the annotations are the pods bound, each to its claim's node."""
    results, gang, claims = _wffc_passes(_unbound(), [_class(blocks=("b3", "b4"))], passes=3)
    nominated, annotated, bound = results
    assert set(_placed(nominated).values()) <= {"node5", "node6", "node7", "node8"}
    assert not [a for a in nominated.actions if isinstance(a, SelectNode | Bind)]
    selections = [a for a in annotated.actions if isinstance(a, SelectNode)]
    assert {(s.claim, s.node) for s in selections} == {
        (f"shared-{rank}", _placed(nominated)[f"worker-{rank}"]) for rank in range(2)
    }
    assert not [a for a in annotated.actions if isinstance(a, Bind)]
    binds = {a.pod.name: a.node for a in bound.actions if isinstance(a, Bind)}
    assert binds == _placed(nominated)
    for rank in range(2):
        annotations = claims[f"shared-{rank}"]["metadata"]["annotations"]
        assert annotations["volume.kubernetes.io/selected-node"] == binds[f"worker-{rank}"]
    assert all(p["spec"].get("nodeName") for p in gang)


def test_rule_wait_for_first_consumer_members_sharing_one_claim_never_get_two_nodes() -> None:
    """Two members of one gang name the same unbound WaitForFirstConsumer claim (RWO or RWX):
    placed at once they could land on two nodes, and one claim cannot be provisioned on both.
    They are refused, naming the claim and the other pod, and no selected-node is written;
    once the claim names its node (another writer, the user) both may go only there."""
    for access in ("ReadWriteOnce", "ReadWriteMany"):
        claim = _unbound(access=access)
        gang = [_with_claim(pod(f"worker-{r}", "gang", gpus=4), "shared") for r in range(2)]
        result = plan(
            state(
                reference_nodes(),
                [placement_fields(p) for p in gang],
                [pod_group("gang", 2)],
                claims=[claim_fields(claim)],
                storage_classes=[storage_class_fields(_class())],
            )
        )
        assert not [a for a in result.actions if isinstance(a, SelectNode | Nominate | Bind)]
        message = _refusal(result)
        assert "PersistentVolumeClaim shared waits for its first consumer" in message
        assert "names it too" in message and "never two nodes for one claim" in message
        claim["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "node3"}
        result = plan(
            state(
                reference_nodes(),
                [placement_fields(p) for p in gang],
                [pod_group("gang", 2)],
                claims=[claim_fields(claim)],
                storage_classes=[storage_class_fields(_class())],
            )
        )
        assert _placed(result) == {"worker-0": "node3", "worker-1": "node3"}


def test_rule_wait_for_first_consumer_nodes_are_those_of_the_class_allowed_topologies() -> None:
    """No node in the class's allowedTopologies: refused, saying so, never placed."""
    message = _unbound_refusal(_unbound(), [_class(blocks=("b9",))])
    assert "PersistentVolumeClaim shared waits for its first consumer" in message
    assert "no node can take the pod: none is in its StorageClass's allowedTopologies" in message


def test_rule_wait_for_first_consumer_static_volumes_are_not_bound_by_the_placer() -> None:
    """A class without a provisioner (local volumes): the scheduler itself binds a fitting
    available volume, which the placer does not do: refused, saying how many nodes an
    available volume of the class, large enough, offering the claim's access modes, reaches."""
    local = _class(provisioner="kubernetes.io/no-provisioner")
    volumes = [
        _local_volume("pv-node7", "node7"),
        _local_volume("pv-small", "node1", size="10Gi"),
        _local_volume("pv-other-class", "node2", storage_class="other"),
    ]
    message = _unbound_refusal(_unbound(), [local], volumes)
    assert "its StorageClass has no provisioner: 1 nodes could take the pod" in message
    assert "the topology placer does not bind volumes" in message
    message = _unbound_refusal(_unbound(access="ReadWriteMany"), [local], volumes)
    assert "0 nodes could take the pod" in message


def test_rule_wait_for_first_consumer_a_selected_node_is_the_only_node() -> None:
    """A claim already annotated (an earlier pass, or another scheduler) takes its pod to that
    node alone; one naming a node that is gone admits none."""
    solo = _unbound()
    solo["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "node3"}
    result = plan(
        state(
            reference_nodes(),
            [placement_fields(p) for p in _gang(1)],
            [pod_group("gang", 1)],
            claims=[claim_fields(solo)],
            storage_classes=[storage_class_fields(_class())],
        )
    )
    assert _placed(result) == {"worker-0": "node3"}
    solo["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "gone"}
    message = _unbound_refusal(solo, [_class()])
    assert "no node can take the pod: none is in node gone" in message


def test_rule_wait_for_first_consumer_filter_reads_each_node() -> None:
    """The filter itself, node by node: a provisioned class's allowed topologies (a static
    volume is not what its claim gets); a class without a provisioner, its volumes' nodes."""
    volumes = [volume_fields(_local_volume("pv-node1", "node1"))]
    for storage_class, expected in (
        (_class(blocks=("b4",)), ["node7", "node8"]),
        (_class(provisioner="kubernetes.io/no-provisioner"), ["node1"]),
    ):
        index = VolumeIndex(
            [claim_fields(_unbound())], volumes, [storage_class_fields(storage_class)]
        )
        needs = index.needs(NS, ("shared",))
        assert not isinstance(needs, str)
        assert [n["metadata"]["name"] for n in reference_nodes() if needs.admit(n)] == expected


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


ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
LEGACY_ZONE = "failure-domain.beta.kubernetes.io/zone"


def _zoned_nodes(zone_key: str = ZONE) -> list[dict[str, Any]]:
    """The reference nodes, spine s1 in zone-a and s2 in zone-b, all in region-1."""
    nodes = reference_nodes()
    for each in nodes:
        labels = each["metadata"]["labels"]
        labels[zone_key] = "zone-a" if labels[BLOCK] in ("b1", "b2") else "zone-b"
        labels[REGION] = "region-1"
    return nodes


_BLOCKS = ("b1", "b2", "b3", "b4")


@settings(max_examples=60, deadline=None)
@given(
    reach=st.lists(st.sets(st.sampled_from(_BLOCKS), max_size=4), min_size=1, max_size=3),
    members=st.integers(min_value=1, max_value=4),
    gpus=st.sampled_from([2, 4, 8]),
    busy=st.lists(st.integers(min_value=1, max_value=8), max_size=6),
    priority=st.sampled_from([0, 100]),
    zones=st.lists(st.sampled_from(["", "zone-a", "zone-b", "zone-a__zone-b"]), max_size=3),
)
def test_property_no_plan_puts_a_pod_where_its_bound_volume_cannot_follow(
    reach: list[set[str]],
    members: int,
    gpus: int,
    busy: list[int],
    priority: int,
    zones: list[str],
) -> None:
    """Whatever the volumes reach (node affinity, zone labels), the gang's size and the pods
    already there (evictable or not), no nomination or binding of a member is on a node
    outside every one of its volumes' node affinity and zones, and no pod is evicted off a
    node those volumes do not admit."""
    nodes = _zoned_nodes()
    block_of = {n["metadata"]["name"]: n["metadata"]["labels"][BLOCK] for n in nodes}
    zone_of = {n["metadata"]["name"]: n["metadata"]["labels"][ZONE] for n in nodes}
    claims, volumes, volume_entries = [], [], []
    for index, blocks in enumerate(reach):
        claims.append(_claim(f"c{index}", f"pv{index}"))
        volume = _volume(f"pv{index}", f"c{index}", _in_blocks(*sorted(blocks)))
        zone = zones[index] if index < len(zones) else ""
        if zone:
            volume["metadata"]["labels"] = {ZONE: zone}
        volumes.append(volume)
        volume_entries.append(
            {"name": f"v{index}", "persistentVolumeClaim": {"claimName": f"c{index}"}}
        )
    admitted = {
        name
        for name, block in block_of.items()
        if all(block in r for r in reach)
        and all(not z or zone_of[name] in z.split("__") for z in zones[: len(reach)])
    }
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


def _labelled_volume(labels: dict[str, str]) -> dict[str, Any]:
    volume = _volume("data", "shared")
    volume["metadata"]["labels"] = {"app": "ckpt", **labels}
    return volume


def _zone_plan(nodes: list[dict[str, Any]], labels: dict[str, str], members: int = 2) -> Plan:
    pods = [placement_fields(p) for p in _gang(members)]
    claims = [claim_fields(_claim("shared", "data"))]
    volumes = [volume_fields(_labelled_volume(labels))]
    return plan(state(nodes, pods, [pod_group("gang", members)], claims=claims, volumes=volumes))


def test_rule_volume_zone_a_bound_volumes_zone_label_confines_the_pods_to_that_zone() -> None:
    """VolumeZone: a volume labelled zone-b (and region-1) takes the gang to spine s2's nodes
    (read through the placer's own projections); five full-node members do not fit in
    zone-b's four nodes: refused, never misplaced."""
    placed = _placed(_zone_plan(_zoned_nodes(), {ZONE: "zone-b", REGION: "region-1"}))
    assert sorted(placed.values()) == ["node5", "node6"]
    message = _refusal(_zone_plan(_zoned_nodes(), {ZONE: "zone-b"}, members=5))
    assert "nodes ruled out by volume node affinity or zone: 4" in message


def test_rule_volume_zone_a_region_mismatch_rules_every_node_out() -> None:
    message = _refusal(_zone_plan(_zoned_nodes(), {REGION: "region-2"}, members=1))
    assert "nodes ruled out by volume node affinity or zone: 8" in message


def test_rule_volume_zone_a_label_may_list_several_zones_separated_by_double_underscores() -> None:
    placed = _placed(_zone_plan(_zoned_nodes(), {ZONE: "zone-c__ zone-b"}, members=4))
    assert sorted(placed.values()) == ["node5", "node6", "node7", "node8"]


def test_rule_volume_zone_legacy_labels_match_the_nodes_legacy_or_ga_label() -> None:
    """A legacy failure-domain label on the volume is read on the node under its own key, else
    under its GA name (a node relabelled to topology.kubernetes.io/zone only)."""
    for node_key in (LEGACY_ZONE, ZONE):
        placed = _placed(_zone_plan(_zoned_nodes(node_key), {LEGACY_ZONE: "zone-b"}))
        assert set(placed.values()) <= {"node5", "node6", "node7", "node8"}, node_key
        assert len(placed) == 2


def test_rule_volume_zone_a_node_without_zone_labels_takes_any_volume() -> None:
    """A single-zone cluster whose nodes carry no zone label: the volume's label imposes
    nothing, as upstream; nor does a label whose value does not parse."""
    assert len(_placed(_zone_plan(reference_nodes(), {ZONE: "zone-b"}))) == 2
    assert len(_placed(_zone_plan(_zoned_nodes(), {ZONE: "zone-z__"}))) == 2


def test_rule_volume_zone_the_kept_volume_carries_its_zone_labels_only() -> None:
    kept = volume_fields(_labelled_volume({ZONE: "zone-b", LEGACY_ZONE: "zone-b"}))
    assert kept["metadata"]["labels"] == {ZONE: "zone-b", LEGACY_ZONE: "zone-b"}
    assert "labels" not in volume_fields(_volume("data", "shared"))["metadata"]


def test_rule_volume_zone_preemption_evicts_only_in_the_volumes_zone() -> None:
    nodes = _zoned_nodes()
    low = [
        pod(f"low-{i}", None, gpus=8, node_name=f"node{i}", phase="Running", owner=f"job-{i}")
        for i in range(1, 9)
    ]
    claims = [_claim("shared", "data")]
    volumes = [_labelled_volume({ZONE: "zone-b"})]
    gang = _gang(4, priority=100)
    result = plan(
        state(nodes, [*low, *gang], [pod_group("gang", 4)], claims=claims, volumes=volumes)
    )
    victims = {a.pod.name for a in result.actions if isinstance(a, Disrupt)}
    assert victims == {"low-5", "low-6", "low-7", "low-8"}


@settings(max_examples=40, deadline=None)
@given(
    blocks=st.sets(st.sampled_from(_BLOCKS), max_size=4),
    members=st.integers(min_value=1, max_value=3),
    gpus=st.sampled_from([4, 8]),
    annotate_lands=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_property_no_pod_is_bound_before_its_claims_name_its_node(
    blocks: set[str], members: int, gpus: int, annotate_lands: list[bool]
) -> None:
    """Whatever the class allows and whether each pass's annotations land, a pod with a
    WaitForFirstConsumer claim is bound only to the node its claim's selected-node already
    names, and only to a node of the class's allowedTopologies."""
    nodes = reference_nodes()
    allowed = {n["metadata"]["name"] for n in nodes if n["metadata"]["labels"][BLOCK] in blocks}
    storage_class = _class(blocks=tuple(sorted(blocks))) if blocks else _class()
    if not blocks:
        allowed = {n["metadata"]["name"] for n in nodes}
    claims = {}
    gang = []
    for rank in range(members):
        made = _unbound()
        made["metadata"].update(
            {"name": f"c-{rank}", "uid": f"uid-c-{rank}", "resourceVersion": "1"}
        )
        claims[f"c-{rank}"] = made
        gang.append(_with_claim(pod(f"worker-{rank}", "gang", gpus=gpus), f"c-{rank}"))
    for lands in annotate_lands:
        result = plan(
            state(
                nodes,
                [placement_fields(p) for p in gang],
                [pod_group("gang", members)],
                claims=[claim_fields(c) for c in claims.values()],
                storage_classes=[storage_class_fields(storage_class)],
            )
        )
        for action in result.actions:
            if isinstance(action, Nominate | Bind) and action.node:
                assert action.node in allowed, action
            if isinstance(action, Bind):
                claim = claims[f"c-{action.pod.name.removeprefix('worker-')}"]
                selected = claim["metadata"].get("annotations", {})
                assert selected.get("volume.kubernetes.io/selected-node") == action.node
        gang = apply(gang, result)
        if lands:
            for action in result.actions:
                if isinstance(action, SelectNode):
                    claim = claims[action.claim]
                    claim["metadata"].setdefault("annotations", {})[
                        "volume.kubernetes.io/selected-node"
                    ] = action.node
                    claim["metadata"]["resourceVersion"] = "2"
