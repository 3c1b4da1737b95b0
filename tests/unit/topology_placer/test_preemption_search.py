"""The preemption search is fast (issue #31 item 11) and decides as the class-by-class,
domain-by-domain search did: on random clusters both make the same plan (the same victims in
the same order, domain, nodes, cost and budgets broken, the same nominations cleared) or
give the same reason for none. The oracle is the old search, kept in preemption_reference.py.
Speed itself is measured by `python -m bench topology_placer`, never asserted here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topology_placer import preemption_reference as reference
from tests.unit.topology_placer.builders import TOPOLOGY, node, pod
from topology_placer.fit import NodeCapacity, capacity_of, largest_request, pod_request_milli
from topology_placer.gang import GatherRule
from topology_placer.gather import PodShape
from topology_placer.network import build_tree, parse_topology
from topology_placer.preemption import (
    DISABLE_PREEMPTIBLE_LABEL,
    QUOTA_PREEMPTIBLE_LABEL,
    ChargedPod,
    NotHelpful,
    PreemptionPlan,
    plan_preemption,
)

RULE_SETS: tuple[tuple[GatherRule, ...], ...] = (
    (),
    (GatherRule("BlockLayer", "PreferGather"),),
    (GatherRule("BlockLayer", "MustGather"),),
    (GatherRule("SpineLayer", "MustGather"), GatherRule("BlockLayer", "PreferGather")),
    (GatherRule("SpineLayer", "MustGather", pod_count_multiple=2),),
    (GatherRule("NodeTopologyLayer", "PreferGather"),),
)


@dataclass(frozen=True)
class Victim:
    node: int
    gpus: int
    priority: int
    # "gang", "replica", "job" (a batch Job), "owned" (a custom controller's, evicted with its
    # owner) or "plain", and which one of its kind (jobs share it).
    kind: str
    job: int
    protected: str  # "", "disable" or "quota"
    deleting: bool
    nominated_only: bool


victims_strategy = st.builds(
    Victim,
    node=st.integers(0, 11),
    gpus=st.sampled_from((1, 2, 4, 8)),
    priority=st.integers(0, 4),
    kind=st.sampled_from(("gang", "replica", "job", "owned", "plain")),
    job=st.integers(0, 3),
    protected=st.sampled_from(("", "", "", "", "disable", "quota")),
    deleting=st.sampled_from((False, False, False, True)),
    nominated_only=st.sampled_from((False, False, False, True)),
)


def _cluster(
    blocks: list[int], victims: list[Victim], fillers: tuple[int, ...] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[dict[str, Any], str, bool]]]:
    """Nodes (spines of two blocks, `blocks` nodes in each), and the victims that fit on them,
    each with the node it is charged to and whether only by a nomination; then, with
    `fillers`, what is left of node i taken by a job of priority fillers[i] (a full cluster)."""
    nodes = []
    for index, count in enumerate(blocks):
        for slot in range(count):
            nodes.append(node(f"n{index}-{slot}", f"s{index // 2}", f"b{index}", cpu="64"))
    free = {n["metadata"]["name"]: 8 for n in nodes}
    pods: list[dict[str, Any]] = []
    placed: list[tuple[dict[str, Any], str, bool]] = []
    for number, victim in enumerate(victims):
        where = nodes[victim.node % len(nodes)]["metadata"]["name"]
        if free[where] < victim.gpus:
            continue
        free[where] -= victim.gpus
        group = f"low-gang-{victim.job}" if victim.kind == "gang" else None
        made = pod(
            f"v{number}",
            group,
            gpus=victim.gpus,
            priority=victim.priority,
            node_name="" if victim.nominated_only else where,
            nominated=where if victim.nominated_only else "",
            phase="Pending" if victim.nominated_only else "Running",
            deleting=victim.deleting,
            owner=None if victim.kind == "plain" else f"{victim.kind}-{victim.job}",
        )
        if victim.kind == "replica":
            made["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
        elif victim.kind == "owned":
            made["metadata"]["ownerReferences"][0]["kind"] = "MPIJob"
        labels = made["metadata"]["labels"]
        labels["app"] = f"{victim.kind}-{victim.job}"
        if victim.protected == "disable":
            labels[DISABLE_PREEMPTIBLE_LABEL] = "true"
        elif victim.protected == "quota":
            labels[QUOTA_PREEMPTIBLE_LABEL] = "false"
        pods.append(made)
        placed.append((made, where, victim.nominated_only))
    for index, priority in enumerate(fillers[: len(nodes)]):
        where = nodes[index]["metadata"]["name"]
        if free[where]:
            made = pod(
                f"fill-{index}",
                None,
                gpus=free[where],
                priority=priority,
                node_name=where,
                phase="Running",
                owner=f"filler-{index % 3}",
            )
            made["metadata"]["labels"]["app"] = f"plain-{index % 3}"
            pods.append(made)
            placed.append((made, where, False))
    return nodes, pods, placed


def _budget(app: str, allowed: int, namespace: str = "default") -> dict[str, Any]:
    # app "": the empty selector, every pod of the budget's namespace.
    return {
        "metadata": {"name": f"pdb-{app or 'all'}", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}} if app else {}},
        "status": {"disruptionsAllowed": allowed},
    }


def _same_plan(fast: PreemptionPlan | NotHelpful, slow: PreemptionPlan | NotHelpful) -> None:
    if isinstance(slow, NotHelpful):
        assert fast == slow
        return
    assert isinstance(fast, PreemptionPlan), fast
    assert fast.placement == slow.placement
    assert [u.key for u in fast.victims] == [u.key for u in slow.victims]
    assert fast.victim_pods == slow.victim_pods
    assert (fast.cost, fast.broken_budgets) == (slow.cost, slow.broken_budgets)
    assert [p["metadata"]["uid"] for p in fast.cleared_nominations] == [
        p["metadata"]["uid"] for p in slow.cleared_nominations
    ]


@settings(max_examples=400, deadline=None)
@given(
    blocks=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    victims=st.lists(victims_strategy, max_size=40),
    fillers=st.none() | st.tuples(*[st.integers(0, 4)] * 16),
    gang_size=st.integers(1, 8),
    gang_gpus=st.sampled_from((2, 4, 8)),
    gang_priority=st.integers(2, 5),
    rules=st.sampled_from(RULE_SETS),
    budgets=st.lists(
        st.tuples(
            st.sampled_from(("gang", "replica", "job", "plain", "")),
            st.integers(0, 3),
            st.integers(0, 2),
            # The victims' namespace, or another (whose budget selects none of them).
            st.sampled_from(("default", "default", "other")),
        ),
        max_size=3,
    ),
    unusable=st.sets(st.integers(0, 15), max_size=3),
)
def test_rule_the_fast_preemption_search_makes_the_least_cost_plan_of_the_class_by_class_search(
    blocks: list[int],
    victims: list[Victim],
    fillers: tuple[int, ...] | None,
    gang_size: int,
    gang_gpus: int,
    gang_priority: int,
    rules: tuple[GatherRule, ...],
    budgets: list[tuple[str, int, int, str]],
    unusable: set[int],
) -> None:
    """Phases 2-5 (cheapest class first, least-cost domain, victims given back while the gang
    still fits, budgets) choose the same plan as the reference search, victim for victim."""
    nodes, _pods, placed = _cluster(blocks, victims, fillers or ())
    tree = build_tree(
        parse_topology(TOPOLOGY), [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes]
    )
    charged = [
        ChargedPod(made, where, pod_request_milli(made), nominated_only)
        for made, where, nominated_only in placed
    ]
    capacities: dict[str, NodeCapacity] = {
        n["metadata"]["name"]: capacity_of(
            n, [c.request for c in charged if c.node == n["metadata"]["name"]]
        )
        for n in nodes
    }
    names = [n["metadata"]["name"] for n in nodes]
    usable = {name for index, name in enumerate(names) if index not in unusable}
    request = pod_request_milli(pod("probe", gpus=gang_gpus))
    arguments: dict[str, Any] = {
        "tree": tree,
        "pods_in_rank_order": [f"member-{rank}" for rank in range(gang_size)],
        "rules": rules,
        "capacities": capacities,
        "usable_nodes": usable,
        "request": request,
        "charged": charged,
        "gang_priority": gang_priority,
        "budgets": [
            _budget(f"{kind}-{job}" if kind else "", allowed, namespace)
            for kind, job, allowed, namespace in budgets
        ],
    }
    slow = reference.plan_preemption(**arguments)
    fast = plan_preemption(**arguments)
    _same_plan(fast, slow)
    # A second pass reads the pods from the memo: still the same plan.
    _same_plan(plan_preemption(**arguments), slow)


def _arguments_for(
    nodes: list[dict[str, Any]],
    placed: list[tuple[dict[str, Any], str, bool]],
    *,
    members: int,
    request: dict[str, int] | None = None,
    budgets: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """plan_preemption's arguments: these nodes and pods (each charged to its node, by a
    nomination only or not), a gang of `members` members of priority 5 asking `request` (8
    GPUs by default) that must gather in a block."""
    tree = build_tree(
        parse_topology(TOPOLOGY), [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes]
    )
    charged = [ChargedPod(m, w, pod_request_milli(m), o) for m, w, o in placed]
    capacities = {
        n["metadata"]["name"]: capacity_of(
            n, [c.request for c in charged if c.node == n["metadata"]["name"]]
        )
        for n in nodes
    }
    return {
        "tree": tree,
        "pods_in_rank_order": [f"member-{rank}" for rank in range(members)],
        "rules": (GatherRule("BlockLayer", "MustGather"),),
        "capacities": capacities,
        "usable_nodes": set(capacities),
        "request": request if request is not None else pod_request_milli(pod("probe", gpus=8)),
        "charged": charged,
        "gang_priority": 5,
        "budgets": budgets or [],
    }


def _arguments(
    victims: list[Victim], gang_size: int, gang_gpus: int, budgets: list[dict[str, Any]]
) -> dict[str, Any]:
    """One block of two nodes, these victims, a MustGather-block gang of priority 5."""
    nodes, _pods, placed = _cluster([2], victims)
    return _arguments_for(
        nodes,
        placed,
        members=gang_size,
        request=pod_request_milli(pod("probe", gpus=gang_gpus)),
        budgets=budgets,
    )


def test_rule_victims_are_given_back_highest_priority_first() -> None:
    """Phase 4: n0-1 needs room for one 4-GPU member; evicting either its priority-1 job or
    its priority-3 job frees it. The higher-priority job is given back first, so the
    lower-priority one is the victim there (n0-0's priority-3 job must go in any case)."""
    arguments = _arguments(
        [
            Victim(0, 8, 3, "owned", 0, "", False, False),
            Victim(1, 4, 1, "owned", 1, "", False, False),
            Victim(1, 2, 3, "owned", 2, "", False, False),
        ],
        gang_size=3,
        gang_gpus=4,
        budgets=[],
    )
    fast = plan_preemption(**arguments)
    assert isinstance(fast, PreemptionPlan)
    assert fast.placement.node_of == {"member-0": "n0-0", "member-1": "n0-0", "member-2": "n0-1"}
    assert [u.key for u in fast.victims] == ["job default/owned-0", "job default/owned-1"]
    _same_plan(fast, reference.plan_preemption(**arguments))


def test_rule_the_fast_search_takes_a_budget_protected_class_only_when_no_other_fits() -> None:
    """The bisection over classes keeps the class order: a block freed by evicting the
    budget-protected lowest-priority job is passed over for one freed by a higher-priority
    job that breaks no budget, exactly as the reference chooses."""
    nodes, _pods, placed = _cluster(
        [2, 2],
        [
            Victim(0, 8, 0, "owned", 0, "", False, False),
            Victim(1, 8, 0, "owned", 0, "", False, False),
            Victim(2, 8, 2, "owned", 1, "", False, False),
            Victim(3, 8, 2, "owned", 1, "", False, False),
        ],
    )
    tree = build_tree(
        parse_topology(TOPOLOGY), [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes]
    )
    charged = [ChargedPod(m, w, pod_request_milli(m), o) for m, w, o in placed]
    capacities = {
        n["metadata"]["name"]: capacity_of(
            n, [c.request for c in charged if c.node == n["metadata"]["name"]]
        )
        for n in nodes
    }
    arguments: dict[str, Any] = {
        "tree": tree,
        "pods_in_rank_order": ["member-0", "member-1"],
        "rules": (GatherRule("BlockLayer", "MustGather"),),
        "capacities": capacities,
        "usable_nodes": set(capacities),
        "request": pod_request_milli(pod("probe", gpus=8)),
        "charged": charged,
        "gang_priority": 5,
        "budgets": [_budget("owned-0", 0)],
    }
    fast = plan_preemption(**arguments)
    assert isinstance(fast, PreemptionPlan)
    assert fast.placement.domain == ("s0", "b1")
    assert [u.key for u in fast.victims] == ["job default/owned-1"]
    assert fast.broken_budgets == 0
    _same_plan(fast, reference.plan_preemption(**arguments))


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    victims=st.lists(victims_strategy, max_size=40),
    fillers=st.none() | st.tuples(*[st.integers(0, 4)] * 16),
    workers=st.integers(1, 6),
    worker_gpus=st.sampled_from((2, 4, 8)),
    launchers=st.integers(1, 2),
    launcher_cpu=st.sampled_from(("1", "16", "60", "64")),
    gang_priority=st.integers(2, 5),
    rules=st.sampled_from(RULE_SETS),
    budgets=st.lists(
        st.tuples(
            st.sampled_from(("gang", "replica", "job", "plain", "")),
            st.integers(0, 3),
            st.integers(0, 2),
        ),
        max_size=2,
    ),
    launcher_nodes=st.none() | st.sets(st.integers(0, 15), min_size=1, max_size=6),
    worker_off=st.sets(st.integers(0, 15), max_size=4),
    unusable=st.sets(st.integers(0, 15), max_size=2),
)
def test_rule_a_mixed_gangs_fast_search_makes_the_plan_of_the_class_by_class_search(
    blocks: list[int],
    victims: list[Victim],
    fillers: tuple[int, ...] | None,
    workers: int,
    worker_gpus: int,
    launchers: int,
    launcher_cpu: str,
    gang_priority: int,
    rules: tuple[GatherRule, ...],
    budgets: list[tuple[str, int, int]],
    launcher_nodes: set[int] | None,
    worker_off: set[int],
    unusable: set[int],
) -> None:
    """A gang of several pod shapes (CPU-only launchers, GPU workers), each shape with its own
    usable nodes: the fast search's dry run per shape, its domains costed with the sums made
    once, and its victims given back per node's summed asks make the plan the class-by-class
    reference makes with gather_mixed, victim for victim."""
    nodes, _pods, placed = _cluster(blocks, victims, fillers or ())
    tree = build_tree(
        parse_topology(TOPOLOGY), [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes]
    )
    charged = [ChargedPod(m, w, pod_request_milli(m), o) for m, w, o in placed]
    capacities = {
        n["metadata"]["name"]: capacity_of(
            n, [c.request for c in charged if c.node == n["metadata"]["name"]]
        )
        for n in nodes
    }
    names = [n["metadata"]["name"] for n in nodes]
    usable = {name for index, name in enumerate(names) if index not in unusable}
    launcher_usable = (
        set(names)
        if launcher_nodes is None
        else {name for index, name in enumerate(names) if index in launcher_nodes}
    )
    worker_usable = {name for index, name in enumerate(names) if index not in worker_off}
    shapes = [
        PodShape(pod_request_milli(pod("launcher", gpus=0, cpu=launcher_cpu)), launcher_usable),
        PodShape(pod_request_milli(pod("worker", gpus=worker_gpus)), worker_usable),
    ]
    members = [f"launcher-{i}" for i in range(launchers)] + [f"worker-{i}" for i in range(workers)]
    shape_of = {name: 0 if name.startswith("launcher") else 1 for name in members}
    arguments: dict[str, Any] = {
        "tree": tree,
        "pods_in_rank_order": members,
        "rules": rules,
        "capacities": capacities,
        "usable_nodes": usable,
        "request": largest_request(shape.request for shape in shapes),
        "charged": charged,
        "gang_priority": gang_priority,
        "budgets": [
            _budget(f"{kind}-{job}" if kind else "", allowed) for kind, job, allowed in budgets
        ],
        "shapes": shapes,
        "shape_of": shape_of,
    }
    slow = reference.plan_preemption(**arguments)
    fast = plan_preemption(**arguments)
    _same_plan(fast, slow)
    if isinstance(fast, PreemptionPlan):
        # Each member on a node its own shape may use.
        for name, where in fast.placement.assignments:
            assert where in shapes[shape_of[name]].usable & usable
