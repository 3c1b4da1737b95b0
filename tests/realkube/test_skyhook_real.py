"""Skyhook on the real control plane: stage Jobs run by the real Job controller on KWOK nodes.
KWOK runs no container, so a package's environment variable KWOK_FATE picks what its pods do
(tools/kube/stages/fates.yaml): nothing (they run and complete), `fail` (the container exits
1) or `image-pull-backoff` (the pod stays Pending with its container waiting in
ImagePullBackOff, as a kubelet leaves it). The ImagePullBackOff question answered here: the
real Job controller's podFailurePolicy never sees such a pod (it has not failed), so only
maintenance-scheduler's image-pull grace ends the stage."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos_support import NODES, Stack
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]

API = "/apis/skyhook.nvidia.com/v1alpha1"
SKYHOOKS = f"{API}/skyhooks"
POLICIES = f"{API}/deploymentpolicies"
# Where maintenance-scheduler puts the stage Jobs by default (SKYHOOK_NAMESPACE).
SKYHOOK_NAMESPACE = "skyhook"
JOBS = f"/apis/batch/v1/namespaces/{SKYHOOK_NAMESPACE}/jobs"
POD_LIST = f"/api/v1/namespaces/{SKYHOOK_NAMESPACE}/pods"
TARGET = "nodeflow.dev/test-skyhook"
# Short, so the unpullable stage ends within the test; the default is 120 s.
PULL_GRACE_SECONDS = "3"


def skyhook(name: str, fate: str | None, policy: str) -> dict[str, Any]:
    package: dict[str, Any] = {"version": "1.0.0", "image": f"registry.invalid/{name}"}
    if fate is not None:
        package["env"] = [{"name": "KWOK_FATE", "value": fate}]
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": {TARGET: name}},
            "deploymentPolicy": policy,
            "packages": {"driver": package},
        },
    }


def policy(name: str, failure_threshold: int) -> dict[str, Any]:
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {
            "default": {
                "budget": {"percent": 100},
                "strategy": {
                    "fixed": {
                        "initialBatch": 1,
                        "failureThreshold": failure_threshold,
                        "safetyLimit": 100,
                    }
                },
            }
        },
    }


async def label_nodes(stack: Stack, nodes: list[str], value: str | None) -> None:
    for node in nodes:
        await stack.kube.merge_patch(f"{NODES}/{node}", {"metadata": {"labels": {TARGET: value}}})


async def jobs_of(stack: Stack, name: str) -> list[dict[str, Any]]:
    return await stack.kube.items(f"{JOBS}?labelSelector=skyhook.nvidia.com/name={name}")


def job_condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind and entry.get("status") == "True":
            return dict(entry)
    return None


def status_is(stack: Stack, name: str, wanted: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        got = await stack.kube.call("GET", f"{SKYHOOKS}/{name}")
        return bool((got.get("status") or {}).get("status") == wanted)

    return check


async def node_state(stack: Stack, node: str, name: str) -> str:
    got = await stack.kube.call("GET", f"{NODES}/{node}")
    return str(got["metadata"].get("annotations", {}).get(f"skyhook.nvidia.com/nodeState_{name}"))


async def ensure_namespace(stack: Stack) -> None:
    """The stage Jobs' namespace as k8s/base/namespace.yaml makes it: Pod Security
    `privileged`, since package stages may change the host (in `restricted` the Job controller
    is refused every pod)."""
    labels = {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    with contextlib.suppress(RuntimeError):  # already there (409)
        await stack.kube.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": SKYHOOK_NAMESPACE, "labels": labels},
            },
        )


async def test_skyhook_stage_jobs_complete_fail_and_never_fail_on_image_pull_backoff_on_kwok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKYHOOK_IMAGE_PULL_GRACE_SECONDS", PULL_GRACE_SECONDS)
    async with real_stack(tmp_path) as stack:
        names = ("done", "failing", "unpulled")
        nodes = sorted(n["metadata"]["name"] for n in await stack.kube.items(NODES))[:6]
        targets = {name: nodes[2 * i : 2 * i + 2] for i, name in enumerate(names)}
        try:
            await ensure_namespace(stack)
            for name, chosen in targets.items():
                await label_nodes(stack, chosen, name)
            # failureThreshold 1 with safetyLimit 100: the first failed batch stops a rollout.
            await stack.kube.create(POLICIES, policy("one-at-a-time", 1))
            await stack.kube.create(SKYHOOKS, skyhook("done", None, "one-at-a-time"))
            await stack.kube.create(SKYHOOKS, skyhook("failing", "fail", "one-at-a-time"))
            await stack.kube.create(
                SKYHOOKS, skyhook("unpulled", "image-pull-backoff", "one-at-a-time")
            )

            # Nothing fated: every stage Job of both nodes completes on the real Job controller.
            await until(
                status_is(stack, "done", "complete"), "Skyhook done complete", STEP_TIMEOUT * 2
            )
            done_jobs = await jobs_of(stack, "done")
            assert done_jobs and all(job_condition(j, "Complete") for j in done_jobs)
            assert {j["metadata"]["labels"]["skyhook.nvidia.com/node"] for j in done_jobs} == set(
                targets["done"]
            )

            # A failing container: with backoffLimit 0 the Job controller fails the Job at once
            # (exit code 1 matches no podFailurePolicy rule), the node is erroring and the
            # rollout stops after that one batch: erroring beside a waiting node rolls up to
            # unknown, as upstream's CollectNodeStatus.
            await until(status_is(stack, "failing", "unknown"), "Skyhook failing unknown")
            (failed,) = await jobs_of(stack, "failing")
            reason = (job_condition(failed, "Failed") or {}).get("reason")
            assert reason == "BackoffLimitExceeded", failed.get("status")
            node = failed["metadata"]["labels"]["skyhook.nvidia.com/node"]
            assert "BackoffLimitExceeded" in await node_state(stack, node, "failing")

            # ImagePullBackOff: the pod never fails, so podFailurePolicy never fires; after the
            # pull grace maintenance-scheduler names the image on the node, ends the Job
            # (activeDeadlineSeconds) and the rollout stops.
            await until(status_is(stack, "unpulled", "unknown"), "Skyhook unpulled unknown")
            (unpulled,) = await jobs_of(stack, "unpulled")
            node = unpulled["metadata"]["labels"]["skyhook.nvidia.com/node"]
            assert "registry.invalid/unpulled:1.0.0 could not be pulled" in await node_state(
                stack, node, "unpulled"
            )

            async def ended_by_deadline() -> dict[str, Any] | None:
                (job,) = await jobs_of(stack, "unpulled")
                return job_condition(job, "Failed")

            ended = await until(ended_by_deadline, "the unpulled Job failed")
            assert ended["reason"] == "DeadlineExceeded", ended
            (job,) = await jobs_of(stack, "unpulled")
            # The pod the deadline removed counts as failed, never as succeeded.
            assert not job["status"].get("succeeded"), job["status"]
        finally:
            for name in names:
                with contextlib.suppress(RuntimeError):
                    await stack.kube.delete(f"{SKYHOOKS}/{name}")
            with contextlib.suppress(RuntimeError):
                await stack.kube.delete(f"{POLICIES}/one-at-a-time")

            async def skyhooks_gone() -> bool:
                return not await stack.kube.items(SKYHOOKS)

            await until(skyhooks_gone, "every Skyhook gone (finalizers done)", STEP_TIMEOUT * 2)
            await label_nodes(stack, nodes, None)
