"""k8s-watcher applies cmd.k8s.v1.* commands and publishes their outcomes (emulator, NATS)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from k8s_watcher.commands import IDEMPOTENCY_ANNOTATION
from k8s_watcher.executor import applied_key
from nodeflow_contracts.k8s import (
    BindPod,
    CordonNode,
    CreateObject,
    DeleteObject,
    EvictPod,
    NominatePod,
    ObjectRef,
    PatchObject,
    RecordEvent,
    UncordonNode,
    UpdateStatus,
)
from nodeflow_contracts.pod_protocol import NODESET_LABEL, SLURM_STATE_CONDITION_PREFIX
from nodeflow_contracts.topology import APPLIED_COMMANDS_BUCKET
from tests.integration.k8s_watcher.conftest import Harness, node, pod, wait_until


def pod_ref(name: str, **preconditions: str) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Pod", name=name, namespace="default", **preconditions)


def node_ref(name: str) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Node", name=name)


NODESLICE = {
    "apiVersion": "nodeflow.dev/v1alpha1",
    "kind": "NodeSlice",
    "metadata": {"name": "slice-0", "namespace": "default"},
    "spec": {"nodeSetName": "gpu", "nodes": ["gpu-001"]},
}


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                }
            }
        },
    }


async def test_create_pod_job_and_nodeslice_is_applied_with_resource_version(
    harness: Harness,
) -> None:
    await harness.start_watcher()
    sent = [
        await harness.send(pod_ref("made"), CreateObject(object=pod("made"))),
        await harness.send(
            ObjectRef(api_version="batch/v1", kind="Job", name="job-1", namespace="default"),
            CreateObject(object=job("job-1")),
        ),
        await harness.send(
            ObjectRef(
                api_version="nodeflow.dev/v1alpha1",
                kind="NodeSlice",
                name="slice-0",
                namespace="default",
            ),
            CreateObject(object=NODESLICE),
        ),
    ]
    for cmd in sent:
        outcome = await harness.final_outcome(cmd.idempotency_key)
        assert outcome.outcome == "applied", outcome
        assert outcome.http_status == 201 and outcome.resource_version
        assert outcome.subject == f"outcome.k8s.v1.{cmd.op}"
    created = harness.store.get("pods", "made", "default")
    assert created["metadata"]["annotations"][IDEMPOTENCY_ANNOTATION] == sent[0].idempotency_key
    assert harness.store.get("nodeslices", "slice-0", "default")["spec"]["nodes"] == ["gpu-001"]
    # The watch side mirrors what the command created.
    await wait_until(lambda: harness.event_types("Pod", "made", "default") == ["ADDED"])


async def test_repeated_idempotency_key_is_already_applied_even_after_a_restart(
    harness: Harness,
) -> None:
    harness.store.create("nodes", node("n1"))
    await harness.start_watcher(watched_kinds=("Node",))
    cmd = await harness.send(node_ref("n1"), CordonNode(), key="cordon-n1-once")
    assert (await harness.final_outcome(cmd.idempotency_key)).outcome == "applied"
    harness.store.patch("nodes", "n1", {"spec": {"unschedulable": None}})
    await harness.stop_watcher()

    await harness.start_watcher(watched_kinds=("Node",))
    # A new Nats-Msg-Id: a resend after JetStream's duplicate window.
    await harness.send(node_ref("n1"), CordonNode(), key="cordon-n1-once", msg_id="resend")
    await wait_until(lambda: len(harness.outcomes_of("cordon-n1-once")) == 2)
    outcomes = [o.outcome for o in harness.outcomes_of("cordon-n1-once")]
    assert outcomes == ["applied", "already-applied"]
    assert not harness.store.get("nodes", "n1")["spec"].get("unschedulable")


async def test_create_repeated_after_a_lost_record_is_already_applied_from_the_annotation(
    harness: Harness,
) -> None:
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(pod_ref("p"), CreateObject(object=pod("p")), key="create-p")
    assert (await harness.final_outcome("create-p")).outcome == "applied"
    kv = await harness.bus.js.key_value(APPLIED_COMMANDS_BUCKET)
    await kv.purge(applied_key(cmd.idempotency_key))

    await harness.send(pod_ref("p"), CreateObject(object=pod("p")), key="create-p", msg_id="again")
    await wait_until(lambda: len(harness.outcomes_of("create-p")) == 2)
    assert harness.outcomes_of("create-p")[1].outcome == "already-applied"
    other = await harness.send(pod_ref("p"), CreateObject(object=pod("p")), key="someone-else")
    outcome = await harness.final_outcome(other.idempotency_key)
    assert (outcome.outcome, outcome.http_status) == ("conflict", 409)
    assert "already exists" in outcome.message


async def test_delete_with_stale_uid_is_conflict_and_not_retried(harness: Harness) -> None:
    harness.store.create("pods", pod("victim"))
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(pod_ref("victim", uid="not-the-uid"), DeleteObject())
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert (outcome.outcome, outcome.http_status, outcome.attempt) == ("conflict", 409, 1)
    assert "Precondition failed" in outcome.message
    await asyncio.sleep(0.3)
    assert len(harness.outcomes_of(cmd.idempotency_key)) == 1
    assert harness.store.get("pods", "victim", "default")


async def test_delete_with_matching_preconditions_and_propagation_policy_is_applied(
    harness: Harness,
) -> None:
    created = harness.store.create("pods", pod("victim"))
    meta = created["metadata"]
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(
        pod_ref("victim", uid=meta["uid"], resource_version=meta["resourceVersion"]),
        DeleteObject(propagation_policy="Foreground", grace_period_seconds=0),
    )
    assert (await harness.final_outcome(cmd.idempotency_key)).outcome == "applied"
    await wait_until(lambda: harness.event_types("Pod", "victim", "default")[-1:] == ["DELETED"])
    missing = await harness.send(pod_ref("victim"), DeleteObject())
    outcome = await harness.final_outcome(missing.idempotency_key)
    assert (outcome.outcome, outcome.http_status) == ("not-found", 404)


async def test_patch_merge_strategic_json_and_status_subresource(harness: Harness) -> None:
    created = harness.store.create("pods", pod("target"))
    await harness.start_watcher(watched_kinds=("Pod",))
    patches = [
        PatchObject(patch_type="merge", patch={"metadata": {"labels": {"merge": "yes"}}}),
        PatchObject(
            patch_type="strategic", patch={"metadata": {"annotations": {"strategic": "yes"}}}
        ),
        PatchObject(
            patch_type="json",
            patch=[{"op": "add", "path": "/metadata/labels/json", "value": "yes"}],
        ),
        PatchObject(
            patch_type="merge",
            patch={"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            subresource="status",
        ),
    ]
    ref = pod_ref("target", uid=created["metadata"]["uid"])
    keys = [(await harness.send(ref, patch)).idempotency_key for patch in patches]
    for key in keys:
        assert (await harness.final_outcome(key)).outcome == "applied"
    current = harness.store.get("pods", "target", "default")
    assert current["metadata"]["labels"] == {"merge": "yes", "json": "yes"}
    assert current["metadata"]["annotations"] == {"strategic": "yes"}
    assert current["status"]["conditions"][0]["type"] == "Ready"


async def test_patch_with_stale_resource_version_is_conflict(harness: Harness) -> None:
    created = harness.store.create("pods", pod("target"))
    harness.store.patch("pods", "target", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
    await harness.start_watcher(watched_kinds=("Pod",))
    stale = pod_ref("target", resource_version=created["metadata"]["resourceVersion"])
    for patch in (
        PatchObject(patch_type="merge", patch={"metadata": {"labels": {"x": "y"}}}),
        PatchObject(
            patch_type="json", patch=[{"op": "add", "path": "/spec/hostname", "value": "h"}]
        ),
    ):
        cmd = await harness.send(stale, patch)
        outcome = await harness.final_outcome(cmd.idempotency_key)
        assert (outcome.outcome, outcome.http_status) == ("conflict", 409)
    assert "x" not in harness.store.get("pods", "target", "default")["metadata"]["labels"]


async def test_cordon_and_uncordon_set_spec_unschedulable(harness: Harness) -> None:
    harness.store.create("nodes", node("n1"))
    await harness.start_watcher(watched_kinds=("Node",))
    cordon = await harness.send(node_ref("n1"), CordonNode())
    assert (await harness.final_outcome(cordon.idempotency_key)).outcome == "applied"
    assert harness.store.get("nodes", "n1")["spec"]["unschedulable"] is True
    uncordon = await harness.send(node_ref("n1"), UncordonNode())
    assert (await harness.final_outcome(uncordon.idempotency_key)).outcome == "applied"
    assert not harness.store.get("nodes", "n1")["spec"].get("unschedulable")


def budget(min_available: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
    }


def running(name: str) -> dict[str, Any]:
    manifest = pod(name, app="train")
    manifest["spec"]["nodeName"] = "n1"
    return manifest


async def test_eviction_refused_by_budget_is_retried_with_backoff_then_failed(
    harness: Harness,
) -> None:
    harness.store.create("pods", running("w0"))
    harness.store.patch(
        "pods",
        "w0",
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        namespace="default",
        subresource="status",
    )
    harness.store.create("poddisruptionbudgets", budget(1))
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(pod_ref("w0"), EvictPod())
    outcome = await harness.final_outcome(cmd.idempotency_key, timeout=10.0)
    outcomes = harness.outcomes_of(cmd.idempotency_key)
    assert outcome.outcome == "failed" and outcome.http_status == 429
    assert [o.outcome for o in outcomes] == ["retrying"] * 7 + ["failed"]
    assert [o.attempt for o in outcomes] == list(range(1, 9))
    assert "disruption budget" in outcomes[0].message
    # The delays between attempts grow (backoff), they are not a tight loop.
    gaps = [b.finished_at - a.finished_at for a, b in itertools.pairwise(outcomes)]
    assert min(gaps) >= 0.04
    assert harness.store.get("pods", "w0", "default")
    dead = await harness.bus.js.stream_info("DEAD_LETTERS")
    assert dead.state.messages == 1


async def test_eviction_applies_when_the_budget_allows_it(harness: Harness) -> None:
    harness.store.create("pods", running("w0"))
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(pod_ref("w0"), EvictPod(grace_period_seconds=0))
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert (outcome.outcome, outcome.http_status) == ("applied", 201)


async def test_bind_sets_node_name_and_binding_a_bound_pod_is_conflict(harness: Harness) -> None:
    harness.store.create("pods", pod("unbound"))
    await harness.start_watcher(watched_kinds=("Pod",))
    bind = await harness.send(pod_ref("unbound"), BindPod(node_name="n1"))
    assert (await harness.final_outcome(bind.idempotency_key)).outcome == "applied"
    assert harness.store.get("pods", "unbound", "default")["spec"]["nodeName"] == "n1"
    again = await harness.send(pod_ref("unbound"), BindPod(node_name="n2"))
    outcome = await harness.final_outcome(again.idempotency_key)
    assert (outcome.outcome, outcome.http_status) == ("conflict", 409)


async def test_nominate_sets_and_clears_status_nominated_node_name(harness: Harness) -> None:
    harness.store.create("pods", pod("pending"))
    await harness.start_watcher(watched_kinds=("Pod",))
    cmd = await harness.send(pod_ref("pending"), NominatePod(node_name="n7"))
    assert (await harness.final_outcome(cmd.idempotency_key)).outcome == "applied"
    assert harness.store.get("pods", "pending", "default")["status"]["nominatedNodeName"] == "n7"
    clear = await harness.send(pod_ref("pending"), NominatePod(node_name=""))
    assert (await harness.final_outcome(clear.idempotency_key)).outcome == "applied"
    status = harness.store.get("pods", "pending", "default").get("status") or {}
    assert "nominatedNodeName" not in status


async def test_update_status_replaces_a_custom_resource_status(harness: Harness) -> None:
    harness.store.create("nodeslices", NODESLICE)
    await harness.start_watcher(watched_kinds=("NodeSlice",))
    ref = ObjectRef(
        api_version="nodeflow.dev/v1alpha1", kind="NodeSlice", name="slice-0", namespace="default"
    )
    first = await harness.send(ref, UpdateStatus(status={"nodeCount": 1, "observedGeneration": 1}))
    assert (await harness.final_outcome(first.idempotency_key)).outcome == "applied"
    second = await harness.send(ref, UpdateStatus(status={"nodeCount": 0}))
    assert (await harness.final_outcome(second.idempotency_key)).outcome == "applied"
    stored = harness.store.get("nodeslices", "slice-0", "default")
    assert stored["status"] == {"nodeCount": 0}
    assert stored["spec"]["nodes"] == ["gpu-001"]


async def test_record_event_creates_a_core_event_about_the_target(harness: Harness) -> None:
    created = harness.store.create("nodes", node("gpu-009"))
    await harness.start_watcher(watched_kinds=("Node",))
    ref = ObjectRef(api_version="v1", kind="Node", name="gpu-009", uid=created["metadata"]["uid"])
    cmd = await harness.send(
        ref,
        RecordEvent(
            reason="Cordoned",
            message="maintenance window mw-1 started",
            type="Warning",
            action="Cordon",
            reporting_component="maintenance-scheduler",
        ),
    )
    assert (await harness.final_outcome(cmd.idempotency_key)).outcome == "applied"
    events = harness.store.list(
        "events", "default", field_selector="involvedObject.name=gpu-009"
    ).items
    (event,) = events
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-009",
        "uid": created["metadata"]["uid"],
    }
    assert (event["reason"], event["type"], event["message"]) == (
        "Cordoned",
        "Warning",
        "maintenance window mw-1 started",
    )
    assert event["reportingComponent"] == "maintenance-scheduler"
    assert event["source"] == {"component": "maintenance-scheduler"}
    assert event["firstTimestamp"] and event["count"] == 1


async def test_invalid_object_is_invalid_and_unknown_kinds_are_refused(harness: Harness) -> None:
    await harness.start_watcher(watched_kinds=("NodeSlice",))
    too_many = dict(NODESLICE, spec={"nodeSetName": "gpu", "nodes": [f"n{i}" for i in range(65)]})
    ref = ObjectRef(
        api_version="nodeflow.dev/v1alpha1", kind="NodeSlice", name="slice-0", namespace="default"
    )
    bad = await harness.send(ref, CreateObject(object=too_many))
    outcome = await harness.final_outcome(bad.idempotency_key)
    assert (outcome.outcome, outcome.http_status) == ("invalid", 422)
    assert outcome.message
    node_create = await harness.send(node_ref("n9"), CreateObject(object=node("n9")))
    refused = await harness.final_outcome(node_create.idempotency_key)
    assert (refused.outcome, refused.http_status) == ("forbidden", None)


async def test_403_is_forbidden_and_not_retried(harness: Harness) -> None:
    harness.store.create("nodes", node("n1"))
    await harness.start_watcher(watched_kinds=("Node",))
    await harness.faults(error_count=1, error_code=403, verbs=["patch"])
    cmd = await harness.send(node_ref("n1"), CordonNode())
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert (outcome.outcome, outcome.http_status, outcome.attempt) == ("forbidden", 403, 1)


async def test_500_and_429_are_reported_retrying_and_retried_until_applied(
    harness: Harness,
) -> None:
    await harness.start_watcher(watched_kinds=("Pod",))
    await harness.faults(error_count=1, error_code=500, verbs=["create"])
    first = await harness.send(pod_ref("a"), CreateObject(object=pod("a")))
    assert (await harness.final_outcome(first.idempotency_key)).outcome == "applied"
    await harness.faults(error_count=2, error_code=429, verbs=["create"])
    second = await harness.send(pod_ref("b"), CreateObject(object=pod("b")))
    assert (await harness.final_outcome(second.idempotency_key)).outcome == "applied"
    assert [(o.outcome, o.http_status) for o in harness.outcomes_of(first.idempotency_key)] == [
        ("retrying", 500),
        ("applied", 201),
    ]
    assert [o.outcome for o in harness.outcomes_of(second.idempotency_key)] == [
        "retrying",
        "retrying",
        "applied",
    ]


async def test_commands_for_the_same_object_apply_in_the_order_sent(harness: Harness) -> None:
    harness.store.create("pods", pod("ordered"))
    await harness.start_watcher(watched_kinds=("Pod",))
    # The first patch fails once: the second must still wait for it.
    await harness.faults(error_count=1, error_code=500, verbs=["patch"])
    keys = []
    for value in range(6):
        patch = PatchObject(patch_type="merge", patch={"metadata": {"labels": {"v": str(value)}}})
        keys.append((await harness.send(pod_ref("ordered"), patch)).idempotency_key)
    for key in keys:
        assert (await harness.final_outcome(key)).outcome == "applied"
    assert harness.store.get("pods", "ordered", "default")["metadata"]["labels"] == {"v": "5"}
    finished = [(await harness.final_outcome(key)).finished_at for key in keys]
    assert finished == sorted(finished)


async def test_commands_for_different_objects_run_concurrently(harness: Harness) -> None:
    await harness.start_watcher(watched_kinds=("Pod",), command_concurrency=16)
    await harness.faults(latency_ms=300)
    started = time.monotonic()
    keys = [
        (await harness.send(pod_ref(f"c{i}"), CreateObject(object=pod(f"c{i}")))).idempotency_key
        for i in range(10)
    ]
    for key in keys:
        assert (await harness.final_outcome(key, timeout=10)).outcome == "applied"
    assert time.monotonic() - started < 10 * 0.3 / 2


async def test_command_waits_while_the_api_is_down_and_applies_when_it_is_back(
    harness: Harness,
) -> None:
    harness.store.create("nodes", node("n1"))
    watcher = await harness.start_watcher(watched_kinds=("Node",))
    await harness.api_down()
    await wait_until(lambda: watcher.not_ready_reason() is not None)
    cmd = await harness.send(node_ref("n1"), CordonNode())
    await asyncio.sleep(0.5)
    assert harness.outcomes_of(cmd.idempotency_key) == []
    await harness.api_up()
    outcome = await harness.final_outcome(cmd.idempotency_key)
    assert (outcome.outcome, outcome.attempt) == ("applied", 1)
    assert harness.store.get("nodes", "n1")["spec"]["unschedulable"] is True
    await wait_until(lambda: watcher.not_ready_reason() is None)


async def test_rule_a_senders_commands_do_not_wait_behind_another_senders_backlog(
    harness: Harness,
) -> None:
    """Each sender has its own queue: a slurm-syncer condition patch sent behind a backlog of
    nodeset-controller creates (the API slowed to 20 requests/s) is applied while most of that
    backlog still waits. From one queue it came after the whole backlog."""
    harness.store.create("pods", pod("slurm-0"))
    await harness.start_watcher(
        watched_kinds=("Pod",), kube_qps=20.0, kube_burst=1, command_concurrency=4
    )
    controller = await harness.connect_as("nodeset-controller")
    syncer = await harness.connect_as("slurm-syncer")
    backlog = 120
    creates = [
        await harness.send(
            pod_ref(f"gpu-{i}"),
            CreateObject(object=pod(f"gpu-{i}", **{NODESET_LABEL: "gpu"})),
            sender="nodeset-controller",
            bus=controller,
        )
        for i in range(backlog)
    ]
    create_keys = {cmd.idempotency_key for cmd in creates}

    def creates_applied() -> int:
        return sum(
            1
            for o in harness.outcomes.items
            if o.idempotency_key in create_keys and o.outcome == "applied"
        )

    await wait_until(lambda: creates_applied() > 0, timeout=10)
    condition = {"type": f"{SLURM_STATE_CONDITION_PREFIX}Idle", "status": "True", "reason": "Idle"}
    patch = await harness.send(
        pod_ref("slurm-0"),
        PatchObject(
            patch_type="strategic",
            patch={"status": {"conditions": [condition]}},
            subresource="status",
        ),
        sender="slurm-syncer",
        bus=syncer,
    )
    outcome = await harness.final_outcome(patch.idempotency_key, timeout=15)
    applied_before = creates_applied()
    assert outcome.outcome == "applied", outcome.message
    assert applied_before < backlog // 2, f"{applied_before} of {backlog} creates went first"
    conditions = harness.store.get("pods", "slurm-0", "default")["status"]["conditions"]
    assert any(c["type"] == condition["type"] for c in conditions)
    # The backlog is not starved either: every create is applied.
    await wait_until(lambda: creates_applied() == backlog, timeout=30)
