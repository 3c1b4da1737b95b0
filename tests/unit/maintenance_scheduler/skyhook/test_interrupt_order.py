"""Interrupts, as upstream orders them: a package that will interrupt its node waits for the
node to be cordoned, its podNonInterruptLabels pods gone and drained (its NodeMaintenance
Ready) before apply/upgrade; then apply, config, interrupt, post-interrupt, and the request
goes (uncordon). Several interrupts due on one node make one: reboot wins, services merge,
the others are `skipped`."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Interrupt, Package, node_state_annotation
from maintenance_scheduler.skyhook.jobs import build_job, maintenance_name
from maintenance_scheduler.skyhook.plan import CreateJob, merge_interrupts
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import (
    NAMESPACE,
    Cluster,
    make_skyhook,
)

REQUEST = maintenance_name("gpu-init", "node-0")


def package(interrupt: dict[str, Any] | None, version: str = "1.0.0") -> dict[str, Any]:
    spec: dict[str, Any] = {"version": version, "image": "ghcr.io/x/p"}
    if interrupt is not None:
        spec["interrupt"] = interrupt
    return spec


REBOOT = {"type": "reboot"}


def test_rule_apply_of_an_interrupting_package_waits_for_its_node_to_be_drained() -> None:
    cluster = Cluster.of(make_skyhook({"kernel": package(REBOOT)}))
    cluster.held_pending = True
    for _ in range(6):
        cluster.round()
    # Requested at once, but nothing runs on the node before it is cordoned and drained.
    assert cluster.maintenances == {REQUEST: "Pending"}
    assert cluster.created == []
    cluster.held_pending = False
    cluster.settle()
    assert cluster.status() == "complete"
    assert [a.stage for a in cluster.created] == ["apply", "config", "interrupt", "post-interrupt"]
    assert set(cluster.phase_at_create.values()) == {"Ready"}
    assert cluster.maintenances == {}  # released after post-interrupt: uncordoned


def test_rule_an_upgrade_of_an_interrupting_package_waits_for_the_drain_too() -> None:
    cluster = Cluster.of(make_skyhook({"kernel": package(REBOOT)}))
    cluster.settle()
    mark = len(cluster.created)
    cluster.change({"kernel": package(REBOOT, "1.1.0")})
    cluster.held_pending = True
    for _ in range(4):
        cluster.round()
    assert cluster.created[mark:] == []
    assert cluster.maintenances == {REQUEST: "Pending"}
    cluster.held_pending = False
    cluster.settle()
    assert [a.stage for a in cluster.created[mark:]] == [
        "upgrade",
        "config",
        "interrupt",
        "post-interrupt",
    ]
    assert {cluster.phase_at_create[a.name] for a in cluster.created[mark:]} == {"Ready"}


def test_a_package_without_interrupt_needs_no_drain() -> None:
    cluster = Cluster.of(make_skyhook({"tools": package(None)}))
    cluster.held_pending = True
    cluster.settle()
    assert cluster.status() == "complete"
    assert cluster.maintenances == {}
    assert [a.stage for a in cluster.created] == ["apply", "config"]


def node_state(cluster: Cluster) -> dict[str, Any]:
    raw = cluster.nodes["node-0"].annotations[node_state_annotation("gpu-init")]
    return {v["name"]: v for v in json.loads(raw).values()}


def test_rule_several_interrupts_on_a_node_make_one_and_reboot_wins() -> None:
    packages = {
        "alpha": package({"type": "service", "services": ["a.service"]}),
        "kernel": package(REBOOT),
        "nvidia": package({"type": "restartAllServices"}),
    }
    cluster = Cluster.of(make_skyhook(packages))
    skipped_seen: set[str] = set()
    for _ in range(40):
        plan = cluster.round()
        if cluster.skyhook.status.get("nodeState"):
            skipped_seen |= {n for n, e in node_state(cluster).items() if e["state"] == "skipped"}
        if not plan.actions:
            break
    assert cluster.status() == "complete"
    interrupts = [a for a in cluster.created if a.stage == "interrupt"]
    assert [(a.package.name, a.package.interrupt) for a in interrupts] == [
        ("kernel", Interrupt("reboot"))
    ]
    assert skipped_seen == {"alpha", "nvidia"}
    # Every package ran its post-interrupt after the one interrupt, the node drained.
    posts = [i for i, a in enumerate(cluster.created) if a.stage == "post-interrupt"]
    assert len(posts) == 3
    assert min(posts) > cluster.created.index(interrupts[0])
    assert set(cluster.phase_at_create.values()) == {"Ready"}
    assert cluster.maintenances == {}


def test_rule_service_interrupts_merge_their_services_into_one_job() -> None:
    packages = {
        "alpha": package({"type": "service", "services": ["z.service", "a.service"]}),
        "beta": package({"type": "service", "services": ["b.service", "a.service"]}),
        "gamma": package({"type": "noop"}),
    }
    cluster = Cluster.of(make_skyhook(packages))
    cluster.settle()
    assert cluster.status() == "complete"
    (interrupt,) = [a for a in cluster.created if a.stage == "interrupt"]
    assert interrupt.package.name == "alpha"
    job = cluster.jobs[interrupt.name]
    (agent,) = job["spec"]["template"]["spec"]["initContainers"]
    assert agent["args"][:2] == ["interrupt", "/root"]
    # The agent's interrupt argument (upstream Interrupt.ToArgs): base64 JSON, agent names;
    # the services in declared order, new ones appended (upstream's mergeInterrupt).
    decoded = json.loads(base64.b64decode(agent["args"][3]))
    assert decoded == {
        "type": "service_restart",
        "services": ["z.service", "a.service", "b.service"],
    }


def test_merge_interrupts_follows_upstream_priority() -> None:
    def pkg(name: str, kind: str, *services: str) -> Package:
        return Package(name, "1.0.0", "img", interrupt=Interrupt(kind, services))  # type: ignore[arg-type]

    assert merge_interrupts([pkg("b", "noop"), pkg("a", "service", "x")]) == (
        "a",
        Interrupt("service", ("x",)),
    )
    assert merge_interrupts([pkg("a", "service", "x"), pkg("b", "restartAllServices")]) == (
        "b",
        Interrupt("restartAllServices"),
    )
    assert merge_interrupts(
        [pkg("c", "reboot"), pkg("a", "restartAllServices"), pkg("b", "reboot")]
    ) == ("b", Interrupt("reboot"))
    assert merge_interrupts([pkg("a", "noop"), pkg("b", "noop")]) == ("a", Interrupt("noop"))


def test_rule_a_skipped_package_waits_while_the_merged_interrupt_fails() -> None:
    packages = {
        "alpha": package({"type": "service", "services": ["a.service"]}),
        "kernel": package(REBOOT),
    }
    cluster = Cluster.of(make_skyhook(packages))
    for _ in range(30):
        plan = cluster.round()
        for action in plan.actions:
            if isinstance(action, CreateJob) and action.stage == "interrupt":
                cluster.fate[action.name] = "failed"
    state = node_state(cluster)
    assert (state["kernel"]["stage"], state["kernel"]["state"]) == ("interrupt", "erroring")
    assert (state["alpha"]["stage"], state["alpha"]["state"]) == ("interrupt", "skipped")
    assert not [a for a in cluster.created if a.stage == "post-interrupt"]
    assert REQUEST in cluster.maintenances  # the node stays out of service


def _reboot_running_beside_a_skipped_service(cluster: Cluster) -> None:
    """Run until kernel's merged reboot Job runs (held) and alpha waits skipped."""
    for _ in range(30):
        cluster.round()
        interrupts = [a for a in cluster.created if a.stage == "interrupt"]
        if interrupts:
            cluster.held_jobs.add(interrupts[0].name)
            break
    cluster.round()
    assert node_state(cluster)["alpha"]["state"] == "skipped"


def _merged_pair() -> Cluster:
    packages = {
        "alpha": package({"type": "service", "services": ["a.service"]}),
        "kernel": package(REBOOT),
    }
    return Cluster.of(make_skyhook(packages))


def test_rule_pause_starts_no_post_interrupt_of_a_skipped_package() -> None:
    cluster = _merged_pair()
    _reboot_running_beside_a_skipped_service(cluster)
    cluster.skyhook = replace(cluster.skyhook, paused=True)
    since = len(cluster.created)
    cluster.held_jobs.clear()
    for _ in range(5):
        cluster.round()
    assert cluster.created[since:] == []
    # Resumed: both post-interrupts run, the node still drained.
    cluster.skyhook = replace(cluster.skyhook, paused=False)
    cluster.settle()
    posts = {a.package.name for a in cluster.created[since:] if a.stage == "post-interrupt"}
    assert posts == {"alpha", "kernel"}
    assert {cluster.phase_at_create[a.name] for a in cluster.created[since:]} == {"Ready"}
    assert cluster.status() == "complete"


def test_rule_a_skipped_package_s_post_interrupt_waits_for_its_node_to_be_drained() -> None:
    cluster = _merged_pair()
    _reboot_running_beside_a_skipped_service(cluster)
    # The drain is lost (the NodeMaintenance no longer Ready) while the reboot ends.
    cluster.held_pending = True
    since = len(cluster.created)
    cluster.held_jobs.clear()
    for _ in range(5):
        cluster.round()
    assert [a for a in cluster.created[since:] if a.stage == "post-interrupt"] == []
    cluster.held_pending = False
    cluster.settle()
    made = [a for a in cluster.created[since:] if a.package.name == "alpha"]
    assert [a.stage for a in made] == ["post-interrupt"]
    assert cluster.phase_at_create[made[0].name] == "Ready"


def test_rule_the_interrupt_job_restarts_its_pod_on_failure_as_upstream() -> None:
    """The reboot kills the interrupt pod (exit 143, upstream #633): the pod restarts OnFailure
    after the boot and the Job completes then, as upstream's interrupt pods and Jobs do, so
    the package is not erroring. podFailurePolicy needs restartPolicy Never: none here."""
    skyhook = make_skyhook({"kernel": package(REBOOT)})
    kernel = skyhook.packages[0]
    interrupt = build_job(
        skyhook, kernel, "interrupt", "node-0", namespace=NAMESPACE, default_stage_timeout_seconds=0
    )
    spec = interrupt["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert spec["backoffLimit"] == 3
    assert "podFailurePolicy" not in spec
    for stage in ("apply", "config", "post-interrupt"):
        other = build_job(
            skyhook, kernel, stage, "node-0", namespace=NAMESPACE, default_stage_timeout_seconds=0
        )["spec"]
        assert (other["template"]["spec"]["restartPolicy"], other["backoffLimit"]) == ("Never", 0)


KINDS = st.sampled_from([None, "reboot", "restartAllServices", "service", "noop"])


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(KINDS, min_size=1, max_size=4),
    pending_rounds=st.integers(min_value=0, max_value=5),
)
def test_property_no_interrupting_stage_runs_undrained_and_one_interrupt_per_node(
    kinds: list[str | None], pending_rounds: int
) -> None:
    packages: dict[str, Any] = {}
    for index, kind in enumerate(kinds):
        interrupt: dict[str, Any] | None = None
        if kind is not None:
            interrupt = {"type": kind}
            if kind == "service":
                interrupt["services"] = [f"s{index}.service"]
        packages[f"pkg-{index}x"] = package(interrupt)
    cluster = Cluster.of(make_skyhook(packages))
    cluster.held_pending = True
    for _ in range(pending_rounds):
        cluster.round()
    cluster.held_pending = False
    cluster.settle(80)
    assert cluster.status() == "complete"
    interrupting = {n for n, k in zip(packages, kinds, strict=True) if k is not None}
    for action in cluster.created:
        if action.package.name in interrupting:
            assert cluster.phase_at_create[action.name] == "Ready", action
    interrupts = [a for a in cluster.created if a.stage == "interrupt"]
    assert len(interrupts) == (1 if interrupting else 0)
    posts = {a.package.name for a in cluster.created if a.stage == "post-interrupt"}
    assert posts == interrupting
    assert cluster.maintenances == {}
