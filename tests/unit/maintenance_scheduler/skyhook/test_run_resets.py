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
from maintenance_scheduler.skyhook.plan import CreateJob, plan_round
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import Cluster, make_skyhook

ANNOTATION = node_state_annotation("gpu-init")
DRIVER_AND_TUNING = {
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
    """Paused, the controller still rewrites its status from the nodes, so the reset node's
    earlier runs are no longer recorded there when it resumes: the Jobs that ran past their
    first stage show the run was used, and a new one starts (found on `make run`: `skyhook
    reset` while paused, then `resume`, ran nothing and showed every node complete)."""
    cluster = Cluster.of(make_skyhook(DRIVER_AND_TUNING))
    complete(cluster)
    cluster.skyhook = replace(cluster.skyhook, paused=True)
    cluster.reset_node("node-0")
    cluster.settle()
    assert "node-0" not in (cluster.skyhook.status.get("nodeState") or {})
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
