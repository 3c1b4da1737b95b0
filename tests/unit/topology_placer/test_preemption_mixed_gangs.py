"""Job-level preemption for a gang of several pod shapes (issue #31): the dry run places each
member with its own request on the nodes its own filters pass, as placement does
(gather.gather_mixed), and the victims given back are those every member's node can spare.
Each test drives `plan()` through raw objects."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topology_placer.builders import TOPOLOGY, node, pod, pod_group
from tests.unit.topology_placer.simulate import run
from topology_placer.fit import add_milli, pod_request_milli
from topology_placer.planner import Decision, Disrupt, Plan
from topology_placer.preemption import QUOTA_PREEMPTIBLE_LABEL

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]
GANG_PRIORITY = 100


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def _where(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
        for p in pods
        if p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
    }


def test_rule_a_mixed_gang_preempts_only_the_room_its_members_need() -> None:
    """A CPU-only launcher (2 CPU) and two 8-GPU workers in one block of three 8-GPU nodes,
    each running a low-priority 8-GPU pod. The workers need two nodes freed; the launcher fits
    beside a worker (or on the third node as it is). Sized by the largest request (2 CPU and 8
    GPU each) the gang would need all three nodes and evict the third pod for nothing."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3)]
    victims = [pod(f"v{i}", None, gpus=8, node_name=f"n{i}", owner=f"low-{i}") for i in (1, 2, 3)]
    launcher = pod("launcher", "gang", gpus=0, cpu="2", priority=GANG_PRIORITY)
    workers = [pod(f"worker-{i}", "gang", gpus=8, priority=GANG_PRIORITY) for i in (0, 1)]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, [*victims, launcher, *workers], groups, topology=TOPOLOGY)
    evicted = {d.pod.name for d in _of(result, Disrupt)}
    assert len(evicted) == 2
    where = _where(after)
    assert {where["worker-0"], where["worker-1"]} == {f"n{v[1:]}" for v in evicted}
    (decision,) = [d for d in _of(result, Decision) if d.kind == "preempted"]
    assert decision.message.startswith("evicting 2 pods of 2 lower-priority jobs")


def test_rule_a_mixed_gang_preempts_with_each_members_own_node_selector() -> None:
    """The launcher may only run on the CPU node (nodeSelector), the workers need 8 GPUs: no
    node passes both and has GPUs. The GPU nodes' low-priority pods are evicted for the
    workers and the launcher goes to the CPU node, where its own filters let it."""
    nodes = [
        node("cpu-1", "s1", "b1", gpus=0, labels={"role": "cpu"}),
        node("gpu-1a", "s1", "b1"),
        node("gpu-1b", "s1", "b1"),
    ]
    victims = [pod(f"v-{n}", None, gpus=8, node_name=n, owner="low") for n in ("gpu-1a", "gpu-1b")]
    launcher = pod("launcher", "gang", gpus=0, cpu="2", priority=GANG_PRIORITY)
    launcher["spec"]["nodeSelector"] = {"role": "cpu"}
    workers = [pod(f"worker-{i}", "gang", gpus=8, priority=GANG_PRIORITY) for i in (0, 1)]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, [*victims, launcher, *workers], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-gpu-1a", "v-gpu-1b"}
    where = _where(after)
    assert where["launcher"] == "cpu-1"
    assert {where["worker-0"], where["worker-1"]} == {"gpu-1a", "gpu-1b"}


def test_rule_a_mixed_gang_preempts_with_each_members_own_tolerations() -> None:
    """The GPU nodes are tainted and only the workers tolerate the taint: the launcher goes to
    the untainted node as it is, the workers' victims are evicted on the tainted ones (nodes
    passing every member's filters would be the untainted node alone, with no victim)."""
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    nodes = [
        node("plain", "s1", "b1", gpus=0),
        node("gpu-a", "s1", "b1", taints=taint),
        node("gpu-b", "s1", "b1", taints=taint),
    ]
    victims = [
        pod(f"v-{n}", None, gpus=8, node_name=n, owner="low", tolerations=toleration)
        for n in ("gpu-a", "gpu-b")
    ]
    launcher = pod("launcher", "gang", gpus=0, cpu="1", priority=GANG_PRIORITY)
    workers = [
        pod(f"worker-{i}", "gang", gpus=8, priority=GANG_PRIORITY, tolerations=toleration)
        for i in (0, 1)
    ]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, [*victims, launcher, *workers], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-gpu-a", "v-gpu-b"}
    where = _where(after)
    assert where["launcher"] == "plain"
    assert {where["worker-0"], where["worker-1"]} == {"gpu-a", "gpu-b"}


def test_rule_a_mixed_gang_evicts_on_the_launchers_node_only_what_the_launcher_needs() -> None:
    """The CPU node is full of a low-priority CPU job; the launcher's node is freed too, and
    a higher-priority pod beside it stays."""
    nodes = [
        node("cpu-1", "s1", "b1", gpus=0, cpu="8", labels={"role": "cpu"}),
        node("gpu-1a", "s1", "b1"),
    ]
    victims = [
        pod("v-cpu", None, gpus=0, cpu="6", node_name="cpu-1", owner="low-cpu"),
        pod("keep-cpu", None, gpus=0, cpu="2", node_name="cpu-1", priority=GANG_PRIORITY),
        pod("v-gpu", None, gpus=8, node_name="gpu-1a", owner="low-gpu"),
    ]
    launcher = pod("launcher", "gang", gpus=0, cpu="4", priority=GANG_PRIORITY)
    launcher["spec"]["nodeSelector"] = {"role": "cpu"}
    worker = pod("worker-0", "gang", gpus=8, priority=GANG_PRIORITY)
    groups = [pod_group("gang", 2, gather=BLOCK_MUST)]
    result, after = run(nodes, [*victims, launcher, worker], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-cpu", "v-gpu"}
    assert _where(after)["launcher"] == "cpu-1"
    assert _where(after)["worker-0"] == "gpu-1a"


# --- safety ------------------------------------------------------------------------------

# A running pod: (node index, GPUs, CPUs, priority, owner).
_RUNNING = st.tuples(
    st.integers(0, 5),
    st.sampled_from([0, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
    st.integers(0, 150),
    st.integers(0, 3),
)


@settings(max_examples=120, deadline=None)
@given(
    running=st.lists(_RUNNING, max_size=14),
    workers=st.integers(1, 3),
    worker_gpus=st.sampled_from([4, 8]),
    launcher_cpu=st.sampled_from(["1", "2", "6"]),
    launcher_on_cpu_nodes=st.booleans(),
    protected_owner=st.none() | st.integers(0, 3),
    opted_out_owner=st.none() | st.integers(0, 3),
)
def test_property_a_mixed_gangs_preemption_is_all_or_nothing_and_evicts_only_what_may_go(
    running: list[tuple[int, int, int, int, int]],
    workers: int,
    worker_gpus: int,
    launcher_cpu: str,
    launcher_on_cpu_nodes: bool,
    protected_owner: int | None,
    opted_out_owner: int | None,
) -> None:
    """A launcher and its workers preempting on two blocks of a CPU node and two GPU nodes:
    the plan, applied, lets every member fit on its node (by its own request and filters);
    it never evicts a pod of the gang's priority or higher nor one opted out of preemption,
    and it evicts a pod a disruption budget guards only when no plan without one exists."""
    nodes = []
    for block in (0, 1):
        nodes.append(node(f"cpu-{block}", "s1", f"b{block}", gpus=0, labels={"role": "cpu"}))
        nodes.extend(node(f"gpu-{block}{side}", "s1", f"b{block}") for side in "ab")
    names = [n["metadata"]["name"] for n in nodes]
    gpus_of = {
        n["metadata"]["name"]: (0 if n["metadata"]["name"].startswith("cpu") else 8) for n in nodes
    }
    free = {name: {"gpu": gpus_of[name], "cpu": 8} for name in names}
    kept: list[dict[str, Any]] = []
    for number, (where_index, gpus, cpus, priority, owner) in enumerate(running):
        where = names[where_index]
        if free[where]["gpu"] < gpus or free[where]["cpu"] < cpus:
            continue
        free[where]["gpu"] -= gpus
        free[where]["cpu"] -= cpus
        made = pod(
            f"r{number}",
            None,
            gpus=gpus,
            cpu=str(cpus),
            node_name=where,
            phase="Running",
            priority=priority,
            owner=f"low-{owner}",
        )
        made["metadata"]["labels"]["app"] = f"low-{owner}"
        if owner == opted_out_owner:
            made["metadata"]["labels"][QUOTA_PREEMPTIBLE_LABEL] = "false"
        kept.append(made)
    budgets = []
    if protected_owner is not None:
        budgets.append(
            {
                "metadata": {"name": "guard", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": f"low-{protected_owner}"}}},
                "status": {"disruptionsAllowed": 0},
            }
        )
    launcher = pod("launcher", "gang", gpus=0, cpu=launcher_cpu, priority=GANG_PRIORITY)
    if launcher_on_cpu_nodes:
        launcher["spec"]["nodeSelector"] = {"role": "cpu"}
    members = [
        launcher,
        *(
            pod(f"worker-{i}", "gang", gpus=worker_gpus, priority=GANG_PRIORITY)
            for i in range(workers)
        ),
    ]
    groups = [pod_group("gang", 1 + workers, gather=BLOCK_MUST)]
    result, after = run(nodes, kept + members, groups, topology=TOPOLOGY, budgets=budgets)
    evicted = {d.pod.name for d in _of(result, Disrupt)}
    by_name = {p["metadata"]["name"]: p for p in kept}
    # Never a pod of the gang's priority or higher, never one opted out.
    for name in evicted:
        victim = by_name[name]
        assert victim["spec"]["priority"] < GANG_PRIORITY
        assert QUOTA_PREEMPTIBLE_LABEL not in victim["metadata"]["labels"]
    where = _where(after)
    placed = [m for m in members if m["metadata"]["name"] in where]
    # All or nothing.
    assert len(placed) in (0, len(members))
    if evicted:
        assert len(placed) == len(members)
    # Applied, the plan lets every member fit on its node, by its own request and filters.
    used: dict[str, dict[str, int]] = {}
    for p in after:
        node_name = p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
        if node_name:
            add_milli(used.setdefault(node_name, {}), pod_request_milli(p))
    for node_name, taken in used.items():
        assert taken.get("nvidia.com/gpu", 0) <= gpus_of[node_name] * 1000
        assert taken.get("cpu", 0) <= 8000
    if launcher_on_cpu_nodes and "launcher" in where:
        assert where["launcher"].startswith("cpu-")
    for m in placed:
        if m["metadata"]["name"].startswith("worker"):
            assert where[m["metadata"]["name"]].startswith("gpu-")
    # Whenever the gang fits with every pod preemption may evict gone, a plan is made (a
    # search that sizes the launcher as a worker, or keeps the workers to the launcher's
    # nodes, misses some); a budget-guarded pod goes only when the gang does not fit with
    # every unguarded one gone.
    never_victims = [
        p
        for p in kept
        if p["spec"]["priority"] >= GANG_PRIORITY
        or QUOTA_PREEMPTIBLE_LABEL in p["metadata"]["labels"]
    ]
    guarded = [
        p
        for p in kept
        if protected_owner is not None
        and p["metadata"]["labels"]["app"] == f"low-{protected_owner}"
        and p not in never_victims
    ]
    if _placed_as_it_is(nodes, never_victims, members, groups):
        assert len(placed) == len(members)
    if evicted & {p["metadata"]["name"] for p in guarded}:
        assert not _placed_as_it_is(nodes, never_victims + guarded, members, groups)


def _placed_as_it_is(
    nodes: list[dict[str, Any]],
    running: list[dict[str, Any]],
    members: list[dict[str, Any]],
    groups: list[dict[str, Any]],
) -> bool:
    """Whether the gang is placed among these running pods as they are (nominated, with
    nothing evicted: a plan that preempts does not count)."""
    result, _ = run(nodes, [*running, *members], groups, topology=TOPOLOGY)
    nominated = any(isinstance(a, Decision) and a.kind == "nominated" for a in result.actions)
    return nominated and not _of(result, Disrupt)
