"""NodeMaintenance on the real control plane: maintenance-scheduler drains through the real
eviction API, the real disruption controller's PodDisruptionBudget status decides what may go,
the real Deployment controller and kube-scheduler place the replacements, and the real garbage
collector deletes a request with its Node. The chaos suite's recorder holds the
maintenance budgets (maxParallelOperations, maxUnavailable) throughout."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats.aio.msg
import pytest

from nodeflow_bus import Bus
from nodeflow_bus.credentials import Credentials
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome
from tests.e2e.chaos_support import (
    NODE_MAINTENANCES,
    NODES,
    OPERATOR_CONFIGS,
    OPERATOR_NAMESPACE,
    Recorder,
    Stack,
    condition,
    is_true,
    recording,
    terminating,
)
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]

WEB_LABEL = "nodeflow.dev/test-web"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
BUDGETS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
REQUESTOR = "realkube.nodeflow.dev"


def web_deployment(replicas: int) -> dict[str, Any]:
    """`replicas` pods, one per node labelled WEB_LABEL (required anti-affinity), so a pod
    evicted from a cordoned node has nowhere to go until another node is labelled."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {WEB_LABEL: "yes"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"app": "web"}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        }
                    },
                    "containers": [
                        {
                            "name": "web",
                            "image": "web:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ],
                },
            },
        },
    }


def node_maintenance(name: str, node: str, drain: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"requestorID": REQUESTOR, "nodeName": node, "cordon": True}
    if drain:
        spec["drainSpec"] = {"force": False, "timeoutSeconds": 0, "deleteEmptyDir": True}
    return {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def phase(recorder: Recorder, name: str) -> str:
    obj = recorder.maintenances.get(name)
    return str((condition(obj, "Ready") or {}).get("reason") or "") if obj else "gone"


def web_pods(recorder: Recorder) -> list[dict[str, Any]]:
    return [
        p
        for p in recorder.pods.values()
        if (p["metadata"].get("labels") or {}).get("app") == "web" and not terminating(p)
    ]


async def label_node(stack: Stack, node: str, value: str | None) -> None:
    await stack.kube.merge_patch(f"{NODES}/{node}", {"metadata": {"labels": {WEB_LABEL: value}}})


async def ensure_operator_namespace(stack: Stack) -> None:
    with contextlib.suppress(RuntimeError):  # already there (409)
        await stack.kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        )


async def set_operator_config(stack: Stack, recorder: Recorder, **spec: Any) -> None:
    await ensure_operator_namespace(stack)
    await stack.kube.create(
        OPERATOR_CONFIGS,
        {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "MaintenanceOperatorConfig",
            "metadata": {"name": "default", "namespace": OPERATOR_NAMESPACE},
            "spec": spec,
        },
    )

    async def seen() -> bool:
        return recorder.operator_config is not None

    await until(seen, "the MaintenanceOperatorConfig watched")


@contextlib.asynccontextmanager
async def eviction_outcomes(stack: Stack) -> AsyncIterator[list[CommandOutcome]]:
    """Every eviction outcome k8s-watcher publishes while the block runs (as the operator)."""
    outcomes: list[CommandOutcome] = []
    bus = await Bus.connect(
        stack.env["NATS_URL"], credentials=Credentials.from_env(stack.env), options=TEST_BUS_OPTIONS
    )

    async def on_outcome(msg: nats.aio.msg.Msg) -> None:
        outcomes.append(codec.decode(CommandOutcome, msg.data, subject=msg.subject))

    subscription = await bus.nc.subscribe("outcome.k8s.v1.evict", cb=on_outcome)
    try:
        yield outcomes
    finally:
        await subscription.unsubscribe()
        await bus.close()


async def clean_up(stack: Stack, recorder: Recorder, labelled: list[str]) -> None:
    for name in list(recorder.maintenances):
        with contextlib.suppress(RuntimeError):
            await stack.kube.delete(f"{NODE_MAINTENANCES}/{name}")
    for path in (f"{DEPLOYMENTS}/web", f"{BUDGETS}/web", f"{OPERATOR_CONFIGS}/default"):
        with contextlib.suppress(RuntimeError):
            await stack.kube.delete(path)

    async def settled() -> bool:
        return not recorder.maintenances and not web_pods(recorder)

    await until(settled, "every NodeMaintenance and web pod gone", STEP_TIMEOUT * 2)
    for node in labelled:
        with contextlib.suppress(RuntimeError):
            await label_node(stack, node, None)


async def test_node_maintenance_drain_waits_for_the_real_disruption_budget_then_completes(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        labelled: list[str] = []
        try:
            await set_operator_config(stack, recorder, maxParallelOperations=2, maxUnavailable=3)
            nodes = sorted(recorder.nodes)
            labelled = nodes[:3]
            for node in labelled:
                await label_node(stack, node, "yes")
            await stack.kube.create(DEPLOYMENTS, web_deployment(3))
            await stack.kube.create(
                BUDGETS,
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
                },
            )

            async def web_ready() -> bool:
                pods = web_pods(recorder)
                return len(pods) == 3 and all(is_true(p, "Ready") for p in pods)

            await until(web_ready, "three web pods Ready", STEP_TIMEOUT * 2)

            async def allowed(count: int) -> bool:
                budget = await stack.kube.call("GET", f"{BUDGETS}/web")
                return bool((budget.get("status") or {}).get("disruptionsAllowed") == count)

            await until(lambda: allowed(1), "the PodDisruptionBudget allowing one disruption")
            on_node = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in web_pods(recorder)}
            first, second = sorted(on_node)[:2]
            async with eviction_outcomes(stack) as outcomes:
                await stack.kube.create(NODE_MAINTENANCES, node_maintenance("drain-a", first))
                await stack.kube.create(NODE_MAINTENANCES, node_maintenance("drain-b", second))

                # One drain evicts its pod; the replacement has no node to go to (both other
                # labelled nodes hold a web pod), so the budget allows nothing more and the
                # real API server refuses the other eviction with 429 (k8s-watcher: retrying).
                async def one_ready_one_refused() -> str | None:
                    ready = [n for n in ("drain-a", "drain-b") if phase(recorder, n) == "Ready"]
                    refused = {o.target.name for o in outcomes if o.outcome == "retrying"}
                    if len(ready) == 1 and refused:
                        return ready[0]
                    return None

                done = await until(
                    one_ready_one_refused, "one drain Ready, the other refused by the budget"
                )
                held = "drain-b" if done == "drain-a" else "drain-a"
                held_pod = on_node[second if held == "drain-b" else first]
                assert phase(recorder, held) == "Draining"
                assert any(
                    o.outcome == "retrying" and o.target.name == held_pod for o in outcomes
                ), [(o.target.name, o.outcome) for o in outcomes]
                assert not terminating(recorder.pods[held_pod])
                assert await allowed(0)

                # A fourth node for the replacement: it runs, the budget allows one again, the
                # held eviction goes through and the second drain completes.
                spare = nodes[3]
                labelled.append(spare)
                await label_node(stack, spare, "yes")

                async def both_ready() -> bool:
                    return all(phase(recorder, n) == "Ready" for n in ("drain-a", "drain-b"))

                await until(both_ready, "both drains Ready", STEP_TIMEOUT * 2)
            assert held_pod not in {p["metadata"]["name"] for p in web_pods(recorder)}
            for request in ("drain-a", "drain-b"):
                obj = recorder.maintenances[request]
                assert obj["metadata"]["finalizers"] == ["maintenance.nvidia.com/finalizer"]
                target = recorder.nodes[obj["spec"]["nodeName"]]
                assert target["spec"].get("unschedulable") is True
                assert obj["metadata"]["ownerReferences"] == [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": target["metadata"]["name"],
                        "uid": target["metadata"]["uid"],
                    }
                ]
            assert recorder.most_in_maintenance <= 2
            recorder.assert_quiescent()
            # Deleting the requests uncordons the nodes maintenance-scheduler cordoned.
            for request in ("drain-a", "drain-b"):
                await stack.kube.delete(f"{NODE_MAINTENANCES}/{request}")

            async def released() -> bool:
                return not recorder.maintenances and not any(
                    (recorder.nodes[n].get("spec") or {}).get("unschedulable")
                    for n in (first, second)
                )

            await until(released, "both requests gone and their nodes uncordoned")
            recorder.assert_quiescent()
        finally:
            await clean_up(stack, recorder, labelled)


async def test_a_deleted_node_takes_its_node_maintenance_with_it_through_the_real_garbage_collector(
    tmp_path: Path,
) -> None:
    # A node absent from the view counts as gone after NODE_GONE_GRACE_SECONDS (default 300 s):
    # shortened here, the rule unchanged.
    async with (
        real_stack(tmp_path, env={"NODE_GONE_GRACE_SECONDS": "5"}) as stack,
        recording(stack) as recorder,
    ):
        try:
            await set_operator_config(stack, recorder, maxParallelOperations=1)
            other = sorted(recorder.nodes)[0]
            # A node of its own, as KWOK's: a copy of an existing KWOK node's identity.
            model = await stack.kube.call("GET", f"{NODES}/{other}")
            doomed = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "doomed",
                    "labels": {
                        **model["metadata"].get("labels", {}),
                        "kubernetes.io/hostname": "doomed",
                    },
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                },
                "spec": {"taints": model["spec"].get("taints", [])},
            }
            await stack.kube.create(NODES, doomed)

            async def doomed_ready() -> bool:
                node = recorder.nodes.get("doomed")
                return node is not None and is_true(node, "Ready")

            await until(doomed_ready, "the node doomed Ready (KWOK)")
            await stack.kube.create(NODE_MAINTENANCES, node_maintenance("on-doomed", "doomed"))

            def phase_is(name: str, wanted: str) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return phase(recorder, name) == wanted

                return check

            await until(phase_is("on-doomed", "Ready"), "on-doomed Ready")
            await stack.kube.create(NODE_MAINTENANCES, node_maintenance("next", other, drain=False))
            await until(
                phase_is("next", "Pending"),
                "next Pending behind on-doomed (one parallel operation)",
            )
            await stack.kube.delete(f"{NODES}/doomed")
            # The real garbage collector deletes the request its Node owned; maintenance-scheduler
            # drops the finalizer (nothing to uncordon) and the slot goes to the next request.
            await until(phase_is("on-doomed", "gone"), "on-doomed collected")
            await until(phase_is("next", "Ready"), "next Ready in the freed slot")
            recorder.assert_quiescent()
        finally:
            with contextlib.suppress(RuntimeError):
                await stack.kube.delete(f"{NODES}/doomed")
            await clean_up(stack, recorder, [])
