"""A gang of several pod shapes is verified in a domain by a packing that finds one whenever
one exists (issue #31, rule 5 and rule 7d): first fit, then an exact search bounded in steps,
a domain whose search reaches the bound taking nothing. The rule tests drive `plan()`
through raw objects; the property compares `gather_mixed` with an exhaustive oracle."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_actions
from tests.unit.topology_placer.builders import TOPOLOGY, node, pod, pod_group
from tests.unit.topology_placer.simulate import run
from tests.unit.topology_placer.test_preemption_mixed_gangs import (
    BLOCK_MUST,
    GANG_PRIORITY,
    _of,
    _where,
)
from topology_placer.gang import GatherRule
from topology_placer.gather import NoFit, Placement, PodShape, gather_mixed
from topology_placer.network import TopologyTree, build_tree, parse_topology
from topology_placer.planner import Disrupt, MarkUnschedulable, Nominate


def _first_fit_trap(priority: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One block: n1 and n2 (12 CPU, 8 GPU) are the only nodes the launcher (6 CPU) may use,
    n3 (8 CPU, 8 GPU) is for workers only; two workers of 8 GPU and 8 CPU. The workers have
    the least room to spare and go first, first fit puts them on n1 and n2, and the launcher
    no longer fits beside either. The packing that exists: a worker on n3, the other on n1 or
    n2, the launcher on the one left."""
    nodes = [
        node("n1", "s1", "b1", cpu="12", labels={"pool": "launch"}),
        node("n2", "s1", "b1", cpu="12", labels={"pool": "launch"}),
        node("n3", "s1", "b1", cpu="8"),
    ]
    workers = [pod(f"worker-{i}", gpus=8, cpu="8", priority=priority) for i in range(2)]
    launcher = pod("launcher", gpus=0, cpu="6", priority=priority)
    launcher["spec"]["nodeSelector"] = {"pool": "launch"}
    return nodes, [*workers, launcher]


def test_rule_a_mixed_gang_is_placed_when_a_packing_exists_that_first_fit_misses() -> None:
    nodes, members = _first_fit_trap()
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, members, groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=3)
    assert not _of(result, MarkUnschedulable)
    where = _where(after)
    assert where["launcher"] in {"n1", "n2"}
    assert sorted([where["worker-0"], where["worker-1"], where["launcher"]]) == ["n1", "n2", "n3"]
    # Rank order kept: the workers' ranks follow the fill order (n1, n2 before n3).
    assert where["worker-1"] == "n3"


def _tree(nodes: Sequence[tuple[str, str]]) -> TopologyTree:
    """Nodes (name, block) under one spine."""
    return build_tree(
        parse_topology(TOPOLOGY),
        [
            (
                name,
                {
                    "network.topology.nvidia.com/spine": "s1",
                    "network.topology.nvidia.com/block": block,
                },
            )
            for name, block in nodes
        ],
    )


def _trap_for_gather() -> tuple[
    TopologyTree, list[tuple[str, int]], list[PodShape], dict[str, Mapping[str, int]]
]:
    """The same trap as `_first_fit_trap`, as gather_mixed's arguments."""
    tree = _tree([("n1", "b1"), ("n2", "b1"), ("n3", "b1")])
    members = [("worker-0", 0), ("worker-1", 0), ("launcher", 1)]
    shapes = [
        PodShape({"cpu": 8000, "gpu": 8}, frozenset({"n1", "n2", "n3"})),
        PodShape({"cpu": 6000}, frozenset({"n1", "n2"})),
    ]
    big = {"cpu": 12000, "gpu": 8}
    free: dict[str, Mapping[str, int]] = {"n1": big, "n2": big, "n3": {"cpu": 8000, "gpu": 8}}
    return tree, members, shapes, free


def test_rule_a_packing_search_that_reaches_its_bound_places_nothing_and_says_so() -> None:
    tree, members, shapes, free = _trap_for_gather()
    rules = (GatherRule("BlockLayer", "MustGather"),)
    found = gather_mixed(tree, members, shapes, free, rules)
    assert isinstance(found, Placement)
    stopped = gather_mixed(tree, members, shapes, free, rules, pack_steps=1)
    assert isinstance(stopped, NoFit)
    assert stopped.message.startswith("MustGather BlockLayer: no BlockLayer domain offers room")
    assert stopped.message.endswith(
        "; the packing search stopped at its bound of 1 steps in s1/b1, treated as not fitting"
    )


def test_rule_a_packing_search_deeper_than_pythons_recursion_limit_ends_at_its_bound() -> None:
    """1,200 members of the searched shape (3 GPUs, one a node) beside 2,401 of the most
    numerous (2 GPUs): 2,400 nodes of 4 GPUs, each with its own CPU figure (a class of its
    own), hold 1,200 + 2,400 at most. The search goes 1,200 members deep before it can tell,
    beyond Python's recursion limit of 1,000 and within the bound of 5,000 steps: it keeps its
    own stack and ends at its bound, never with a RecursionError that fails the whole pass."""
    names = [f"n{i}" for i in range(2400)]
    tree = _tree([(name, "b1") for name in names])
    free: dict[str, Mapping[str, int]] = {
        name: {"cpu": 100 + i, "gpu": 4} for i, name in enumerate(names)
    }
    usable = frozenset(names)
    shapes = [PodShape({"cpu": 1, "gpu": 3}, usable), PodShape({"cpu": 1, "gpu": 2}, usable)]
    members = [(f"a-{k}", 0) for k in range(1200)] + [(f"b-{k}", 1) for k in range(2401)]
    stopped = gather_mixed(tree, members, shapes, free, ())
    assert isinstance(stopped, NoFit)
    assert stopped.message.endswith(
        "; the packing search stopped at its bound of 5000 steps in cluster, treated as not fitting"
    )


def test_rule_a_packing_first_fit_misses_is_found_1100_members_deep() -> None:
    """The trap of `_trap_for_gather` at scale: 1,200 nodes x (12 CPU, 8 GPUs) that 1,100
    launchers (6 CPU) may use, 1,200 nodes y (8 CPU, 8 GPUs), 1,850 workers (8 CPU, 8 GPUs)
    anywhere. First fit puts workers on every x node first; the packing puts the launchers two
    a node on 550 x nodes, found 1,100 members deep, beyond Python's recursion limit."""
    xs = [f"x{i}" for i in range(1200)]
    ys = [f"y{i}" for i in range(1200)]
    tree = _tree([(name, "b1") for name in xs + ys])
    x_free, y_free = {"cpu": 12000, "gpu": 8}, {"cpu": 8000, "gpu": 8}
    free: dict[str, Mapping[str, int]] = {**dict.fromkeys(xs, x_free), **dict.fromkeys(ys, y_free)}
    shapes = [
        PodShape({"cpu": 8000, "gpu": 8}, frozenset(xs + ys)),
        PodShape({"cpu": 6000}, frozenset(xs)),
    ]
    members = [(f"worker-{k}", 0) for k in range(1850)] + [
        (f"launcher-{k}", 1) for k in range(1100)
    ]
    found = gather_mixed(tree, members, shapes, free, ())
    assert isinstance(found, Placement), found.message
    on: dict[str, list[str]] = {}
    for name, where in found.assignments:
        on.setdefault(where, []).append(name)
    assert len(found.assignments) == len(members)
    for where, names in on.items():
        launchers = sum(name.startswith("launcher") for name in names)
        workers = len(names) - launchers
        assert (workers, launchers) in {(1, 0), (0, 1), (0, 2)}, (where, names)
        assert not launchers or where.startswith("x")


def test_rule_the_packing_search_bound_is_shared_by_every_domain_of_a_gather() -> None:
    """Block b2 is the trap of `_trap_for_gather` (first fit misses, the search packs it in 2
    steps). Block b1, tighter and so tried first, takes no packing (the launcher may use only
    m1, and both workers need m1 and m2) and its search spends 2 steps to prove it. With a
    bound of 2 steps for the whole gather, b2 gets first fit only: the gang is not placed,
    and the message names b2 as given up; with the default bound b2 is taken."""
    tree = _tree([("m1", "b1"), ("m2", "b1"), ("n1", "b2"), ("n2", "b2"), ("n3", "b2")])
    members = [("worker-0", 0), ("worker-1", 0), ("launcher", 1)]
    shapes = [
        PodShape({"cpu": 8000, "gpu": 8}, frozenset({"m1", "m2", "n1", "n2", "n3"})),
        PodShape({"cpu": 6000}, frozenset({"m1", "n1", "n2"})),
    ]
    big = {"cpu": 12000, "gpu": 8}
    free: dict[str, Mapping[str, int]] = {
        "m1": big,
        "m2": {"cpu": 10000, "gpu": 8},
        "n1": big,
        "n2": big,
        "n3": {"cpu": 8000, "gpu": 8},
    }
    rules = (GatherRule("BlockLayer", "MustGather"),)
    found = gather_mixed(tree, members, shapes, free, rules)
    assert isinstance(found, Placement)
    assert found.domain == ("s1", "b2")
    stopped = gather_mixed(tree, members, shapes, free, rules, pack_steps=2)
    assert isinstance(stopped, NoFit)
    assert stopped.message.endswith(
        "; the packing search stopped at its bound of 2 steps in s1/b2, treated as not fitting"
    )


def test_rule_a_mixed_gang_preempts_no_more_than_a_packing_first_fit_misses_needs() -> None:
    """The trap of the first test, n3 taken by a priority-10 pod, and a fourth node n4 the
    launcher may use (12 CPU, no GPU) of which a priority-20 pod takes 8 CPU. Evicting the
    priority-10 pod is enough (a worker on n3); first fit found no packing with it alone
    and evicted the priority-20 pod to put the launcher on n4."""
    nodes, members = _first_fit_trap(priority=GANG_PRIORITY)
    nodes.append(node("n4", "s1", "b1", cpu="12", gpus=0, labels={"pool": "launch"}))
    victims = [
        pod("v-low", None, gpus=8, cpu="1", node_name="n3", priority=10, owner="low"),
        pod("v-mid", None, gpus=0, cpu="8", node_name="n4", priority=20, owner="mid"),
    ]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, [*victims, *members], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-low"}
    where = _where(after)
    assert "n3" in {where["worker-0"], where["worker-1"]}
    assert where["launcher"] in {"n1", "n2"}


# --- property: the packing finds what an exhaustive search finds ---------------------------

_RESOURCES = ("cpu", "gpu")


def _oracle(
    nodes: Sequence[str],
    members: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
) -> bool:
    """Whether some assignment of every member to one of `nodes` fits, trying them all."""
    for choice in itertools.product(nodes, repeat=len(members)):
        taken: dict[str, dict[str, int]] = {}
        fits = True
        for (_, index), where in zip(members, choice, strict=True):
            shape = shapes[index]
            if where not in shape.usable:
                fits = False
                break
            load = taken.setdefault(where, {})
            for resource, amount in shape.request.items():
                load[resource] = load.get(resource, 0) + amount
                if load[resource] > free[where].get(resource, 0):
                    fits = False
            if not fits:
                break
        if fits:
            return True
    return False


_REQUEST = st.fixed_dictionaries({"cpu": st.integers(0, 4), "gpu": st.integers(0, 4)}).filter(
    lambda request: any(request.values())
)
_FREE = st.fixed_dictionaries({"cpu": st.integers(0, 8), "gpu": st.integers(0, 8)})


@settings(max_examples=400, deadline=None)
@given(
    node_count=st.integers(1, 4),
    blocks=st.lists(st.sampled_from(["b1", "b2"]), min_size=4, max_size=4),
    frees=st.lists(_FREE, min_size=4, max_size=4),
    shape_specs=st.lists(
        st.tuples(_REQUEST, st.integers(1, 3), st.sets(st.integers(0, 3), min_size=1)),
        min_size=2,
        max_size=3,
    ),
    gathered=st.booleans(),
    data=st.data(),
)
def test_rule_the_packing_finds_every_packing_an_exhaustive_search_finds(
    node_count: int,
    blocks: list[str],
    frees: list[dict[str, int]],
    shape_specs: list[tuple[dict[str, int], int, set[int]]],
    gathered: bool,
    data: st.DataObject,
) -> None:
    names = [f"n{i}" for i in range(node_count)]
    tree = _tree([(name, blocks[i]) for i, name in enumerate(names)])
    free: dict[str, Mapping[str, int]] = {name: frees[i] for i, name in enumerate(names)}
    shapes = [
        PodShape(request, frozenset(names[i] for i in usable if i < node_count))
        for request, _, usable in shape_specs
    ]
    members = [
        (f"s{index}-{k}", index) for index, spec in enumerate(shape_specs) for k in range(spec[1])
    ]
    # Ranks interleave the shapes as a real gang's may (a launcher ranked among workers).
    members = data.draw(st.permutations(members))
    rules = (GatherRule("BlockLayer", "MustGather"),) if gathered else ()
    outcome = gather_mixed(tree, members, shapes, free, rules)
    domains = sorted(set(blocks[:node_count])) if gathered else ["cluster"]
    exists = any(
        _oracle(
            [n for i, n in enumerate(names) if not gathered or blocks[i] == domain],
            members,
            shapes,
            free,
        )
        for domain in domains
    )
    if not isinstance(outcome, Placement):
        assert not exists, outcome.message
        assert "packing search stopped" not in outcome.message
        return
    assert exists
    # All members, in rank order, each on a node its shape may use; no node over-committed.
    assert [name for name, _ in outcome.assignments] == [name for name, _ in members]
    shape_of = dict(members)
    load: dict[str, dict[str, int]] = {}
    for name, where in outcome.assignments:
        shape = shapes[shape_of[name]]
        assert where in shape.usable
        for resource, amount in shape.request.items():
            load.setdefault(where, {})[resource] = load.get(where, {}).get(resource, 0) + amount
    for where, taken in load.items():
        for resource in _RESOURCES:
            assert taken.get(resource, 0) <= free[where][resource]
    if gathered:
        assert len({blocks[names.index(where)] for _, where in outcome.assignments}) == 1
