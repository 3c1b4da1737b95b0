"""Whole stack: the `kube_sunk_nodeset_*` metrics equal the NodeSet status after every step of
a real scale-out and scale-in (simulator, k8s-watcher, slurm-syncer, nodeset-controller and
metrics-exporter on real NATS)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from metrics_exporter.exporter import Exporter
from tests.integration.nodeset_controller.conftest import Stack, eventually

# docs/metrics-exporter.md: each status field and the metric that reports it.
STATUS_METRICS: dict[str, str] = {
    "currentNumberScheduled": "kube_sunk_nodeset_current",
    "numberMisscheduled": "kube_sunk_nodeset_misscheduled",
    "desiredNumberScheduled": "kube_sunk_nodeset_desired",
    "updatedNumberScheduled": "kube_sunk_nodeset_up_to_date",
    "numberFeasible": "kube_sunk_nodeset_feasible",
    "numberReady": "kube_sunk_nodeset_ready",
    "numberUnavailable": "kube_sunk_nodeset_unavailable",
    "numberRunning": "kube_sunk_nodeset_running",
    "numberDrain": "kube_sunk_nodeset_drained",
}


def metric_values(registry: CollectorRegistry, name: str) -> dict[str, float | None]:
    labels = {"namespace": "default", "nodeset": name}
    return {
        field: registry.get_sample_value(metric, labels) for field, metric in STATUS_METRICS.items()
    }


def status_values(status: dict[str, Any]) -> dict[str, float | None]:
    # Kubernetes leaves zero counts out of a status; the metric reports them as 0.
    return {field: float(status.get(field, 0)) for field in STATUS_METRICS}


async def assert_metrics_follow(stack: Stack, registry: CollectorRegistry, name: str) -> None:
    """The metrics reach the status the API server holds now (they follow it through KV)."""
    await eventually(
        lambda: metric_values(registry, name) == status_values(stack.status(name)),
        what=f"metrics of {name} equal its status {stack.status(name)}",
    )


async def test_metrics_equal_nodeset_status_through_scale_out_and_scale_in(stack: Stack) -> None:
    registry = CollectorRegistry()
    exporter = Exporter(stack.bus, registry)
    await exporter.start()
    await exporter.wait_ready(timeout=10)
    try:
        await stack.start_controller()
        stack.create_nodeset("gpu", 0)
        await eventually(lambda: stack.status("gpu").get("numberFeasible") == 4)
        await assert_metrics_follow(stack, registry, "gpu")

        for replicas in (3, 4, 1, 0):
            stack.patch_nodeset("gpu", {"replicas": replicas})

            def scaled(r: int = replicas) -> bool:
                return (
                    len(stack.ready_pods("gpu")) == r == len(stack.pods("gpu"))
                    and stack.status("gpu").get("numberReady", 0) == r
                    and stack.status("gpu").get("currentNumberScheduled", 0) == r
                )

            await eventually(
                scaled,
                timeout=30,
                what=f"scaled to {replicas}",
            )
            await assert_metrics_follow(stack, registry, "gpu")
            assert metric_values(registry, "gpu")["numberReady"] == replicas

        stack.sim.store.delete("nodesets.nodeflow.dev", "gpu", namespace="default")
        await eventually(
            lambda: (
                registry.get_sample_value(
                    "kube_sunk_nodeset_desired", {"namespace": "default", "nodeset": "gpu"}
                )
                is None
            ),
            what="series of a deleted NodeSet disappear",
        )
    finally:
        await stack.stop_controller()
        await exporter.stop()
