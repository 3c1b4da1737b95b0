from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clustersim.cluster.podlife import (
    RUNTIME_ANNOTATION,
    Outcome,
    crashloop_status,
    image_outcome,
    is_pod_ready,
    node_lost_status,
    pod_outcome,
    running_status,
    runtime_seconds,
    terminated_status,
    waiting_status,
)
from clustersim.cluster.slurmwire import registration_for, slurmd_should_run
from clustersim.runner import crd_documents

NOW = "2025-01-01T00:00:00Z"


def pod(*images: str, restart: str = "Always", job: bool = False, **meta: Any) -> Any:
    metadata: dict[str, Any] = {"name": "p", "namespace": "default", "uid": "u-1", **meta}
    if job:
        metadata["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "j", "controller": True}]
    return {
        "metadata": metadata,
        "spec": {
            "restartPolicy": restart,
            "containers": [{"name": f"c{i}", "image": image} for i, image in enumerate(images)],
        },
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("image", "finite", "outcome"),
    [
        ("repo/app:unpullable", True, Outcome.UNPULLABLE),
        ("app:fail", False, Outcome.FAIL),
        ("registry:5000/app:oom", True, Outcome.OOM),
        ("registry:5000/app", True, Outcome.SUCCEED),
        ("app:1.0", False, Outcome.RUN_FOREVER),
        ("failing/app", False, Outcome.RUN_FOREVER),
        ("app:sleep", True, Outcome.RUN_FOREVER),
        ("repo/pkg:1.0.0-unpullable", True, Outcome.UNPULLABLE),
        ("repo/pkg:1.0.0-oom", True, Outcome.OOM),
        ("repo/pkg:1.0.0-rc1", True, Outcome.SUCCEED),
    ],
)
def test_image_outcome(image: str, finite: bool, outcome: Outcome) -> None:
    assert image_outcome(image, finite) is outcome


def test_pod_outcome_precedence_and_finiteness() -> None:
    assert pod_outcome(pod("a:fail", "b:unpullable")) is Outcome.UNPULLABLE
    assert pod_outcome(pod("a:fail", "b:oom")) is Outcome.OOM
    assert pod_outcome(pod("a", restart="Never")) is Outcome.SUCCEED
    assert pod_outcome(pod("a", job=True)) is Outcome.SUCCEED
    assert pod_outcome(pod("a")) is Outcome.RUN_FOREVER
    assert pod_outcome(pod("a", "b", restart="OnFailure")) is Outcome.SUCCEED


def test_runtime_annotation() -> None:
    assert runtime_seconds(pod("a"), 5.0) == 5.0
    assert runtime_seconds(pod("a", annotations={RUNTIME_ANNOTATION: "0.25"}), 5.0) == 0.25
    assert runtime_seconds(pod("a", annotations={RUNTIME_ANNOTATION: "soon"}), 5.0) == 5.0


def test_running_status_is_ready() -> None:
    status = running_status(pod("a"), "10.0.0.1", "10.128.0.1", NOW, NOW)
    assert status["phase"] == "Running" and status["podIP"] == "10.128.0.1"
    assert status["startTime"] == NOW
    types = {c["type"]: c["status"] for c in status["conditions"]}
    assert types["Ready"] == types["ContainersReady"] == types["Initialized"] == "True"
    assert types["PodScheduled"] == "True"
    assert status["containerStatuses"][0]["ready"] is True
    assert is_pod_ready({"status": status})


def test_waiting_status_for_unpullable() -> None:
    status = waiting_status(pod("a:unpullable"), "h", "p", NOW, NOW, "ImagePullBackOff", "m")
    assert status["phase"] == "Pending"
    state = status["containerStatuses"][0]["state"]
    assert state == {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}
    assert not is_pod_ready({"status": status})


@pytest.mark.parametrize(
    ("image", "phase", "code", "reason"),
    [
        ("a", "Succeeded", 0, "Completed"),
        ("a:fail", "Failed", 1, "Error"),
        ("a:oom", "Failed", 137, "OOMKilled"),
    ],
)
def test_terminated_status(image: str, phase: str, code: int, reason: str) -> None:
    p = pod(image, restart="Never")
    status = terminated_status(p, "h", "p", NOW, NOW, pod_outcome(p))
    assert status["phase"] == phase
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (code, reason)


def test_killed_pod_fails_with_sigterm() -> None:
    p = pod("a")
    status = terminated_status(p, "h", "p", NOW, NOW, pod_outcome(p), killed=True)
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_crashloop_keeps_running_phase_but_not_ready() -> None:
    status = crashloop_status(pod("a:fail"), "h", "p", NOW, NOW, Outcome.FAIL, 1)
    assert status["phase"] == "Running"
    container = status["containerStatuses"][0]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["lastState"]["terminated"]["exitCode"] == 1
    assert container["restartCount"] == 1
    assert not is_pod_ready({"status": status})


def test_node_lost_keeps_other_conditions() -> None:
    running = pod("a")
    running["status"] = running_status(running, "h", "p", NOW, NOW)
    running["status"]["conditions"].append({"type": "SlurmNodeStateIdle", "status": "True"})
    lost = node_lost_status(running, "2025-01-01T00:01:00Z")
    types = {c["type"]: c["status"] for c in lost["conditions"]}
    assert types["Ready"] == "False" and types["SlurmNodeStateIdle"] == "True"
    assert lost["phase"] == "Running"


def test_slurm_registration_from_requests_then_node() -> None:
    p = pod("slurmd", labels={"nodeflow.dev/nodeset": "gpu"})
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "7500m", "memory": "2Gi"}}
    p["status"] = {"podIP": "10.128.0.9"}
    node = {"status": {"capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}}}
    reg = registration_for(p, node, "sim")
    assert (reg.cluster, reg.name, reg.cpus, reg.real_memory_mib, reg.gres) == (
        "sim",
        "p",
        8,
        2048,
        "gpu:8",
    )
    assert reg.address == "10.128.0.9" and reg.features == ("gpu",)
    p["metadata"]["labels"]["nodeflow.dev/slurm-cluster"] = "other"
    assert registration_for(p, None, "sim").cluster == "other"


def test_slurmd_runs_only_in_ready_live_pods() -> None:
    p = pod("slurmd")
    assert not slurmd_should_run(None)
    assert not slurmd_should_run(p)
    p["status"] = running_status(p, "h", "i", NOW, NOW)
    assert slurmd_should_run(p)
    p["status"]["phase"] = "Failed"
    assert not slurmd_should_run(p)


def test_crd_documents_skip_other_kinds(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: xs.example.com}\n---\nkind: Kustomization\n"
    )
    assert [d["metadata"]["name"] for d in crd_documents(tmp_path)] == ["xs.example.com"]
