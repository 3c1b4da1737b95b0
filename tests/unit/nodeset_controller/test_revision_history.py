"""Rule 7e: revision history, one apps/v1 ControllerRevision per template a NodeSet has run.

Create on change, reuse on rollback (the template's revision made the newest, never a
duplicate), prune beyond revisionHistoryLimit oldest first, never prune a revision a pod
still runs (nor the current or update revision); currentRevision/updateRevision in the
status; the commands are ones k8s-watcher lets nodeset-controller send.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_watcher.policy import Allowed, authorize
from nodeflow_contracts.k8s import CreateObject, DeleteObject
from nodeflow_contracts.pod_protocol import NODESET_LABEL, REVISION_LABEL
from nodeset_controller.commands import to_outgoing
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.history import (
    CreateRevision,
    DeleteRevision,
    plan_history,
    revision_name,
    revision_object,
    revision_template,
)
from nodeset_controller.planner import ClusterView, Plan, plan
from nodeset_controller.podspec import revision_hash
from nodeset_controller.spec import DEFAULT_REVISION_HISTORY_LIMIT, parse, validate
from tests.unit.nodeset_controller.builders import (
    CLUSTER,
    DEFAULTS,
    NS,
    T0,
    cluster_status,
    nodeset,
    slurm,
)
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, view
from tests.unit.plan_checks import expect_actions

NAMES = [f"gpu-001-{i + 1:03d}" for i in range(4)]


def template_spec(image: str) -> dict[str, Any]:
    return {"containers": [{"name": "slurmd", "image": image}]}


def stored(obj: dict[str, Any], image: str, number: int) -> dict[str, Any]:
    """The revision of the template running `image` as the API server holds it."""
    spec = parse(nodeset(template_spec=template_spec(image)), DEFAULTS)
    made = revision_object(spec, revision_hash(template_spec(image)), number)
    made["metadata"].update(uid=f"uid-rev-{image}", resourceVersion=f"{number}00")
    return made


def history_of(result: Plan, *kinds: type[Any]) -> list[object]:
    """The plan's revision actions of `kinds` (all three by default)."""
    wanted = kinds or (CreateRevision, DeleteRevision)
    return [a for a in result.actions if isinstance(a, wanted)]


def planned(
    obj: dict[str, Any],
    revisions: list[dict[str, Any]],
    *,
    pod_count: int = 2,
    pod_revision: str = REV,
) -> Plan:
    node_map, pods = full(pod_count, revision=pod_revision)
    states = {name: slurm(name) for name in NAMES[:pod_count]}
    base: ClusterView = view(obj, node_map, pods, states)
    return plan(dataclasses.replace(base, revisions=revisions))


def test_rule_create_on_change_a_new_template_gets_a_revision_one_above_the_highest() -> None:
    first = planned(nodeset(replicas=2), [])
    (create,) = expect_actions(first.actions, CreateRevision, count=1)
    assert (create.name, create.hash, create.revision) == (f"gpu-{REV}", REV, 1)
    # The template changes: a second revision above the first.
    obj = nodeset(replicas=2, template_spec=template_spec("slurmd:2"))
    changed = planned(obj, [stored(obj, "slurmd:1", 1)])
    (create,) = expect_actions(changed.actions, CreateRevision, count=1)
    assert create.revision == 2
    assert create.name == revision_name("gpu", revision_hash(template_spec("slurmd:2")))
    assert history_of(changed, DeleteRevision) == []


def test_rule_create_on_change_the_revision_holds_the_template_owned_and_labelled() -> None:
    obj = nodeset(replicas=2)
    spec = parse(obj, DEFAULTS)
    (create,) = expect_actions(planned(obj, []).actions, CreateRevision, count=1)
    outgoing = to_outgoing(spec, create, T0)
    operation = outgoing.command.operation
    assert isinstance(operation, CreateObject)
    made = operation.object
    assert (made["apiVersion"], made["kind"]) == ("apps/v1", "ControllerRevision")
    assert made["metadata"]["labels"] == {NODESET_LABEL: "gpu", REVISION_LABEL: REV}
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("NodeSet", spec.uid, True)
    assert revision_template(made) == obj["spec"]["template"]
    assert made["revision"] == 1
    # Allowed only because it carries the NodeSet label (checked on the payload).
    subject = f"cmd.k8s.v1.nodeset-controller.{outgoing.command.op}"
    assert authorize(outgoing.command, subject) == Allowed()


def test_rule_unchanged_template_whose_revision_is_the_highest_needs_nothing() -> None:
    obj = nodeset(replicas=2, template_spec=template_spec("slurmd:2"))
    hash2 = revision_hash(template_spec("slurmd:2"))
    revisions = [stored(obj, "slurmd:1", 1), stored(obj, "slurmd:2", 2)]
    result = planned(obj, revisions, pod_revision=hash2)
    assert history_of(result) == []
    assert result.wanted_status["updateRevision"] == revision_name("gpu", hash2)


def test_rule_reuse_on_rollback_makes_the_earlier_revision_the_newest_without_a_duplicate() -> None:
    """Back to slurmd:1 while slurmd:2 (revision 2) is the highest: its revision object is
    deleted (uid and resourceVersion preconditions) and, once gone, made again under the same
    name as revision 3 -- never a second object for the template."""
    obj = nodeset(replicas=2, template_spec=template_spec("slurmd:1"))
    hash1 = revision_hash(template_spec("slurmd:1"))
    hash2 = revision_hash(template_spec("slurmd:2"))
    revisions = [stored(obj, "slurmd:1", 1), stored(obj, "slurmd:2", 2)]
    result = planned(obj, revisions, pod_revision=hash2)
    assert history_of(result, CreateRevision) == []
    (deleted,) = expect_actions(result.actions, DeleteRevision, count=1)
    assert deleted.name == revision_name("gpu", hash1)
    assert (deleted.uid, deleted.resource_version) == ("uid-rev-slurmd:1", "100")
    command = to_outgoing(parse(obj, DEFAULTS), deleted, T0).command
    assert isinstance(command.operation, DeleteObject)
    assert (command.target.uid, command.target.resource_version) == ("uid-rev-slurmd:1", "100")
    verdict = authorize(command, "cmd.k8s.v1.nodeset-controller.delete")
    assert verdict == Allowed(required_label=NODESET_LABEL)
    # Gone: made again as the newest, under its name.
    again = planned(obj, revisions[1:], pod_revision=hash2)
    (create,) = expect_actions(again.actions, CreateRevision, count=1)
    assert (create.name, create.revision) == (revision_name("gpu", hash1), 3)
    assert history_of(again, DeleteRevision) == []
    # Made: nothing more, the history is 2 then 3.
    remade = stored(obj, "slurmd:1", 3)
    settled = planned(obj, [revisions[1], remade], pod_revision=hash1)
    assert history_of(settled) == []


def test_rule_prune_beyond_limit_deletes_the_oldest_revisions_no_pod_runs() -> None:
    obj = nodeset(
        replicas=2, template_spec=template_spec("slurmd:5"), extra={"revisionHistoryLimit": 2}
    )
    revisions = [stored(obj, f"slurmd:{i}", i) for i in range(1, 6)]
    hash5 = revision_hash(template_spec("slurmd:5"))
    result = planned(obj, revisions, pod_revision=hash5)
    deleted = expect_actions(result.actions, DeleteRevision, count=2)
    assert [d.uid for d in deleted] == ["uid-rev-slurmd:1", "uid-rev-slurmd:2"]
    command = to_outgoing(parse(obj, DEFAULTS), deleted[0], T0).command
    assert isinstance(command.operation, DeleteObject)
    assert (command.target.uid, command.target.resource_version) == ("uid-rev-slurmd:1", "100")
    verdict = authorize(command, "cmd.k8s.v1.nodeset-controller.delete")
    assert verdict == Allowed(required_label=NODESET_LABEL)


def test_rule_prune_keeps_ten_by_default() -> None:
    assert parse(nodeset(), DEFAULTS).revision_history_limit == DEFAULT_REVISION_HISTORY_LIMIT == 10
    obj = nodeset(replicas=2, template_spec=template_spec("slurmd:12"))
    revisions = [stored(obj, f"slurmd:{i}", i) for i in range(1, 13)]
    hash12 = revision_hash(template_spec("slurmd:12"))
    (deleted,) = expect_actions(
        planned(obj, revisions, pod_revision=hash12).actions, DeleteRevision, count=1
    )
    assert deleted.uid == "uid-rev-slurmd:1"


def test_rule_never_prune_a_live_revision_a_pod_still_runs() -> None:
    # Limit 0: every revision no pod runs goes, but the pods still run slurmd:1 (a rollout
    # not started yet), so revision 1 stays with the update revision.
    obj = nodeset(
        replicas=2, template_spec=template_spec("slurmd:3"), extra={"revisionHistoryLimit": 0}
    )
    revisions = [stored(obj, f"slurmd:{i}", i) for i in range(1, 4)]
    hash1 = revision_hash(template_spec("slurmd:1"))
    result = planned(obj, revisions, pod_revision=hash1)
    (deleted,) = expect_actions(result.actions, DeleteRevision, count=1)
    assert deleted.uid == "uid-rev-slurmd:2"
    assert result.wanted_status["currentRevision"] == revision_name("gpu", hash1)
    assert result.wanted_status["updateRevision"] == revision_name(
        "gpu", revision_hash(template_spec("slurmd:3"))
    )


def test_rule_status_reports_the_update_revision_and_current_once_every_pod_runs_it() -> None:
    obj = nodeset(replicas=2)
    result = planned(obj, [stored(obj, "slurmd:1", 1)])
    assert result.status is not None
    assert result.status["updateRevision"] == result.status["currentRevision"] == f"gpu-{REV}"
    # Reported already: the status is not written again.
    again = planned(nodeset(replicas=2, status=result.wanted_status), [stored(obj, "slurmd:1", 1)])
    assert again.status is None


def test_rule_an_invalid_spec_keeps_the_revisions_reported_before() -> None:
    status = {"currentRevision": "gpu-a", "updateRevision": "gpu-b"}
    obj = nodeset(replicas=2, extra={"revisionHistoryLimit": -1}, status=status)
    assert [p.field for p in validate(obj)] == ["spec.revisionHistoryLimit"]
    result = planned(obj, [])
    assert result.nodeset is None
    assert result.wanted_status["currentRevision"] == "gpu-a"
    assert result.wanted_status["updateRevision"] == "gpu-b"


def test_rule_a_revision_not_owned_by_the_nodeset_is_never_touched() -> None:
    obj = nodeset(replicas=2, extra={"revisionHistoryLimit": 0})
    spec = parse(obj, DEFAULTS)
    foreign = stored(obj, "slurmd:9", 1)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    squatter = revision_object(spec, REV, 1)
    squatter["metadata"]["ownerReferences"] = []
    actions = plan_history(spec, REV, [foreign, squatter], [REV], {}).actions
    assert actions == []


@settings(max_examples=200, deadline=None)
@given(
    numbers=st.lists(st.integers(1, 40), min_size=1, max_size=12, unique=True),
    limit=st.integers(0, 5),
    live=st.sets(st.integers(0, 11), max_size=4),
    update=st.integers(0, 12),
)
def test_property_prune_never_deletes_a_live_revision_and_keeps_the_limit(
    numbers: list[int], limit: int, live: set[int], update: int
) -> None:
    obj = nodeset(template_spec=template_spec(f"slurmd:{update}"))
    spec = dataclasses.replace(parse(obj, DEFAULTS), revision_history_limit=limit)
    revisions = [stored(obj, f"slurmd:{i}", n) for i, n in enumerate(numbers)]
    pod_hashes = [revision_hash(template_spec(f"slurmd:{i}")) for i in live]
    update_hash = revision_hash(template_spec(f"slurmd:{update}"))
    history = plan_history(spec, update_hash, revisions, pod_hashes, {})
    deleted = {a.name for a in history.actions if isinstance(a, DeleteRevision)}
    update_name = revision_name("gpu", update_hash)
    newest = max(revisions, key=lambda r: r["revision"])["metadata"]["name"]
    existing = {r["metadata"]["name"] for r in revisions}
    if update_name in deleted:
        # Only a rollback deletes the update revision: to make it again as the newest.
        assert update_name in existing and update_name != newest
        deleted.discard(update_name)
    live_names = {revision_name("gpu", h) for h in [*pod_hashes, update_hash]}
    assert not deleted & live_names
    assert history.current_revision not in deleted
    kept_history = [r for r in revisions if r["metadata"]["name"] not in deleted | live_names]
    assert len(kept_history) == min(limit, len(kept_history) + len(deleted))
    # The oldest go first: every deleted revision is older than every kept non-live one.
    by_name = {r["metadata"]["name"]: r["revision"] for r in revisions}
    if deleted and kept_history:
        assert max(by_name[n] for n in deleted) < min(r["revision"] for r in kept_history)


def test_namespace_of_the_revision_is_the_nodesets() -> None:
    spec = parse(nodeset(), DEFAULTS)
    assert revision_object(spec, REV, 1)["metadata"]["namespace"] == NS


async def test_rule_a_restarted_controller_reads_the_history_back_from_the_mirrored_revisions() -> (
    None
):
    """Restart safety at the service level: the controller's decision loop against an
    in-memory cluster. With no revision mirrored it sends the template's create; a new
    controller that finds it (and an older one) in the ControllerRevision view sends none,
    nor one for another NodeSet's revision; once the view loses it, the create comes again
    with the next number."""
    obj = nodeset(replicas=0, template_spec=template_spec("slurmd:2"))
    hash2 = revision_hash(template_spec("slurmd:2"))
    first = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
    first.clusters.put(CLUSTER, cluster_status())
    first.nodesets.put(KEY, obj)
    sent = [c for c in await first.round(KEY, T0) if c.target.kind == "ControllerRevision"]
    assert [(c.op, c.target.name) for c in sent] == [("create", revision_name("gpu", hash2))]

    restarted = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
    restarted.clusters.put(CLUSTER, cluster_status())
    restarted.nodesets.put(KEY, obj)
    older, current = stored(obj, "slurmd:1", 1), stored(obj, "slurmd:2", 2)
    cpu = parse(nodeset("cpu", template_spec=template_spec("slurmd:7")), DEFAULTS)
    other = revision_object(cpu, revision_hash(template_spec("slurmd:7")), 9)
    for revision in (older, current, other):
        key = f"{NS}.{revision['metadata']['name']}"
        restarted.revisions.put(key, revision)
    commands = await restarted.round(KEY, T0 + 1)
    assert [c for c in commands if c.target.kind == "ControllerRevision"] == []
    restarted.revisions.delete(f"{NS}.{current['metadata']['name']}")
    again = [c for c in await restarted.round(KEY, T0 + 2) if c.target.kind == "ControllerRevision"]
    assert [(c.op, c.target.name) for c in again] == [("create", revision_name("gpu", hash2))]
    operation = again[0].operation
    assert isinstance(operation, CreateObject) and operation.object["revision"] == 2
