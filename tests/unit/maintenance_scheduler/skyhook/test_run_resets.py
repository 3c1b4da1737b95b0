"""What starts a new run of a package on a node (its Jobs' identity, jobs.IDENTITY_ANNOTATION),
so the Complete Jobs of the earlier run (kept a day by their TTL) prove nothing:

- an explicit rerun of a stage: the node's nodeState entry set back to a stage by someone
  else than the controller (`kubectl skyhook package rerun --stage`) starts a new run there;
- a reset node (its nodeState removed: `node reset`, `reset`) starts a new run for every
  package, one that waits for its dependsOn included;
- and nothing else: a controller that restarts or decides again on the same state, at any
  point, runs no Complete stage a second time.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import node_state_annotation, parse_deployment_policy
from maintenance_scheduler.skyhook.jobs import entry_identity, job_name
from maintenance_scheduler.skyhook.plan import CreateJob, RoundPlan, plan_round
from maintenance_scheduler.skyhook.stages import START_STAGES, stages_of
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import Cluster, make_skyhook

ANNOTATION = node_state_annotation("gpu-init")
DRIVER_AND_TUNING: dict[str, dict[str, Any]] = {
    "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
    "tuning": {
        "version": "2.0.0",
        "image": "ghcr.io/x/tuning",
        "dependsOn": {"driver": "1.0.0"},
    },
}
WITH_INTERRUPT = {
    "driver": {
        "version": "1.0.0",
        "image": "ghcr.io/x/driver",
        "interrupt": {"type": "service", "services": ["containerd"]},
    },
}
EVERY_STAGE = [
    ("driver", "1.0.0", "apply"),
    ("driver", "1.0.0", "config"),
    ("tuning", "2.0.0", "apply"),
    ("tuning", "2.0.0", "config"),
]


def complete(cluster: Cluster) -> None:
    cluster.settle()
    assert cluster.status() == "complete"


def cli_rerun(cluster: Cluster, node: str, key: str, stage: str) -> None:
    """What `kubectl skyhook package rerun --stage` writes: the entry's stage and state set,
    every other field of it kept (libs/nodeflow_cli/skyhook.rerun_patch)."""
    view = cluster.nodes[node]
    entries = json.loads(view.annotations[ANNOTATION])
    entries[key].update(stage=stage, state="in_progress")
    annotations = {**view.annotations, ANNOTATION: json.dumps(entries)}
    cluster.nodes[node] = cluster.bump(view, annotations=annotations)


def test_rule_an_explicit_rerun_of_a_stage_runs_that_stage_and_the_ones_after_it_again() -> None:
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    mark = len(cluster.created)
    cli_rerun(cluster, "node-0", "driver|1.0.0", "apply")
    complete(cluster)
    assert cluster.stages_created(mark) == [
        ("driver", "1.0.0", "apply"),
        ("driver", "1.0.0", "config"),
    ]


def test_rule_a_rerun_of_the_stage_a_complete_package_ended_on_runs_it_again() -> None:
    cluster = Cluster.of(make_skyhook(WITH_INTERRUPT))
    complete(cluster)
    mark = len(cluster.created)
    cli_rerun(cluster, "node-0", "driver|1.0.0", "post-interrupt")
    complete(cluster)
    assert cluster.stages_created(mark) == [("driver", "1.0.0", "post-interrupt")]
    mark = len(cluster.created)
    cli_rerun(cluster, "node-0", "driver|1.0.0", "post-interrupt")  # twice: a third run
    complete(cluster)
    assert cluster.stages_created(mark) == [("driver", "1.0.0", "post-interrupt")]


def test_rule_a_reset_node_runs_every_package_again_dependent_ones_included() -> None:
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    assert cluster.stages_created() == EVERY_STAGE
    mark = len(cluster.created)
    cluster.reset_node("node-0")
    complete(cluster)
    assert cluster.stages_created(mark) == EVERY_STAGE


def test_rule_a_rerun_decided_again_after_its_node_patch_was_lost_makes_no_second_job() -> None:
    """The rerun's run is made of what the edited entry says: a controller that made the
    stage's Job and lost its node patch (and status write) finds that Job again."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    mark = len(cluster.created)
    cli_rerun(cluster, "node-0", "driver|1.0.0", "config")
    lost_round(cluster)
    complete(cluster)
    assert cluster.stages_created(mark) == [("driver", "1.0.0", "config")]


def lost_round(cluster: Cluster) -> None:
    """A round whose Jobs were made but whose node patches and status write never landed
    (the controller died after creating them)."""
    nodes, skyhook = dict(cluster.nodes), cluster.skyhook
    cluster.round()
    cluster.nodes, cluster.skyhook = nodes, skyhook


def decided_twice(cluster: Cluster) -> None:
    """A restarted (or resynced) controller planning the same state again makes no Job."""
    again = plan_round(cluster.world(), now=cluster.now)
    assert not [a for a in again.actions if isinstance(a, CreateJob)]


Event = tuple[str, Any]
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("round"), st.just(0)),
        st.tuples(st.just("lost"), st.just(0)),
        st.tuples(st.just("reset"), st.just(0)),
        st.tuples(st.just("paused-reset"), st.just(0)),
        st.tuples(st.just("rerun"), st.sampled_from(["apply", "config"])),
    ),
    max_size=12,
)


def stage_runs(cluster: Cluster, since: int) -> list[tuple[str, str, str]]:
    return cluster.stages_created(since)


@settings(max_examples=30, deadline=None)
@given(events=EVENTS)
def test_property_restarts_never_rerun_a_complete_stage_and_a_reset_reruns_every_package(
    events: list[Event],
) -> None:
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    for kind, stage in events:
        if kind == "round":
            cluster.round()
        elif kind == "lost":
            lost_round(cluster)
        elif kind in ("reset", "paused-reset"):
            complete(cluster)
            mark = len(cluster.created)
            cluster.reset_node("node-0")
            if kind == "paused-reset":  # the status rewritten before the packages start again
                cluster.skyhook = replace(cluster.skyhook, paused=True)
                cluster.settle()
                cluster.skyhook = replace(cluster.skyhook, paused=False)
            complete(cluster)
            assert stage_runs(cluster, mark) == EVERY_STAGE
        elif ANNOTATION in cluster.nodes["node-0"].annotations:
            complete(cluster)
            mark = len(cluster.created)
            cli_rerun(cluster, "node-0", "driver|1.0.0", stage)
            complete(cluster)
            again = EVERY_STAGE[:2] if stage == "apply" else EVERY_STAGE[1:2]
            assert stage_runs(cluster, mark) == again
    complete(cluster)
    decided_twice(cluster)
    # Every stage ran once per run: the harness refuses a Job made twice, and no run makes a
    # stage's Job again once the package went past it.
    runs: dict[tuple[str, str], list[str]] = {}
    for made in cluster.created:
        runs.setdefault((made.package.name, made.run), []).append(made.stage)
    for stages_run in runs.values():
        assert len(stages_run) == len(set(stages_run))


def test_rule_an_entry_an_older_controller_wrote_gets_its_mark_so_a_later_rerun_is_seen() -> None:
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    view = cluster.nodes["node-0"]
    entries = json.loads(view.annotations[ANNOTATION])
    for value in entries.values():
        del value["writtenAs"]
    older = {**view.annotations, ANNOTATION: json.dumps(entries)}
    cluster.nodes["node-0"] = cluster.bump(view, annotations=older)
    mark = len(cluster.created)
    complete(cluster)
    assert cluster.stages_created(mark) == []  # nothing runs again for the upgrade itself
    cli_rerun(cluster, "node-0", "tuning|2.0.0", "config")
    complete(cluster)
    assert cluster.stages_created(mark) == [("tuning", "2.0.0", "config")]


def test_rule_a_node_reset_while_paused_runs_every_package_again_on_resume() -> None:
    """Paused, the controller still rewrites its status from the nodes, and the reset node
    has no state left: the status keeps what it last recorded there until it starts again,
    so a new run starts on resume (found on `make run`: `skyhook reset` while paused, then
    `resume`, ran nothing and showed every node complete)."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    recorded = cluster.skyhook.status["nodeState"]["node-0"]
    cluster.skyhook = replace(cluster.skyhook, paused=True)
    cluster.reset_node("node-0")
    cluster.settle()
    assert cluster.skyhook.status["nodeState"]["node-0"] == recorded
    mark = len(cluster.created)
    cluster.skyhook = replace(cluster.skyhook, paused=False)
    complete(cluster)
    assert cluster.stages_created(mark) == EVERY_STAGE


def test_rule_a_reset_node_waiting_for_its_batch_runs_every_package_again() -> None:
    """Every node reset at once under a one-node batch: the nodes that wait for a later batch
    have their status rewritten empty before they start, and still run every stage again."""
    policy = parse_deployment_policy(
        {
            "metadata": {"name": "one-at-a-time"},
            "spec": {
                "default": {
                    "budget": {"percent": 100},
                    "strategy": {"fixed": {"initialBatch": 1}},
                }
            },
        }
    )
    skyhook = replace(make_skyhook(DRIVER_AND_TUNING), deployment_policy="one-at-a-time")
    cluster = Cluster.of(skyhook, count=3)
    cluster.policies = {"one-at-a-time": policy}
    complete(cluster)
    mark = len(cluster.created)
    for node in cluster.nodes:
        cluster.reset_node(node)
    complete(cluster)
    again = sorted(cluster.stages_created(mark))
    assert again == sorted(EVERY_STAGE * 3)


def test_rule_a_reset_node_whose_status_record_is_gone_runs_every_package_again() -> None:
    """The status no longer records the reset node at all (written anew: the Skyhook
    restored without its status): the runs its Jobs show went past their first stage are
    never started again (`World.used_runs`), whatever expired of them since."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    for again in range(2):
        mark = len(cluster.created)
        cluster.reset_node("node-0")
        cluster.skyhook = replace(cluster.skyhook, status={})
        complete(cluster)
        assert cluster.stages_created(mark) == EVERY_STAGE, again


def test_rule_a_node_reset_after_its_start_ended_but_before_its_next_stage_ran_reruns_it() -> None:
    """apply ended and config waits (the node's drain is not Ready any more), so no Job of
    the run went past apply: the node reset there, the status's record of the run past its
    start shows a reset, not a start whose node patch was lost; apply runs again too."""
    cluster = Cluster.of(make_skyhook(WITH_INTERRUPT))
    while not cluster.created:
        cluster.round()
    cluster.held_pending = True
    cluster.round()
    recorded = cluster.skyhook.status["nodeState"]["node-0"]["driver|1.0.0"]
    assert (recorded["stage"], [a.stage for a in cluster.created]) == ("config", ["apply"])
    mark = len(cluster.created)
    cluster.reset_node("node-0")
    cluster.held_pending = False
    complete(cluster)
    assert [stage for _, _, stage in cluster.stages_created(mark)] == [
        "apply",
        "config",
        "interrupt",
        "post-interrupt",
    ]


def test_rule_a_node_reset_while_paused_between_two_stages_reruns_the_first() -> None:
    """Paused as apply ends: its end is recorded, config waits for the resume; the node
    reset meanwhile (its status rewritten, the run kept there) runs apply again."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    cluster.round()
    cluster.skyhook = replace(cluster.skyhook, paused=True)
    cluster.round()
    mark = len(cluster.created)
    cluster.reset_node("node-0")
    cluster.settle()
    cluster.skyhook = replace(cluster.skyhook, paused=False)
    complete(cluster)
    assert cluster.stages_created(mark) == EVERY_STAGE


def test_rule_a_node_reset_retries_an_install_that_failed_at_apply() -> None:
    """S47: an erroring install is left until it is fixed or its node reset; the reset runs
    it again, though its failed apply Job (kept with its logs) is still there."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    cluster.round()
    cluster.fate[cluster.created[0].name] = "failed"
    cluster.settle()
    assert cluster.status() == "erroring"
    mark = len(cluster.created)
    cluster.reset_node("node-0")
    complete(cluster)
    assert cluster.stages_created(mark) == EVERY_STAGE


ONE_AT_A_TIME = parse_deployment_policy(
    {
        "metadata": {"name": "one-at-a-time"},
        "spec": {
            "default": {"budget": {"percent": 100}, "strategy": {"fixed": {"initialBatch": 1}}}
        },
    }
)
INTERRUPTING_DRIVER: dict[str, dict[str, Any]] = {
    "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver", "interrupt": {"type": "reboot"}},
    "tuning": DRIVER_AND_TUNING["tuning"],
}
WIDE_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("round"), st.just(0)),
        st.tuples(st.just("lost"), st.just(0)),
        st.tuples(st.sampled_from(["reset", "paused-reset", "disabled-reset"]), st.integers(0, 2)),
        st.tuples(st.just("reset-all"), st.just(0)),
        st.tuples(st.just("ttl-expiry"), st.integers(0, 3)),
        st.tuples(st.just("upgrade"), st.just(0)),
        st.tuples(st.just("config"), st.just(0)),
        st.tuples(st.just("fail"), st.integers(0, 2)),
        st.tuples(st.just("rerun"), st.sampled_from(["apply", "config"])),
    ),
    max_size=14,
)


def current_job_names(cluster: Cluster) -> set[str]:
    """The Jobs the nodes' entries stand on now (their current stage's)."""
    names: set[str] = set()
    for node in cluster.nodes.values():
        for entry in json.loads(node.annotations.get(ANNOTATION) or "{}").values():
            identity = entry_identity(entry.get("run", ""), entry.get("config", ""))
            stage = str(entry["stage"])
            names.add(
                job_name("gpu-init", entry["name"], entry["version"], stage, node.name, identity)
            )
    return names


class Ledger:
    """What ran where: a stage whose Job completed on a node never runs there again (same
    package, version and config) until that node is reset or the stage rerun."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seen = 0
        # Jobs made before these indexes of `created` count no more, by node, by (node,
        # package) and by (node, package, stage).
        self.since: dict[tuple[str, ...], int] = {}

    def counts(self, index: int, made: CreateJob) -> bool:
        keys = [(made.node,), (made.node, made.package.name)]
        keys.append((made.node, made.package.name, made.stage))
        return all(index >= self.since.get(key, 0) for key in keys)

    def check(self) -> None:
        created = self.cluster.created
        done: set[tuple[str, str, str, str, str]] = set()
        for index, made in enumerate(created[: self.seen]):
            status = (self.cluster.jobs.get(made.name) or {}).get("status") or {}
            complete_job = status.get("conditions", [{}])[0].get("type") == "Complete"
            if complete_job and self.counts(index, made):
                done.add(
                    (made.node, made.package.name, made.package.version, made.stage, made.config)
                )
        for made in created[self.seen :]:
            key = (made.node, made.package.name, made.package.version, made.stage, made.config)
            assert key not in done, f"{key} ran again"
        self.seen = len(created)

    def forget(self, node: str, package: str = "", stages: frozenset[str] = frozenset()) -> None:
        mark = len(self.cluster.created)
        if not package:
            self.since[(node,)] = mark
        elif not stages:
            self.since[(node, package)] = mark
        for stage in stages:
            self.since[(node, package, stage)] = mark


class LedgeredCluster(Cluster):
    """A Cluster whose ledger checks every round's new Jobs."""

    ledger: Ledger | None = None

    def round(self) -> RoundPlan:
        plan = super().round()
        if self.ledger is not None:
            self.ledger.check()
        return plan


def starts_under_way(cluster: Cluster, node: str, *, recorded: bool = True) -> set[tuple[str, str]]:
    """(package, start stage) of the packages whose start on the node may be under way with
    its Job made: recorded so by the status (`recorded`), or recorded nowhere (neither the
    node nor the status has the package: its patches were lost)."""
    in_status = (cluster.skyhook.status.get("nodeState") or {}).get(node) or {}
    on_node = json.loads(cluster.nodes[node].annotations.get(ANNOTATION) or "{}")
    found: set[tuple[str, str]] = set()
    for package in cluster.skyhook.packages:
        status_entry = next((v for v in in_status.values() if v["name"] == package.name), None)
        node_entry = next((v for v in on_node.values() if v["name"] == package.name), None)
        if status_entry is None and node_entry is None:
            found |= {(package.name, stage) for stage in START_STAGES}
        elif (
            recorded
            and status_entry is not None
            and status_entry["stage"] in START_STAGES
            and status_entry["state"] == "in_progress"
        ):
            found.add((package.name, status_entry["stage"]))
    return found


def every_stage(cluster: Cluster) -> set[tuple[str, str]]:
    return {
        (package.name, stage)
        for package in cluster.skyhook.packages
        for stage in stages_of(package)
    }


@settings(max_examples=100, deadline=None)
@given(
    events=WIDE_EVENTS,
    interrupting=st.booleans(),
    batched=st.booleans(),
)
def test_property_resets_at_any_point_on_several_nodes_rerun_every_stage_and_nothing_else(
    events: list[Event], interrupting: bool, batched: bool
) -> None:
    """Three nodes, a one-at-a-time batch or none, a driver with or without a reboot: a
    node reset at any point (mid-run, paused or disabled until its status was rewritten,
    every node at once) runs every stage of every package there again, except a start whose
    Job was still the run's only one (it is found again, as after a lost node patch); lost
    rounds, expired Jobs, upgrades, config edits, failures retried and reruns never make a
    stage that completed on a node run there again otherwise."""
    skyhook = make_skyhook(INTERRUPTING_DRIVER if interrupting else DRIVER_AND_TUNING)
    if batched:
        skyhook = replace(skyhook, deployment_policy="one-at-a-time")
    cluster = LedgeredCluster(skyhook, Cluster.of(skyhook, count=3).nodes)
    if batched:
        cluster.policies = {"one-at-a-time": ONE_AT_A_TIME}
    ledger = cluster.ledger = Ledger(cluster)
    packages: dict[str, dict[str, Any]] = dict(
        INTERRUPTING_DRIVER if interrupting else DRIVER_AND_TUNING
    )
    edits = 0

    def reset(nodes: list[str], hold: str = "") -> None:
        # A start under way is found again (its Job may have ended since): one the status
        # records so, or one neither the status nor the node records (its patches lost).
        adopted = {(node, *start) for node in nodes for start in starts_under_way(cluster, node)}
        mark = len(cluster.created)
        for node in nodes:
            cluster.reset_node(node)
            ledger.forget(node)
        if hold:  # the status rewritten before the packages start again
            cluster.skyhook = replace(
                cluster.skyhook, paused=hold == "paused", disabled=hold == "disabled"
            )
            cluster.settle()
            cluster.skyhook = replace(cluster.skyhook, paused=False, disabled=False)
        complete(cluster)
        for node in nodes:
            ran = {(a.package.name, a.stage) for a in cluster.created[mark:] if a.node == node}
            missing = every_stage(cluster) - ran
            assert {(node, *m) for m in missing} <= adopted, (node, missing)

    for kind, arg in events:
        node = f"node-{arg}"
        if kind == "round":
            cluster.round()
        elif kind == "lost":
            lost_round(cluster)
        elif kind in ("reset", "paused-reset", "disabled-reset"):
            hold = {"paused-reset": "paused", "disabled-reset": "disabled"}.get(kind, "")
            reset([node], hold)
        elif kind == "reset-all":
            reset(sorted(cluster.nodes))
        elif kind == "ttl-expiry":
            # Finished Jobs older than the last `arg` made are gone (their TTL ran out);
            # the Jobs the nodes' entries stand on now ended a moment ago and stay.
            keep = {a.name for a in cluster.created[len(cluster.created) - arg :]} if arg else set()
            keep |= current_job_names(cluster)
            for name in [n for n, obj in cluster.jobs.items() if obj.get("status")]:
                if name not in keep:
                    del cluster.jobs[name]
        elif kind in ("upgrade", "config"):
            # A start whose patches were all lost is not recorded anywhere: the new
            # generation gives it a new run, so its start stage may run again (known).
            for name in cluster.nodes:
                for package, _ in starts_under_way(cluster, name, recorded=False):
                    ledger.forget(name, package, START_STAGES)
            edits += 1
            if kind == "upgrade":
                packages["tuning"] = {**packages["tuning"], "version": f"2.{edits}.0"}
            else:
                packages["driver"] = {**packages["driver"], "configMap": {"k": str(edits)}}
            cluster.change(packages)
            cluster.round()
        elif kind == "fail":
            # The Jobs running on the node fail (their stage erroring, the failed Jobs kept);
            # once it shows erroring, the node reset is the way out (S47), whatever failed.
            running = [a.name for a in cluster.created if a.node == node]
            running = [
                n for n in running if n in cluster.jobs and not cluster.jobs[n].get("status")
            ]
            cluster.fate.update(dict.fromkeys(running, "failed"))
            cluster.settle()
            reset([node])
        elif kind == "rerun" and ANNOTATION in cluster.nodes["node-0"].annotations:
            complete(cluster)
            entries = json.loads(cluster.nodes["node-0"].annotations[ANNOTATION])
            if "driver|1.0.0" in entries:
                cli_rerun(cluster, "node-0", "driver|1.0.0", arg)
                ledger.forget("node-0", "driver")
                complete(cluster)
    complete(cluster)
    decided_twice(cluster)
