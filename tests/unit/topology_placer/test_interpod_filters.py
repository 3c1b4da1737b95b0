"""The inter-pod filters kube-scheduler users rely on, as `plan()` honours them (issue #31
item 6): hostPort conflicts (NodePorts), required pod affinity and anti-affinity, symmetric
anti-affinity and the first pod of its kind (InterPodAffinity), DoNotSchedule spread with
minDomains, nodeAffinityPolicy and nodeTaintsPolicy (PodTopologySpread); and what the placer
does not check (generic ephemeral volumes, DRA, namespaceSelector) refused, never
misplaced."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import (
    BLOCK,
    TOPOLOGY,
    node,
    pod,
    pod_group,
    reference_nodes,
)
from tests.unit.topology_placer.simulate import apply, run, state
from topology_placer.inflight import InFlight
from topology_placer.interpod import HostPort, constraints_of
from topology_placer.planner import Bind, Disrupt, MarkUnschedulable, Nominate, plan
from topology_placer.pods import placement_fields

HOSTNAME = "kubernetes.io/hostname"


def _with_ports(obj: dict[str, Any], *ports: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": 1, **p} for p in ports]
    return obj


def _labelled(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    obj["metadata"]["labels"].update(labels)
    return obj


def _term(topology_key: str, **match: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": match}, "topologyKey": topology_key}


def _anti(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def _affine(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def _spread(obj: dict[str, Any], **constraint: Any) -> dict[str, Any]:
    obj["spec"].setdefault("topologySpreadConstraints", []).append(
        {"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule", **constraint}
    )
    return obj


def _placed(result: Any) -> dict[str, str]:
    return {a.pod.name: a.node for a in result.actions if isinstance(a, Nominate) and a.node}


def _busy(index: int, node_name: str, **kwargs: Any) -> dict[str, Any]:
    """A small bound pod of another job (no GPUs): it leaves its node's slots as they were."""
    return pod(f"busy-{index}", None, gpus=0, node_name=node_name, phase="Running", **kwargs)


def _filler(node_name: str) -> dict[str, Any]:
    """A bound pod taking half of a node's CPU: the gather, filling the roomiest nodes first,
    would otherwise pick that node for the pod under test by chance."""
    return pod(f"filler-{node_name}", None, gpus=0, cpu="4", node_name=node_name, phase="Running")


def _block_of(node_name: str, nodes: list[dict[str, Any]]) -> str:
    return str(
        next(n for n in nodes if n["metadata"]["name"] == node_name)["metadata"]["labels"][BLOCK]
    )


# --- hostPort (NodePorts) -----------------------------------------------------------------


def test_rule_hostport_taken_by_a_bound_pod_keeps_the_pod_off_that_node() -> None:
    nodes = reference_nodes()
    busy = [_with_ports(_busy(i, f"node{i}"), {"hostPort": 8080}) for i in range(1, 8)]
    web = _with_ports(pod("web", None, gpus=1), {"hostPort": 8080})
    result = plan(state(nodes, [*busy, _filler("node8"), web]))
    assert _placed(result) == {"web": "node8"}


def test_rule_hostport_conflicts_only_on_same_protocol_port_and_overlapping_ip() -> None:
    """Same port over UDP, or on another specific hostIP, is no conflict; an unset hostIP
    (0.0.0.0) overlaps every address."""
    nodes = reference_nodes()
    busy = [_with_ports(_busy(i, f"node{i}"), {"hostPort": 53}) for i in range(1, 8)]
    # node8's pod binds 53 on one address only: a pod on another address may share it.
    busy.append(_with_ports(_busy(8, "node8"), {"hostPort": 53, "hostIP": "10.0.0.1"}))
    other_ip = _with_ports(pod("dns-b", None, gpus=1), {"hostPort": 53, "hostIP": "10.0.0.2"})
    assert _placed(plan(state(nodes, [*busy, other_ip]))) == {"dns-b": "node8"}
    udp = _with_ports(pod("dns-udp", None, gpus=1), {"hostPort": 53, "protocol": "UDP"})
    assert _placed(plan(state(nodes, [*busy, udp])))
    wildcard = _with_ports(pod("dns-any", None, gpus=1), {"hostPort": 53})
    result = plan(state(nodes, [*busy, wildcard]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    assert "hostPort" in expect_actions(result.actions, MarkUnschedulable)[0].message
    assert HostPort("TCP", "0.0.0.0", 53).conflicts(HostPort("TCP", "10.0.0.1", 53))
    assert not HostPort("TCP", "10.0.0.2", 53).conflicts(HostPort("TCP", "10.0.0.1", 53))
    assert not HostPort("UDP", "0.0.0.0", 53).conflicts(HostPort("TCP", "0.0.0.0", 53))


def test_rule_hostport_gang_members_sharing_a_port_go_to_different_nodes() -> None:
    nodes = reference_nodes()
    members = [_with_ports(pod(f"w-{i}", gpus=1), {"hostPort": 9000}) for i in range(4)]
    result = plan(state(nodes, members, [pod_group("gang", 4)]))
    placed = _placed(result)
    assert len(placed) == 4 and len(set(placed.values())) == 4


def test_rule_hostport_pods_placed_in_one_pass_see_each_others_reservations() -> None:
    nodes = reference_nodes()
    first = _with_ports(pod("web-a", None, gpus=1), {"hostPort": 8080})
    second = _with_ports(pod("web-b", None, gpus=1), {"hostPort": 8080})
    # node1 the roomiest by far: without the filter both would be put there.
    fillers = [_filler(f"node{i}") for i in range(2, 9)]
    placed = _placed(plan(state(nodes, [*fillers, first, second])))
    assert len(placed) == 2 and placed["web-a"] != placed["web-b"]


def test_rule_hostport_a_reservation_is_not_bound_once_a_conflicting_pod_holds_the_node() -> None:
    """Nominated to node1 in an earlier pass; since then a pod of another scheduler bound to
    node1 took the port: binding there would misplace it, it is placed again elsewhere."""
    nodes = reference_nodes()
    squatter = _with_ports(_busy(1, "node1"), {"hostPort": 8080})
    web = _with_ports(pod("web", None, gpus=1, nominated="node1"), {"hostPort": 8080})
    result = plan(state(nodes, [squatter, web]))
    expect_no_actions(result.actions, Bind, while_it_has=Nominate)
    assert _placed(result)["web"] != "node1"


def test_rule_hostport_a_nomination_in_flight_holds_its_port() -> None:
    """web-a's nomination to node1 is on its way (the command ledger): web-b, placed in the
    same pass, must not take node1 for the same port."""
    nodes = reference_nodes()
    first = _with_ports(pod("web-a", None, gpus=1), {"hostPort": 8080})
    second = _with_ports(pod("web-b", None, gpus=1), {"hostPort": 8080})
    fillers = [_filler(f"node{i}") for i in range(2, 9)]
    held = InFlight(
        pods=frozenset({("default", "web-a")}), nominations={("default", "web-a"): "node1"}
    )
    result = plan(replace(state(nodes, [*fillers, first, second]), in_flight=held))
    placed = _placed(result)
    assert "web-a" not in placed and placed["web-b"] != "node1"


def test_rule_hostport_preemption_evicts_where_no_higher_priority_pod_holds_the_port() -> None:
    """Every node is full of lower-priority pods; on node1..node7 a pod of higher priority
    holds the port as well: the preemption goes to node8, where evicting frees the way."""
    nodes = reference_nodes()
    low = [
        pod(f"low-{i}", None, gpus=8, node_name=f"node{i}", phase="Running", priority=1)
        for i in range(1, 9)
    ]
    keepers = [
        _with_ports(_busy(i, f"node{i}", priority=1000), {"hostPort": 8080}) for i in range(1, 8)
    ]
    web = _with_ports(pod("web", None, gpus=8, priority=100), {"hostPort": 8080})
    result = plan(state(nodes, [*low, *keepers, web]))
    assert [d.pod.name for d in result.actions if isinstance(d, Disrupt)] == ["low-8"]
    assert _placed(result) == {"web": "node8"}


def test_rule_hostport_of_a_sidecar_counts_as_upstream_nodeports_reads_containers() -> None:
    nodes = reference_nodes()
    busy = []
    for i in range(1, 8):
        sidecar = _busy(i, f"node{i}")
        sidecar["spec"]["initContainers"] = [
            {"name": "proxy", "restartPolicy": "Always", "ports": [{"hostPort": 15001}]}
        ]
        busy.append(sidecar)
    incoming = _with_ports(pod("mesh", None, gpus=1), {"hostPort": 15001})
    assert _placed(plan(state(nodes, [*busy, _filler("node8"), incoming]))) == {"mesh": "node8"}


# --- required inter-pod anti-affinity and affinity (InterPodAffinity) -----------------------


def test_rule_required_anti_affinity_keeps_the_pod_from_matching_pods_domains() -> None:
    nodes = reference_nodes()
    busy = [_labelled(_busy(i, f"node{i}"), app="db") for i in range(1, 8)]
    incoming = pod("web", None, gpus=1, affinity=_anti(_term(HOSTNAME, app="db")))
    assert _placed(plan(state(nodes, [*busy, incoming]))) == {"web": "node8"}
    # At the block level: db only in blocks b1..b3 (node1..node6) leaves b4.
    busy = [_labelled(_busy(i, f"node{i}"), app="db") for i in range(1, 6)]
    zonal = pod("web2", None, gpus=1, affinity=_anti(_term(BLOCK, app="db")))
    placed = _placed(plan(state(nodes, [*busy, zonal])))
    assert placed and _block_of(placed["web2"], nodes) == "b4"


def test_rule_required_anti_affinity_is_symmetric_an_existing_pods_term_repels() -> None:
    nodes = reference_nodes()
    busy = [_busy(i, f"node{i}", affinity=_anti(_term(HOSTNAME, app="web"))) for i in range(1, 8)]
    incoming = _labelled(pod("web", None, gpus=1), app="web")
    assert _placed(plan(state(nodes, [*busy, _filler("node8"), incoming]))) == {"web": "node8"}
    # A pod the term does not match is not repelled.
    other = _labelled(pod("batch", None, gpus=8), app="batch")
    assert _placed(plan(state(nodes, [*busy, other])))


def test_rule_required_anti_affinity_among_gang_members_one_per_node() -> None:
    nodes = reference_nodes()
    members = [
        _labelled(pod(f"w-{i}", gpus=1, affinity=_anti(_term(HOSTNAME, job="train"))), job="train")
        for i in range(4)
    ]
    placed = _placed(plan(state(nodes, members, [pod_group("gang", 4)])))
    assert len(placed) == 4 and len(set(placed.values())) == 4


def test_rule_required_anti_affinity_among_members_at_block_level_is_never_misplaced() -> None:
    """Members repelling each other per block cannot share a node or a block: the gather
    packs, so the placement is refused (never nominated against the rule)."""
    nodes = reference_nodes()
    members = [
        _labelled(pod(f"w-{i}", gpus=1, affinity=_anti(_term(BLOCK, job="train"))), job="train")
        for i in range(2)
    ]
    result = plan(state(nodes, members, [pod_group("gang", 2)]))
    placed = _placed(result)
    assert len({_block_of(n, nodes) for n in placed.values()}) == len(placed)
    if not placed:
        marks = expect_actions(result.actions, MarkUnschedulable)
        assert "anti-affinity" in marks[0].message


def test_rule_required_anti_affinity_term_namespaces_and_match_label_keys() -> None:
    """A term reads the pod's own namespace unless it lists `namespaces` ({} selector: all);
    matchLabelKeys narrows it to pods sharing the pod's value of those labels."""
    nodes = reference_nodes()
    elsewhere = [_labelled(_busy(i, f"node{i}", namespace="other"), app="db") for i in range(1, 8)]
    elsewhere.append(_filler("node8"))
    own_namespace = pod("web", None, gpus=1, affinity=_anti(_term(HOSTNAME, app="db")))
    assert _placed(plan(state(nodes, [*elsewhere, own_namespace]))) == {"web": "node1"}
    listed = pod(
        "web-l",
        None,
        gpus=1,
        affinity=_anti({**_term(HOSTNAME, app="db"), "namespaces": ["other"]}),
    )
    assert _placed(plan(state(nodes, [*elsewhere, listed]))) == {"web-l": "node8"}
    every = pod(
        "web-e",
        None,
        gpus=1,
        affinity=_anti({**_term(HOSTNAME, app="db"), "namespaceSelector": {}}),
    )
    assert _placed(plan(state(nodes, [*elsewhere, every]))) == {"web-e": "node8"}
    # db of job x on node1, of job y on node2..node8: a job-x pod avoids only node1.
    dbs = [_labelled(_busy(1, "node1"), app="db", job="x")] + [
        _labelled(_busy(i, f"node{i}"), app="db", job="y") for i in range(2, 9)
    ]
    keyed = _labelled(
        pod(
            "web-k",
            None,
            gpus=1,
            affinity=_anti({**_term(HOSTNAME, app="db"), "matchLabelKeys": ["job"]}),
        ),
        job="x",
    )
    placed = _placed(plan(state(nodes, [*dbs, keyed])))
    assert placed and placed["web-k"] != "node1"


def test_rule_required_affinity_places_the_pod_in_a_matching_pods_domain() -> None:
    nodes = reference_nodes()
    cache = _labelled(_busy(7, "node7"), app="cache")
    incoming = pod("web", None, gpus=1, affinity=_affine(_term(BLOCK, app="cache")))
    placed = _placed(plan(state(nodes, [cache, incoming])))
    assert placed and _block_of(placed["web"], nodes) == "b4"


def test_rule_required_affinity_first_of_its_kind_only_when_it_matches_itself() -> None:
    """No pod matches anywhere: a pod matching its own term may start the series; one that
    does not match it waits (unschedulable)."""
    nodes = reference_nodes()
    first = _labelled(
        pod("first", None, gpus=1, affinity=_affine(_term(BLOCK, app="ring"))), app="ring"
    )
    assert _placed(plan(state(nodes, [first])))
    lonely = pod("lonely", None, gpus=1, affinity=_affine(_term(BLOCK, app="ring")))
    result = plan(state(nodes, [lonely]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    assert "affinity" in expect_actions(result.actions, MarkUnschedulable)[0].message


def test_rule_required_affinity_gang_members_follow_the_first_of_their_kind() -> None:
    """Four 4-GPU members with affinity to each other per block, no such pod yet: they go
    to the one block with room for all (b3), though filling the roomiest spine (s1: blocks
    of 3 slots) would split them."""
    nodes = reference_nodes()
    busy = [
        pod(f"half-{i}", None, gpus=4, node_name=f"node{i}", phase="Running") for i in (2, 4)
    ] + [pod(f"full-{i}", None, gpus=8, node_name=f"node{i}", phase="Running") for i in (7, 8)]
    members = [
        _labelled(pod(f"w-{i}", gpus=4, affinity=_affine(_term(BLOCK, job="ring"))), job="ring")
        for i in range(4)
    ]
    # BLOCK is a layer of the ClusterNetworkTopology: the members are gathered in one block.
    result = plan(state(nodes, [*busy, *members], [pod_group("gang", 4)], topology=TOPOLOGY))
    placed = _placed(result)
    assert len(placed) == 4
    assert {_block_of(n, nodes) for n in placed.values()} == {"b3"}


# --- topologySpreadConstraints DoNotSchedule (PodTopologySpread) ---------------------------


def test_rule_spread_do_not_schedule_keeps_skew_within_max_skew() -> None:
    nodes = reference_nodes()
    # Two matching pods in each of b1..b3, none in b4: the pod must go to b4.
    busy = [_labelled(_busy(i, f"node{i}"), app="web") for i in range(1, 7)]
    incoming = _spread(_labelled(pod("web", None, gpus=1), app="web"), topologyKey=BLOCK)
    incoming["spec"]["topologySpreadConstraints"][0]["labelSelector"] = {
        "matchLabels": {"app": "web"}
    }
    placed = _placed(plan(state(nodes, [*busy, _filler("node7"), _filler("node8"), incoming])))
    assert placed and _block_of(placed["web"], nodes) == "b4"
    # ScheduleAnyway is a preference, not a filter: it never keeps a pod pending.
    anyway = copy.deepcopy(incoming)
    anyway["metadata"]["uid"] += "-anyway"
    anyway["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
    assert constraints_of(anyway) is None


def test_rule_spread_over_nodes_caps_gang_members_per_node() -> None:
    nodes = reference_nodes()
    members = [
        _spread(
            _labelled(pod(f"w-{i}", gpus=1), job="spread"),
            topologyKey=HOSTNAME,
            labelSelector={"matchLabels": {"job": "spread"}},
        )
        for i in range(4)
    ]
    placed = _placed(plan(state(nodes, members, [pod_group("gang", 4)])))
    assert len(placed) == 4 and len(set(placed.values())) == 4


def _one_per_block() -> list[dict[str, Any]]:
    return [_labelled(_busy(i, f"node{i}"), app="web") for i in (1, 3, 5, 7)]


def _spreading(name: str, **extra: Any) -> dict[str, Any]:
    return _spread(
        _labelled(pod(name, None, gpus=1), app="web"),
        topologyKey=BLOCK,
        labelSelector={"matchLabels": {"app": "web"}},
        **extra,
    )


def test_rule_spread_min_domains_counts_missing_domains_as_empty() -> None:
    """One matching pod in each of the 4 blocks: with minDomains 5 the fewest is read as 0,
    so a fifth pod anywhere would make skew 2 > 1."""
    nodes = reference_nodes()
    assert _placed(plan(state(nodes, [*_one_per_block(), _spreading("web")])))
    result = plan(state(nodes, [*_one_per_block(), _spreading("web", minDomains=5)]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    assert "topology spread" in expect_actions(result.actions, MarkUnschedulable)[0].message


def test_rule_spread_node_affinity_policy_honor_counts_only_nodes_the_pod_may_use() -> None:
    """The pod selects blocks b1 and b2, each holding one matching pod; b3 and b4 hold none.
    Honor (the default) counts b1 and b2 only (fewest 1: skew 1, placed); Ignore counts all
    four (fewest 0: skew 2 > 1, refused)."""
    nodes = [
        node(n["metadata"]["name"], None, None, labels=n["metadata"]["labels"])
        for n in reference_nodes()
    ]
    for n in nodes:
        n["metadata"]["labels"]["pool"] = (
            "a"
            if _block_of(n["metadata"]["name"], nodes)
            in (
                "b1",
                "b2",
            )
            else "b"
        )
    busy = [_labelled(_busy(i, f"node{i}"), app="web") for i in (1, 3)]
    honored = _spreading("web")
    honored["spec"]["nodeSelector"] = {"pool": "a"}
    assert _placed(plan(state(nodes, [*busy, honored])))
    ignored = _spreading("web-ignore", nodeAffinityPolicy="Ignore")
    ignored["spec"]["nodeSelector"] = {"pool": "a"}
    result = plan(state(nodes, [*busy, ignored]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)


def test_rule_spread_node_taints_policy_honor_leaves_out_untolerated_nodes() -> None:
    """b3 and b4 are tainted; b1 and b2 hold one matching pod each. Ignore (the default)
    counts the tainted blocks as empty domains (skew 2, refused); Honor leaves them out."""
    taint = [{"key": "reserved", "value": "x", "effect": "NoSchedule"}]
    nodes = [
        node(
            f"node{i}",
            "s1" if i <= 4 else "s2",
            f"b{(i + 1) // 2}",
            taints=taint if i > 4 else None,
        )
        for i in range(1, 9)
    ]
    busy = [_labelled(_busy(i, f"node{i}"), app="web") for i in (1, 3)]
    result = plan(state(nodes, [*busy, _spreading("web")]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    assert _placed(plan(state(nodes, [*busy, _spreading("web-h", nodeTaintsPolicy="Honor")])))


# --- what the placer does not check: refused, never misplaced ------------------------------


def test_rule_pod_with_a_generic_ephemeral_volume_is_refused_naming_the_field() -> None:
    """Its claim is made only once the pod is placed: its volume topology cannot be known
    (PersistentVolumeClaims themselves are read: test_volume_topology)."""
    scratch = pod("data", None, gpus=1)
    scratch["spec"]["volumes"] = [
        {"name": "ckpt", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["x"]}}}}
    ]
    # Read through the placer's own projection, as the running service does.
    result = plan(state(reference_nodes(), [placement_fields(scratch)]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    mark = expect_actions(result.actions, MarkUnschedulable)[0]
    assert mark.reason == "Unschedulable"
    assert "spec.volumes[ckpt].ephemeral" in mark.message


def test_rule_a_refused_pod_gives_its_earlier_reservation_back() -> None:
    """Refused here for a claim that is not there (none is in the state)."""
    claim = pod("data", None, gpus=1, nominated="node3")
    claim["spec"]["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}]
    result = plan(state(reference_nodes(), [claim]))
    expect_actions(result.actions, Nominate, count=1, node="")
    expect_actions(result.actions, MarkUnschedulable, count=1)


def test_rule_pod_with_resource_claims_or_a_namespace_selector_is_refused() -> None:
    dra = pod("dra", None, gpus=1)
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "rc"}]
    selector = pod(
        "ns-sel",
        None,
        gpus=1,
        affinity=_anti(
            {**_term(HOSTNAME, app="db"), "namespaceSelector": {"matchLabels": {"team": "a"}}}
        ),
    )
    for obj, field_name in ((dra, "spec.resourceClaims"), (selector, "namespaceSelector")):
        result = plan(state(reference_nodes(), [obj]))
        expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
        assert field_name in expect_actions(result.actions, MarkUnschedulable)[0].message


def test_rule_the_kept_pod_carries_what_the_interpod_filters_read() -> None:
    """The placer's view keeps hostPorts (pending and bound pods) and a bound pod's required
    anti-affinity: a plan on the kept pods places as one on the whole pods."""
    nodes = reference_nodes()
    busy = [_with_ports(_busy(i, f"node{i}"), {"hostPort": 8080}) for i in range(1, 5)]
    busy += [_busy(i, f"node{i}", affinity=_anti(_term(HOSTNAME, app="web"))) for i in range(5, 8)]
    web = _labelled(_with_ports(pod("web", None, gpus=1), {"hostPort": 8080}), app="web")
    kept = [placement_fields(p) for p in [*busy, _filler("node8"), web]]
    assert _placed(plan(state(nodes, kept))) == {"web": "node8"}


# --- never two conflicting pods on one node, never a broken anti-affinity --------------------


def _conflicts(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ports_a, ports_b = (constraints_of(p) for p in (a, b))
    return bool(
        ports_a
        and ports_b
        and any(x.conflicts(y) for x in ports_a.host_ports for y in ports_b.host_ports)
    )


def _repels(a: dict[str, Any], b: dict[str, Any], node_a: str, node_b: str, nodes: Any) -> bool:
    facts = constraints_of(a)
    if facts is None:
        return False
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    return any(
        term.matches(b["metadata"]["namespace"], b["metadata"]["labels"])
        and labels[node_a].get(term.topology_key) is not None
        and labels[node_a].get(term.topology_key) == labels[node_b].get(term.topology_key)
        for term in facts.anti_affinity
    )


_APPS = ("a", "b", "c")


@st.composite
def _interpod_pods(
    draw: st.DrawFn, name: str, node_name: str, gpus: int | None = None
) -> dict[str, Any]:
    app = draw(st.sampled_from(_APPS))
    # Bound pods may fill a node and have a lower priority than the pending ones: the plan
    # may then preempt, and its placement is held to the same rules.
    gpus = draw(st.integers(0, 4)) if gpus is None else gpus
    priority = draw(st.integers(0, 10) if node_name else st.integers(0, 20))
    obj = _labelled(pod(name, None, gpus=gpus, node_name=node_name, priority=priority), app=app)
    if node_name:
        obj["status"]["phase"] = "Running"
    ports = draw(st.lists(st.sampled_from([(80, ""), (80, "10.0.0.1"), (443, "")]), max_size=2))
    if ports:
        _with_ports(
            obj, *({"hostPort": p, "hostIP": ip} if ip else {"hostPort": p} for p, ip in ports)
        )
    if draw(st.booleans()):
        key = draw(st.sampled_from([HOSTNAME, BLOCK]))
        obj["spec"]["affinity"] = _anti(_term(key, app=draw(st.sampled_from(_APPS))))
    return obj


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    nodes = reference_nodes()
    full = draw(st.sets(st.integers(1, 8)))
    bound = [draw(_interpod_pods(f"full-{i}", f"node{i}", gpus=8)) for i in sorted(full)]
    bound += [
        draw(_interpod_pods(f"bound-{i}", f"node{draw(st.integers(1, 8))}"))
        for i in range(draw(st.integers(0, 6)))
    ]
    singles = [draw(_interpod_pods(f"single-{i}", "")) for i in range(draw(st.integers(0, 3)))]
    members = [draw(_interpod_pods(f"w-{i}", "")) for i in range(draw(st.integers(0, 4)))]
    for member in members:
        member["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] = "gang"
    groups = [pod_group("gang", len(members))] if members else []
    return nodes, [*bound, *singles, *members], groups


@settings(max_examples=200, deadline=None)
@given(_clusters())
def test_property_no_plan_places_a_hostport_conflict_or_breaks_anti_affinity(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]],
) -> None:
    nodes, pods, groups = cluster
    # Two passes: nominate (or preempt), then bind.
    _, after = run(nodes, pods, groups)
    after = apply(after, plan(state(nodes, after, groups)))
    placed = {p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")}

    def where(p: dict[str, Any]) -> str:
        return str(p["spec"].get("nodeName") or p["status"].get("nominatedNodeName") or "")

    on_nodes = [p for p in after if where(p)]
    for a in on_nodes:
        if a["metadata"]["name"] not in placed:
            continue
        for b in on_nodes:
            if a is b:
                continue
            if where(a) == where(b):
                assert not _conflicts(a, b), (a["metadata"]["name"], b["metadata"]["name"])
            assert not _repels(a, b, where(a), where(b), nodes)
            assert not _repels(b, a, where(b), where(a), nodes)
