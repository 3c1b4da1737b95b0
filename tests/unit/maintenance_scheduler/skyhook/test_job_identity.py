"""A Job proves only what it ran: the Skyhook (uid), the node (uid), the package version, the
run and the config (configMap and env) it ran with. A Complete Job of an earlier run, still
there within its 24 h TTL, never marks a stage done for the current one."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from maintenance_scheduler.skyhook.api import node_state_annotation
from maintenance_scheduler.skyhook.jobs import IDENTITY_ANNOTATION, build_job, job_identity
from maintenance_scheduler.skyhook.observe import job_facts
from maintenance_scheduler.skyhook.plan import CreateJob, plan_round
from maintenance_scheduler.skyhook.stages import config_hash, is_downgrade
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import (
    NAMESPACE,
    Cluster,
    make_skyhook,
)

DRIVER = {"driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"}}


def with_driver(version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
    return {"driver": {"version": version, "image": "ghcr.io/x/driver", **extra}}


def complete(cluster: Cluster) -> None:
    cluster.settle()
    assert cluster.status() == "complete"


def test_rule_a_re_added_package_runs_its_stages_again() -> None:
    cluster = Cluster.of(make_skyhook(with_driver()))
    complete(cluster)
    cluster.change({})
    complete(cluster)
    assert cluster.stages_created()[-1] == ("driver", "1.0.0", "uninstall")
    mark = len(cluster.created)
    # Re-added within the TTL: the Complete apply and config Jobs of the first run are still
    # there, and prove nothing for the second.
    cluster.change(with_driver())
    complete(cluster)
    assert cluster.stages_created(mark) == [
        ("driver", "1.0.0", "apply"),
        ("driver", "1.0.0", "config"),
    ]


def test_rule_a_reset_node_runs_its_stages_again() -> None:
    cluster = Cluster.of(make_skyhook(with_driver()))
    complete(cluster)
    mark = len(cluster.created)
    cluster.reset_node("node-0")
    complete(cluster)
    assert cluster.stages_created(mark) == [
        ("driver", "1.0.0", "apply"),
        ("driver", "1.0.0", "config"),
    ]


def test_rule_a_rolled_back_version_uninstalls_the_newer_then_applies_the_older() -> None:
    cluster = Cluster.of(make_skyhook(with_driver("1.0.0")))
    complete(cluster)
    cluster.change(with_driver("2.0.0"))
    complete(cluster)
    mark = len(cluster.created)
    cluster.change(with_driver("1.0.0"))
    complete(cluster)
    # As upstream's HandleVersionChange: a downgrade is uninstall old, apply new; the 1.0.0
    # Jobs of the first rollout are still there and count for nothing.
    assert cluster.stages_created(mark) == [
        ("driver", "2.0.0", "uninstall"),
        ("driver", "1.0.0", "apply"),
        ("driver", "1.0.0", "config"),
    ]
    state = json.loads(cluster.nodes["node-0"].annotations[node_state_annotation("gpu-init")])
    assert list(state) == ["driver|1.0.0"]


def test_rule_an_edited_config_map_runs_config_again_and_only_config() -> None:
    cluster = Cluster.of(make_skyhook(with_driver(configMap={"mode": "a"})))
    complete(cluster)
    mark = len(cluster.created)
    cluster.change(with_driver(configMap={"mode": "b"}))
    complete(cluster)
    assert cluster.stages_created(mark) == [("driver", "1.0.0", "config")]
    created = cluster.created[-1]
    assert created.config == config_hash(cluster.skyhook.packages[0])
    # Edited back within the TTL: the first config Job (same hash) is of another run's
    # config... it is the same run, so config runs once more with the new hash.
    mark = len(cluster.created)
    cluster.change(with_driver(configMap={"mode": "a"}, env=[{"name": "X", "value": "1"}]))
    complete(cluster)
    assert cluster.stages_created(mark) == [("driver", "1.0.0", "config")]


def test_rule_a_config_edit_mid_stage_reruns_that_stage_with_the_new_config() -> None:
    cluster = Cluster.of(make_skyhook(with_driver(configMap={"mode": "a"})))
    cluster.round()  # apply created
    (apply_job,) = cluster.jobs
    cluster.held_jobs.add(apply_job)
    cluster.change(with_driver(configMap={"mode": "b"}))
    for _ in range(3):
        cluster.round()
    # The old apply still runs on the node: no second apply pod beside it.
    assert [a.stage for a in cluster.created] == ["apply"]
    cluster.held_jobs.clear()
    complete(cluster)
    assert [a.stage for a in cluster.created] == ["apply", "apply", "config"]
    assert cluster.created[1].config == config_hash(cluster.skyhook.packages[0])


def test_rule_a_complete_job_recording_another_skyhook_or_node_counts_for_nothing() -> None:
    cluster = Cluster.of(make_skyhook(with_driver()))
    cluster.round()
    (name,) = cluster.jobs
    obj = cluster.jobs[name]
    action = cluster.created[0]
    expected = job_identity("uid-gpu-init", "node-uid-0", "1.0.0", action.run, action.config)
    assert json.loads(obj["metadata"]["annotations"][IDENTITY_ANNOTATION]) == expected
    for who, value in (("skyhook", "uid-old-gpu-init"), ("node", "node-uid-old")):
        forged = json.loads(json.dumps(obj))
        forged["metadata"]["annotations"][IDENTITY_ANNOTATION] = json.dumps(
            {**expected, who: value}
        )
        forged["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        world = replace(cluster.world(), jobs={name: job_facts(forged, [])})
        plan = plan_round(world, now=cluster.now + 1)
        assert not [a for a in plan.actions if isinstance(a, CreateJob)], who
        state = cluster.nodes["node-0"].annotations[node_state_annotation("gpu-init")]
        assert '"stage":"apply"' in state
        # The same Job with the right identity advances the package to config.
        obj_ok = json.loads(json.dumps(forged))
        obj_ok["metadata"]["annotations"][IDENTITY_ANNOTATION] = json.dumps(expected)
        world = replace(cluster.world(), jobs={name: job_facts(obj_ok, [])})
        plan = plan_round(world, now=cluster.now + 1)
        assert [a.stage for a in plan.actions if isinstance(a, CreateJob)] == ["config"]


def test_rule_a_re_created_skyhook_runs_every_stage_under_its_own_uid() -> None:
    first = Cluster.of(make_skyhook(with_driver(), uid="uid-a"))
    complete(first)
    # Deleted and created again under the same name: its old Jobs are still there.
    second = Cluster(make_skyhook(with_driver(), uid="uid-b"), first.nodes, jobs=first.jobs)
    second.reset_node("node-0")  # the deletion took its marks off the node
    complete(second)
    assert second.stages_created() == [("driver", "1.0.0", "apply"), ("driver", "1.0.0", "config")]


def test_rule_a_restarted_controller_finds_the_jobs_it_made() -> None:
    """The identity is durable (node annotation, Job annotation): the same state decides the
    same Job names, so a restart never makes a second Job for a stage."""
    cluster = Cluster.of(make_skyhook(with_driver()))
    first = plan_round(cluster.world(), now=cluster.now)
    again = plan_round(cluster.world(), now=cluster.now + 30)
    names = [a.name for a in first.actions if isinstance(a, CreateJob)]
    assert names and names == [a.name for a in again.actions if isinstance(a, CreateJob)]


def test_job_identity_is_recorded_on_the_job_itself() -> None:
    skyhook = make_skyhook(with_driver(configMap={"k": "v"}))
    package = skyhook.packages[0]
    job = build_job(
        skyhook,
        package,
        "apply",
        "node-0",
        namespace=NAMESPACE,
        default_stage_timeout_seconds=0,
        run="r1",
        config=config_hash(package),
        node_uid="node-uid-0",
    )
    assert job_facts(job, []).identity == job_identity(
        "uid-gpu-init", "node-uid-0", "1.0.0", "r1", config_hash(package)
    )
    assert job_facts(job, []).slot == ("gpu-init", "driver", "node-0")


def test_config_hash_follows_config_map_and_env_and_downgrade_follows_semver() -> None:
    base = make_skyhook(with_driver(configMap={"k": "v"})).packages[0]
    same = make_skyhook(with_driver(configMap={"k": "v"})).packages[0]
    other = make_skyhook(with_driver(configMap={"k": "w"})).packages[0]
    env = make_skyhook(with_driver(configMap={"k": "v"}, env=[{"name": "A"}])).packages[0]
    assert config_hash(base) == config_hash(same)
    assert len({config_hash(base), config_hash(other), config_hash(env)}) == 3
    assert is_downgrade("2.0.0", "1.9.9")
    assert is_downgrade("1.10.0", "1.9.0")
    assert is_downgrade("1.0.0", "1.0.0-rc.1")
    assert not is_downgrade("1.9.0", "1.10.0")
    assert not is_downgrade("1.0.0-rc.1", "1.0.0")
    assert not is_downgrade("1.0.0", "1.0.0")


def test_rule_a_restarted_controller_whose_node_patch_was_lost_reruns_no_stage() -> None:
    """The run never depends on the node's resourceVersion: the apply Job was made, its node
    patch (and the status write) lost with the controller, and the node changed since (a
    kubelet heartbeat, a label): the next controller finds that Job, it makes no second."""
    cluster = Cluster.of(make_skyhook(with_driver()))
    plan = plan_round(cluster.world(), now=cluster.now)
    (made,) = [a for a in plan.actions if isinstance(a, CreateJob)]
    assert made.stage == "apply"
    cluster.jobs[made.name] = build_job(
        made.skyhook,
        made.package,
        made.stage,
        made.node,
        namespace=NAMESPACE,
        default_stage_timeout_seconds=0,
        run=made.run,
        config=made.config,
        node_uid=made.node_uid,
    )
    cluster.created.append(made)
    node = cluster.nodes["node-0"]
    cluster.nodes["node-0"] = cluster.bump(node, labels={**node.labels, "rack": "r1"})
    complete(cluster)
    assert cluster.stages_created() == [("driver", "1.0.0", "apply"), ("driver", "1.0.0", "config")]


def test_rule_a_start_the_status_recorded_keeps_its_run_when_the_node_patch_was_lost() -> None:
    cluster = Cluster.of(make_skyhook(with_driver()))
    cluster.round()  # apply made; node patched and status written
    (made,) = cluster.created
    # The node lost its record (the patch never landed): the status still has the start.
    node = cluster.nodes["node-0"]
    kept = {k: v for k, v in node.annotations.items() if k != node_state_annotation("gpu-init")}
    cluster.nodes["node-0"] = cluster.bump(node, annotations=kept)
    complete(cluster)
    assert cluster.stages_created() == [("driver", "1.0.0", "apply"), ("driver", "1.0.0", "config")]
    assert cluster.created[1].run == made.run
