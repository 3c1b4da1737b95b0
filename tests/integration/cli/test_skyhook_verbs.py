"""`kubectl nodeflow skyhook|nodewright VERB` as an operator runs it (a process,
`--kubeconfig`) against the Kubernetes API emulator: each verb's effect on the objects, for a
Skyhook and a NodeWright each with its own keys; then, on the whole local stack with
maintenance-scheduler's Skyhook controller, that the controller acts on what the verbs wrote
(pause stops new stages and resume finishes, package rerun and node reset run the package
again, an ignored node runs nothing)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK, SkyhookNames
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.cli.plugin import run_plugin
from tests.integration.maintenance_scheduler.conftest import eventually, run_stack
from tests.integration.maintenance_scheduler.test_skyhook import (
    TWO_PACKAGES,
    SkyhookStack,
    condition_true,
    rounds_pass,
)

MERGE = "application/merge-patch+json"
PACKAGES = {
    "driver": {"version": "1.0.0", "image": "registry.local/driver"},
    "tuning": {"version": "2.0.0", "image": "registry.local/tuning"},
}


def entry(name: str, version: str, stage: str = "post-interrupt", state: str = "complete") -> Any:
    return {"name": name, "version": version, "image": f"registry.local/{name}",
            "stage": stage, "state": state, "restarts": 0}  # fmt: skip


STATE = {"driver|1.0.0": entry("driver", "1.0.0"), "tuning|2.0.0": entry("tuning", "2.0.0")}


def resource(names: SkyhookNames) -> str:
    return names.crd_name


def create_object(store: Store, names: SkyhookNames, name: str) -> None:
    store.create(
        resource(names),
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {"name": name},
            "spec": {"packages": copy.deepcopy(PACKAGES)},
        },
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """The emulator with the CRDs, a Skyhook and a NodeWright both named
    gpu-init, and three nodes: n1 and n2 carry a state of both, n3 none."""
    store = Store(bookmark_interval=0.2)
    assert NODEWRIGHT.crd_name in apply_crds(store, DEFAULT_CRD_DIR)
    for names in (SKYHOOK, NODEWRIGHT):
        create_object(store, names, "gpu-init")
    for node in ("n1", "n2", "n3"):
        marks: dict[str, str] = {}
        labels: dict[str, str] = {}
        if node != "n3":
            for names in (SKYHOOK, NODEWRIGHT):
                marks[names.node_state_annotation("gpu-init")] = json.dumps(STATE)
                marks[names.status_key("gpu-init")] = "complete"
                marks[names.version_annotation("gpu-init")] = "v0.9.0"
                labels[names.status_key("gpu-init")] = "complete"
        store.create(
            "nodes",
            {"metadata": {"name": node, "annotations": marks, "labels": labels}},
        )
    async with serve(store, kubeconfig_path=tmp_path / "kubeconfig") as server:
        yield server


async def cli(kubeconfig: Path, *args: str, answer: str = "") -> tuple[int, str]:
    """Run the plugin; its exit code and what it printed (stdout, then stderr)."""
    code, output, errors = await run_plugin(kubeconfig, *args, stdin=answer)
    return code, output + errors


def obj_annotations(store: Store, names: SkyhookNames) -> dict[str, str]:
    return dict(store.get(resource(names), "gpu-init")["metadata"].get("annotations") or {})


def node_meta(store: Store, node: str) -> dict[str, Any]:
    meta: dict[str, Any] = store.get("nodes", node)["metadata"]
    return meta


def node_entries(store: Store, names: SkyhookNames, node: str) -> dict[str, Any] | None:
    raw = (node_meta(store, node).get("annotations") or {}).get(
        names.node_state_annotation("gpu-init")
    )
    return None if raw is None else dict(json.loads(raw))


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_pause_resume_disable_enable_set_and_remove_the_objects_annotation(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    group, title = names.singular, f"{names.singular}.{names.group}/gpu-init"
    other = SKYHOOK if names is NODEWRIGHT else NODEWRIGHT

    code, out = await cli(config, group, "pause", "gpu-init", answer="n\n")
    assert code == 1 and "aborted: nothing changed" in out
    assert names.pause_annotation not in obj_annotations(store, names)
    code, out = await cli(config, group, "pause", "gpu-init", "--dry-run")
    assert (code, out.strip()) == (0, f"{title} paused (dry run)")
    assert names.pause_annotation not in obj_annotations(store, names)

    code, out = await cli(config, group, "pause", "gpu-init", answer="y\n")
    assert code == 0 and out.endswith(f"{title} paused\n"), out
    assert obj_annotations(store, names)[names.pause_annotation] == "true"
    assert obj_annotations(store, other) == {}  # the other group's object of that name
    code, out = await cli(config, group, "pause", "gpu-init", "-y")
    assert (code, out.strip()) == (0, f"{title} unchanged ({names.pause_annotation} is true)")
    code, out = await cli(config, group, "resume", "gpu-init", "-y")
    assert (code, out.strip()) == (0, f"{title} resumed")
    assert names.pause_annotation not in obj_annotations(store, names)

    code, out = await cli(config, group, "disable", "gpu-init", "--confirm")
    assert (code, out.strip()) == (0, f"{title} disabled")
    assert obj_annotations(store, names)[names.disable_annotation] == "true"
    code, out = await cli(config, group, "enable", "gpu-init", "-y")
    assert (code, out.strip()) == (0, f"{title} enabled")
    assert names.disable_annotation not in obj_annotations(store, names)

    code, out = await cli(config, group, "pause", "absent", "-y")
    assert (code, out.strip()) == (1, f"error: {names.kind} absent not found")


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_node_ignore_and_unignore_set_and_remove_the_groups_ignore_label(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    code, out = await cli(config, names.singular, "node", "ignore", "n[12]")
    assert code == 0 and out.splitlines() == ["node/n1 ignored", "node/n2 ignored"]
    for node in ("n1", "n2"):
        assert node_meta(store, node)["labels"][names.ignore_label] == "true"
    assert names.ignore_label not in (node_meta(store, "n3").get("labels") or {})
    other = SKYHOOK if names is NODEWRIGHT else NODEWRIGHT
    assert other.ignore_label not in node_meta(store, "n1")["labels"]
    code, out = await cli(config, names.singular, "node", "unignore", "n1", "n3")
    assert out.splitlines() == ["node/n1 unignored", "node/n3 unchanged (already not ignored)"]
    assert names.ignore_label not in node_meta(store, "n1")["labels"]
    assert node_meta(store, "n2")["labels"][names.ignore_label] == "true"


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_package_rerun_edits_only_the_packages_entry_on_the_nodes_named(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    group, owner_flag = names.singular, f"--{names.singular}"
    args = (group, "package", "rerun", "driver", owner_flag, "gpu-init")
    code, out = await cli(config, *args, "--node", "n1", "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    assert node_entries(store, names, "n1") == STATE

    code, out = await cli(config, *args, "--node", "n1", "-y")
    assert code == 0, out
    assert out.splitlines()[-1] == "package driver|1.0.0 reset on 1 node(s)"
    assert node_entries(store, names, "n1") == {"tuning|2.0.0": STATE["tuning|2.0.0"]}
    assert node_entries(store, names, "n2") == STATE
    other = SKYHOOK if names is NODEWRIGHT else NODEWRIGHT
    assert node_entries(store, other, "n1") == STATE

    code, out = await cli(config, *args, "--node", "n.*", "--stage", "config", "-y")
    assert code == 0, out
    # n1 has no driver entry any more: only n2 is reset, back at config and in progress.
    assert out.splitlines()[-1] == "package driver|1.0.0 reset on 1 node(s)"
    entries = node_entries(store, names, "n2")
    assert entries is not None
    assert entries["driver|1.0.0"] == {**STATE["driver|1.0.0"], "stage": "config",
                                       "state": "in_progress"}  # fmt: skip

    code, out = await cli(config, group, "package", "rerun", "gpu", owner_flag, "gpu-init",
                          "--node", "n1", "-y")  # fmt: skip
    assert code == 1 and "'gpu' is not in gpu-init's spec.packages (driver, tuning)" in out


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_node_reset_removes_the_objects_node_state_on_the_nodes_named(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    code, out = await cli(
        config, names.singular, "node", "reset", "n2", f"--{names.singular}", "gpu-init", "-y"
    )
    assert code == 0, out
    assert out.splitlines() == [
        f"{names.singular}.{names.group}/gpu-init: every package runs again on 1 node(s):",
        "  n2 (2 packages)",
        "1 node(s) reset",
    ]
    assert node_entries(store, names, "n2") is None
    assert node_entries(store, names, "n1") == STATE
    other = SKYHOOK if names is NODEWRIGHT else NODEWRIGHT
    assert node_entries(store, other, "n2") == STATE


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_reset_removes_every_nodes_marks_and_the_rollouts_batch_state(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    stopped = {"currentBatch": 3, "consecutiveFailures": 2, "completedNodes": 1,
               "failedNodes": 2, "shouldStop": True, "lastBatchSize": 2,
               "lastBatchFailed": True}  # fmt: skip
    store.patch(
        resource(names),
        "gpu-init",
        {"status": {"nodeOrderOffset": 4, "nodePriority": {"n1": "2026-01-01T00:00:00Z"},
                    "compartmentStatuses": {"__default__": {"batchState": stopped}}}},
        MERGE,
        subresource="status",
    )  # fmt: skip
    code, out = await cli(config, names.singular, "deployment-policy", "reset", "gpu-init",
                          "--dry-run")  # fmt: skip
    assert code == 0 and "  __default__: batch 3, 1 completed, 2 failed, stopped" in out
    # The runtime-required taint's mark, keyed by the taint's key as the controller writes it
    # (upstream's controller too): reset removes its own group's, so n1 is new again.
    other = SKYHOOK if names is NODEWRIGHT else NODEWRIGHT
    taint_marks = {n.auto_taint_annotation(n.group): "true" for n in (names, other)}
    store.patch("nodes", "n1", {"metadata": {"annotations": taint_marks}}, MERGE)
    code, out = await cli(config, names.singular, "reset", "gpu-init", "-y")
    assert code == 0, out
    assert "2 node(s) reset" in out and "batch state reset" in out
    for node in ("n1", "n2"):
        meta = node_meta(store, node)
        assert not [k for k in meta.get("annotations") or {} if k.startswith(names.prefix)]
        assert not [k for k in meta.get("labels") or {} if k.startswith(names.prefix)]
        assert node_entries(store, other, node) == STATE
    other_mark = other.auto_taint_annotation(other.group)
    assert node_meta(store, "n1")["annotations"][other_mark] == "true"
    status = store.get(resource(names), "gpu-init")["status"]
    assert status["nodeOrderOffset"] == 0 and "nodePriority" not in status
    batch = status["compartmentStatuses"]["__default__"]["batchState"]
    assert (batch["currentBatch"], batch["shouldStop"], batch["failedNodes"]) == (1, False, 0)


async def test_rule_package_logs_show_each_stage_container_of_the_packages_pods(
    cluster: RunningServer,
) -> None:
    store, config = cluster.store, cluster.kubeconfig_path
    store.create("namespaces", {"metadata": {"name": "skyhook"}})
    stage_labels = {SKYHOOK.name_label: "gpu-init", SKYHOOK.package_label: "driver",
                    SKYHOOK.stage_label: "apply"}  # fmt: skip
    containers = [
        {"name": "driver-init", "image": "registry.local/driver:1.0.0"},
        {"name": "driver-apply", "image": "agent:1", "args": ["apply", "/root", "/skyhook"]},
        {"name": "driver-applycheck", "image": "agent:1", "args": ["apply-check"]},
    ]
    store.create(
        "pods",
        {
            "metadata": {"name": "driver-apply-n1", "namespace": "skyhook",
                         "labels": stage_labels},
            "spec": {"nodeName": "n1", "initContainers": containers,
                     "containers": [{"name": "done", "image": "pause"}]},
        },
        "skyhook",
    )  # fmt: skip
    store.patch(
        "pods",
        "driver-apply-n1",
        {"status": {"initContainerStatuses": [
            {"name": "driver-init", "state": {"terminated": {"exitCode": 0}}},
            {"name": "driver-apply",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "driver-applycheck", "state": {"running": {}}},
        ]}},
        MERGE,
        namespace="skyhook",
        subresource="status",
    )  # fmt: skip
    code, out = await cli(config, "skyhook", "package", "logs", "driver", "--skyhook", "gpu-init")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "--- pod driver-apply-n1 on node n1, container driver-apply (exit 0)"
    assert "agent:1 started on n1: apply /root /skyhook" in lines
    assert "exited with code 0 (Completed)" in lines
    assert "--- pod driver-apply-n1 on node n1, container driver-applycheck (running)" in lines
    code, out = await cli(config, "skyhook", "package", "logs", "driver", "--skyhook", "gpu-init",
                          "--stage", "config")  # fmt: skip
    assert (code, out.strip()) == (
        0, "no pod of package driver of Skyhook gpu-init in namespace skyhook"
    )  # fmt: skip


# --- the controller acts on what the verbs wrote ---------------------------------------------


@pytest.fixture
async def sky(nats_server: NatsServerProcess) -> AsyncIterator[SkyhookStack]:
    async with run_stack(nats_server.url) as stack:
        running = SkyhookStack(stack)
        try:
            yield running
        finally:
            await running.stop()


def package_jobs(sky: SkyhookStack, skyhook: str, package: str, node: str) -> list[Any]:
    return [
        j
        for j in sky.jobs(skyhook)
        if j["metadata"]["labels"][SKYHOOK.package_label] == package
        and j["metadata"]["labels"][SKYHOOK.node_label] == node
    ]


async def test_rule_the_controller_stops_starting_stages_on_cli_pause_and_finishes_on_resume(
    sky: SkyhookStack,
) -> None:
    config = sky.stack.sim.kubeconfig_path
    await sky.start()
    sky.skyhook("pausable", TWO_PACKAGES, interruptionBudget={"count": 1})
    await eventually(lambda: sky.jobs("pausable"), timeout=30, what="a first Job")
    code, out = await cli(config, "skyhook", "pause", "pausable", "-y")
    assert code == 0, out
    await eventually(lambda: sky.status("pausable") == "paused", timeout=30, what="paused")

    def all_finished() -> bool:
        return all(
            condition_true(j, "Complete") or condition_true(j, "Failed")
            for j in sky.jobs("pausable")
        )

    await eventually(all_finished, timeout=30, what="running stages finished")
    before = len(sky.jobs("pausable"))
    await rounds_pass(sky, 3)
    assert len(sky.jobs("pausable")) == before
    code, out = await cli(config, "skyhook", "resume", "pausable", "-y")
    assert code == 0, out
    await eventually(lambda: sky.status("pausable") == "complete", timeout=90, what="complete")
    assert len(sky.jobs("pausable")) == 2 * 2 * len(sky.stack.node_names())


async def test_rule_the_controller_runs_a_package_again_after_cli_rerun_and_node_reset(
    sky: SkyhookStack,
) -> None:
    config = sky.stack.sim.kubeconfig_path
    await sky.start()
    # tuning waits for driver (dependsOn): a reset node runs it again too.
    packages: dict[str, Any] = copy.deepcopy(PACKAGES)
    packages["tuning"]["dependsOn"] = {"driver": "1.0.0"}
    sky.skyhook("again", packages)
    await eventually(lambda: sky.status("again") == "complete", timeout=60, what="complete")
    first, second = sky.stack.node_names()[:2]
    total_before = len(sky.jobs("again"))
    driver_before = len(package_jobs(sky, "again", "driver", first))
    tuning_before = len(package_jobs(sky, "again", "tuning", first))
    assert driver_before == tuning_before == 2  # apply, config

    # --stage config: that stage runs again, though its Complete Job of the earlier run is
    # still there.
    code, out = await cli(
        config, "skyhook", "package", "rerun", "driver", "--skyhook", "again",
        "--node", first, "--stage", "config", "-y",
    )  # fmt: skip
    assert code == 0, out
    await eventually(
        lambda: len(package_jobs(sky, "again", "driver", first)) == driver_before + 1,
        timeout=60,
        what="driver's config runs again on the node",
    )
    await eventually(lambda: sky.status("again") == "complete", timeout=60, what="complete")
    stages_run = [
        j["metadata"]["labels"][SKYHOOK.stage_label]
        for j in package_jobs(sky, "again", "driver", first)
    ]
    assert sorted(stages_run) == ["apply", "config", "config"]

    code, out = await cli(
        config, "skyhook", "package", "rerun", "driver", "--skyhook", "again",
        "--node", first, "-y",
    )  # fmt: skip
    assert code == 0, out
    await eventually(
        lambda: len(package_jobs(sky, "again", "driver", first)) == 2 * driver_before + 1,
        timeout=60,
        what="driver runs again on the node",
    )
    await eventually(lambda: sky.status("again") == "complete", timeout=60, what="complete")
    # Only driver, only on that node: its stages once more.
    assert len(package_jobs(sky, "again", "tuning", first)) == tuning_before
    assert len(sky.jobs("again")) == total_before + driver_before + 1

    code, out = await cli(
        config, "skyhook", "node", "reset", second, "--skyhook", "again", "-y"
    )  # fmt: skip
    assert code == 0, out
    await eventually(
        lambda: len(package_jobs(sky, "again", "tuning", second)) == 2 * tuning_before,
        timeout=60,
        what="every package, the dependent one included, runs again on the reset node",
    )
    await eventually(lambda: sky.status("again") == "complete", timeout=60, what="complete")
    assert len(package_jobs(sky, "again", "driver", second)) == 2 * driver_before


async def test_rule_the_controller_runs_nothing_on_a_node_the_cli_ignored(
    sky: SkyhookStack,
) -> None:
    config = sky.stack.sim.kubeconfig_path
    ignored = sky.stack.node_names()[0]
    code, out = await cli(config, "skyhook", "node", "ignore", ignored)
    assert code == 0, out
    await sky.start()
    sky.skyhook("skipper", {"driver": TWO_PACKAGES["driver"]})

    def others_complete() -> bool:
        labels = [
            sky.stack.node(n)["metadata"].get("labels") or {}
            for n in sky.stack.node_names()
            if n != ignored
        ]
        return all(lb.get(SKYHOOK.status_key("skipper")) == "complete" for lb in labels)

    await eventually(others_complete, timeout=60, what="the other nodes complete")
    await rounds_pass(sky, 2)
    assert not [
        j for j in sky.jobs("skipper") if j["metadata"]["labels"][SKYHOOK.node_label] == ignored
    ]
    code, out = await cli(config, "skyhook", "node", "unignore", ignored)
    assert code == 0, out
    await eventually(lambda: sky.status("skipper") == "complete", timeout=60, what="complete")
    assert package_jobs(sky, "skipper", "driver", ignored)
