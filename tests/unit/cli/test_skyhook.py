"""`kubectl nodeflow skyhook|nodewright VERB` (nodeflow_cli.skyhook): each verb's patch, built
from the objects read, writes exactly the key the Skyhook controller reads, with the node's
resourceVersion wherever it edits a nodeState; each group writes only its own keys."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_cli import skyhook
from nodeflow_cli.main import ApiStatusError, parser
from nodeflow_cli.skyhook import (
    NodeState,
    VerbError,
    batch_reset_patch,
    container_state,
    ignore_patch,
    log_containers,
    log_pods,
    match_nodes,
    node_reset_patch,
    node_state,
    package_key,
    rerun_patch,
    reset_annotations,
    reset_patch,
)
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK

STATE = SKYHOOK.node_state_annotation("gpu-init")


def entry(name: str, version: str, stage: str = "post-interrupt", state: str = "complete") -> Any:
    return {"name": name, "version": version, "image": f"r/{name}", "stage": stage,
            "state": state, "restarts": 0, "run": "abc", "config": "c1"}  # fmt: skip


def node(name: str, rv: str = "7", state: dict[str, Any] | None = None, labels: Any = None) -> Any:
    annotations = {} if state is None else {STATE: json.dumps(state)}
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "annotations": annotations,
            "labels": dict(labels or {}),
        }
    }


TWO = {"driver|1.0.0": entry("driver", "1.0.0"), "tuning|2.0.0": entry("tuning", "2.0.0")}
GPU_INIT = {
    "metadata": {"name": "gpu-init"},
    "spec": {"packages": {"driver": {"version": "1.0.0", "image": "r/driver"}}},
}


def test_rule_node_names_are_exact_and_patterns_with_regex_characters_match_whole_names() -> None:
    names = ["gpu-1", "gpu-10", "cpu-1", "xgpu-1"]
    assert match_nodes(["gpu-1"], names) == ["gpu-1"]
    assert match_nodes(["gpu-.*"], names) == ["gpu-1", "gpu-10"]  # not xgpu-1: whole name
    assert match_nodes(["gpu-[0-9]", "cpu-1"], names) == ["cpu-1", "gpu-1"]
    assert match_nodes(["gpu"], names) == []
    with pytest.raises(VerbError, match="invalid node pattern"):
        match_nodes(["gpu-("], names)


def test_rule_an_unreadable_node_state_is_never_edited() -> None:
    broken = node("n1")
    broken["metadata"]["annotations"][STATE] = "{not json"
    with pytest.raises(VerbError, match="not JSON"):
        node_state(broken, STATE)
    broken["metadata"]["annotations"][STATE] = '{"driver|1.0.0": "complete"}'
    with pytest.raises(VerbError, match="not a map of package states"):
        node_state(broken, STATE)
    assert node_state(node("n2"), STATE) is None


def test_rule_rerun_removes_only_the_packages_entry_under_the_nodes_resource_version() -> None:
    state = node_state(node("n1", "41", TWO), STATE)
    assert state is not None
    patch = rerun_patch(state, STATE, "driver|1.0.0", None)
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "41"
    written = json.loads(patch["metadata"]["annotations"][STATE])
    assert written == {"tuning|2.0.0": TWO["tuning|2.0.0"]}


def test_rule_rerun_of_the_last_package_removes_the_annotation() -> None:
    state = node_state(node("n1", "5", {"driver|1.0.0": entry("driver", "1.0.0")}), STATE)
    assert state is not None
    patch = rerun_patch(state, STATE, "driver|1.0.0", None)
    assert patch == {"metadata": {"annotations": {STATE: None}, "resourceVersion": "5"}}


def test_rule_rerun_from_a_stage_puts_the_entry_back_in_progress_at_that_stage() -> None:
    state = node_state(node("n1", "9", TWO), STATE)
    assert state is not None
    patch = rerun_patch(state, STATE, "driver|1.0.0", "config")
    assert patch is not None
    written = json.loads(patch["metadata"]["annotations"][STATE])
    assert written["driver|1.0.0"] == {**TWO["driver|1.0.0"], "stage": "config",
                                       "state": "in_progress"}  # fmt: skip
    assert written["tuning|2.0.0"] == TWO["tuning|2.0.0"]


def test_rule_rerun_on_a_node_without_the_package_writes_nothing() -> None:
    state = node_state(node("n1", "9", TWO), STATE)
    assert state is not None
    assert rerun_patch(state, STATE, "driver|0.9.0", None) is None


@given(
    st.dictionaries(
        st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.sampled_from(["1.0.0", "2.1.0"]),
        min_size=1, max_size=6,
    ),
    st.data(),
)  # fmt: skip
def test_rule_rerun_never_touches_another_packages_entry(
    versions: dict[str, str], data: st.DataObject
) -> None:
    entries = {f"{n}|{v}": entry(n, v) for n, v in versions.items()}
    target = data.draw(st.sampled_from(sorted(entries)))
    stage = data.draw(st.sampled_from([None, *skyhook.STAGES]))
    patch = rerun_patch(NodeState("n", "3", entries), STATE, target, stage)
    assert patch is not None
    raw = patch["metadata"]["annotations"][STATE]
    written = json.loads(raw) if raw is not None else {}
    assert {k: v for k, v in written.items() if k != target} == {
        k: v for k, v in entries.items() if k != target
    }


def test_rule_package_key_is_name_and_version_from_the_objects_spec() -> None:
    assert package_key(GPU_INIT, "driver") == "driver|1.0.0"
    with pytest.raises(VerbError, match=r"'tuning' is not in gpu-init's spec.packages \(driver\)"):
        package_key(GPU_INIT, "tuning")


def test_rule_node_reset_removes_the_whole_node_state_under_its_resource_version() -> None:
    state = node_state(node("n1", "12", TWO), STATE)
    assert state is not None
    assert node_reset_patch(state, STATE) == {
        "metadata": {"annotations": {STATE: None}, "resourceVersion": "12"}
    }


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.group)
def test_rule_reset_removes_every_mark_of_the_object_and_only_its_groups(names: Any) -> None:
    marks = reset_annotations(names, "gpu-init")
    assert marks[0] == names.node_state_annotation("gpu-init")
    assert set(marks) == {
        names.node_state_annotation("gpu-init"),
        names.status_key("gpu-init"),
        names.version_annotation("gpu-init"),
        names.cordon_annotation("gpu-init"),
    }
    assert all(m.startswith(names.prefix) for m in marks)
    patch = reset_patch(NodeState("n1", "3", TWO), marks, (names.status_key("gpu-init"),))
    assert patch["metadata"]["annotations"] == dict.fromkeys(marks)
    assert patch["metadata"]["labels"] == {names.status_key("gpu-init"): None}
    assert patch["metadata"]["resourceVersion"] == "3"


def test_rule_batch_reset_starts_every_compartment_again_from_batch_one() -> None:
    stopped = {"currentBatch": 4, "consecutiveFailures": 3, "completedNodes": 5,
               "failedNodes": 3, "shouldStop": True, "lastBatchSize": 2,
               "lastBatchFailed": True}  # fmt: skip
    obj = {
        "status": {
            "nodeOrderOffset": 9,
            "nodePriority": {"n1": "2026-01-01T00:00:00Z"},
            "compartmentStatuses": {"__default__": {"batchState": stopped}, "gpu": {}},
        }
    }
    patch = batch_reset_patch(obj)["status"]
    assert patch["nodeOrderOffset"] == 0
    assert patch["nodePriority"] is None
    for name in ("__default__", "gpu"):
        state = patch["compartmentStatuses"][name]["batchState"]
        assert state["currentBatch"] == 1 and state["shouldStop"] is False
        assert state["consecutiveFailures"] == state["completedNodes"] == state["failedNodes"] == 0
    assert "compartmentStatuses" not in batch_reset_patch({"status": {}})["status"]


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.group)
def test_rule_ignore_sets_and_unignore_removes_the_groups_ignore_label(names: Any) -> None:
    plain = node("n1")
    assert ignore_patch(plain, names.ignore_label, True) == {
        "metadata": {"labels": {names.ignore_label: "true"}}
    }
    assert ignore_patch(plain, names.ignore_label, False) is None
    ignored = node("n1", labels={names.ignore_label: "true"})
    assert ignore_patch(ignored, names.ignore_label, True) is None
    assert ignore_patch(ignored, names.ignore_label, False) == {
        "metadata": {"labels": {names.ignore_label: None}}
    }


def pod(name: str, node_name: str, stage: str, created: str, status: Any = None) -> Any:
    return {
        "metadata": {"name": name, "creationTimestamp": created,
                     "labels": {SKYHOOK.stage_label: stage}},
        "spec": {"nodeName": node_name, "initContainers": [
            {"name": "driver-init"}, {"name": f"driver-{stage}"}, {"name": f"driver-{stage}check"}
        ]},
        "status": status or {},
    }  # fmt: skip


def test_rule_logs_show_the_stage_pods_newest_first_on_the_nodes_and_stage_asked() -> None:
    pods = [
        pod("a", "gpu-1", "apply", "2026-01-01T00:00:00Z"),
        pod("b", "gpu-1", "config", "2026-01-01T00:01:00Z"),
        pod("c", "gpu-2", "apply", "2026-01-01T00:02:00Z"),
    ]
    names = [skyhook.name_of(p) for p in log_pods(pods, [], SKYHOOK.stage_label, None)]
    assert names == ["c", "b", "a"]
    only = log_pods(pods, ["gpu-1"], SKYHOOK.stage_label, "apply")
    assert [skyhook.name_of(p) for p in only] == ["a"]
    assert log_containers(pods[0]) == ["driver-apply", "driver-applycheck"]


def test_rule_log_headers_say_each_containers_state() -> None:
    status = {"initContainerStatuses": [
        {"name": "driver-apply", "state": {"terminated": {"exitCode": 1}}},
        {"name": "driver-applycheck", "state": {"waiting": {"reason": "PodInitializing"}}},
    ]}  # fmt: skip
    running = pod("a", "gpu-1", "apply", "t", status)
    assert container_state(running, "driver-apply") == "exit 1"
    assert container_state(running, "driver-applycheck") == "waiting: PodInitializing"
    assert container_state(running, "driver-init") == "unknown"


def test_rule_each_group_has_its_verbs_and_a_nodewright_accepts_the_skyhook_flag() -> None:
    args = parser().parse_args(["skyhook", "pause", "gpu-init", "-y"])
    assert (args.command, args.verb, args.name, args.confirm) == (
        "skyhook",
        "pause",
        "gpu-init",
        True,
    )
    args = parser().parse_args(
        ["nodewright", "package", "rerun", "driver", "--skyhook", "gpu-init", "--node", "n1",
         "--node", "gpu-.*", "--stage", "config"]
    )  # fmt: skip
    assert (args.command, args.owner, args.node, args.stage) == (
        "nodewright", "gpu-init", ["n1", "gpu-.*"], "config"
    )  # fmt: skip
    args = parser().parse_args(["skyhook", "dp", "reset", "gpu-init", "--dry-run"])
    assert (args.verb, args.action, args.dry_run) == ("deployment-policy", "reset", True)
    args = parser().parse_args(["skyhook", "node", "reset", "n1", "n2", "--skyhook", "gpu-init"])
    assert (args.action, args.nodes, args.owner, args.confirm) == (
        "reset", ["n1", "n2"], "gpu-init", False
    )  # fmt: skip
    with pytest.raises(SystemExit):
        parser().parse_args(
            ["skyhook", "package", "rerun", "driver", "--skyhook", "x"]
        )  # no --node


class RacingKube:
    """The fault: the controller writes the node between the verb's read and its patch, so
    the first patch is refused (409) and the node read again shows the controller's state."""

    def __init__(self, first: Any, second: Any) -> None:
        self.nodes = {"items": [first]}
        self.second = second
        self.patches: list[Any] = []

    async def get(self, path: str) -> Any:
        if path == skyhook.NODES:
            return self.nodes
        if path.startswith(skyhook.NODES):
            return self.second
        return GPU_INIT

    async def patch(self, path: str, body: Any, content_type: str) -> Any:
        self.patches.append(body)
        if len(self.patches) == 1:
            raise ApiStatusError("conflict", 409)
        return body

    async def stream_text(self, path: str, *, follow: bool = False) -> AsyncIterator[bytes]:
        yield b""


def test_rule_rerun_decides_again_on_the_node_the_controller_changed_meanwhile() -> None:
    before = node("n1", "10", TWO)
    moved_on = {**TWO, "tuning|2.0.0": entry("tuning", "2.0.0", "apply", "in_progress")}
    kube = RacingKube(before, node("n1", "11", moved_on))
    said: list[str] = []
    ok = asyncio.run(
        skyhook.package_rerun(kube, SKYHOOK, "driver", "gpu-init", ["n1"], stage=None,
                              dry_run=False, confirm=None, say=said.append)
    )  # fmt: skip
    assert ok
    first, second = kube.patches
    assert first["metadata"]["resourceVersion"] == "10"
    assert second["metadata"]["resourceVersion"] == "11"
    # The controller's newer tuning entry is kept, not the one read first.
    assert json.loads(second["metadata"]["annotations"][STATE]) == {
        "tuning|2.0.0": moved_on["tuning|2.0.0"]
    }
    assert said[-1] == "package driver|1.0.0 reset on 1 node(s)"
