"""NodeSet gauges equal the status stored in KV after every step of a scale-out and scale-in,
and a deleted NodeSet's series disappear (real NATS, the exporter's own KV view)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from metrics_exporter.exporter import NODESETS_BUCKET, Exporter
from nodeflow_bus import Bus
from nodeflow_contracts import subjects
from tests.integration.metrics_exporter.conftest import eventually

# The NodeSet metrics (docs/metrics-exporter.md) and the status field each one reports.
REFERENCE_METRICS: dict[str, str] = {
    "kube_sunk_nodeset_current": "currentNumberScheduled",
    "kube_sunk_nodeset_misscheduled": "numberMisscheduled",
    "kube_sunk_nodeset_desired": "desiredNumberScheduled",
    "kube_sunk_nodeset_up_to_date": "updatedNumberScheduled",
    "kube_sunk_nodeset_feasible": "numberFeasible",
    "kube_sunk_nodeset_ready": "numberReady",
    "kube_sunk_nodeset_unavailable": "numberUnavailable",
    "kube_sunk_nodeset_running": "numberRunning",
    "kube_sunk_nodeset_drained": "numberDrain",
}

# Recorded from a scale-out 0 -> 3 then a scale-in 3 -> 1 of one NodeSet, as the controller
# writes status: pods scheduled, becoming ready, running jobs; then ranks 2 and 1 drained
# and deleted (numberDrain rises before the pods go).
SCALE_OUT_AND_IN: list[tuple[int, dict[str, int]]] = [
    (0, {"numberFeasible": 4}),
    (3, {"desiredNumberScheduled": 3, "numberFeasible": 4}),
    (
        3,
        {
            "desiredNumberScheduled": 3,
            "numberFeasible": 4,
            "currentNumberScheduled": 3,
            "updatedNumberScheduled": 3,
            "numberUnavailable": 3,
        },
    ),
    (
        3,
        {
            "desiredNumberScheduled": 3,
            "numberFeasible": 4,
            "currentNumberScheduled": 3,
            "updatedNumberScheduled": 3,
            "numberReady": 2,
            "numberUnavailable": 1,
        },
    ),
    (
        3,
        {
            "desiredNumberScheduled": 3,
            "numberFeasible": 4,
            "currentNumberScheduled": 3,
            "updatedNumberScheduled": 3,
            "numberReady": 3,
            "numberRunning": 2,
        },
    ),
    (
        1,
        {
            "desiredNumberScheduled": 1,
            "numberFeasible": 4,
            "currentNumberScheduled": 3,
            "updatedNumberScheduled": 3,
            "numberReady": 3,
            "numberRunning": 1,
            "numberDrain": 1,
        },
    ),
    (
        1,
        {
            "desiredNumberScheduled": 1,
            "numberFeasible": 4,
            "currentNumberScheduled": 2,
            "updatedNumberScheduled": 2,
            "numberReady": 2,
            "numberRunning": 1,
            "numberDrain": 1,
            "numberMisscheduled": 1,
        },
    ),
    (
        1,
        {
            "desiredNumberScheduled": 1,
            "numberFeasible": 4,
            "currentNumberScheduled": 1,
            "updatedNumberScheduled": 1,
            "numberReady": 1,
            "numberRunning": 1,
        },
    ),
]


def nodeset(namespace: str, name: str, replicas: int, status: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {"replicas": replicas, "slurmCluster": "prod", "template": {}},
        "status": status,
    }


async def put(exporter: Exporter, kv: KeyValue, obj: dict[str, Any]) -> None:
    """Write one NodeSet as k8s-watcher does; return once the exporter's view has it."""
    key = subjects.object_key(obj["metadata"]["namespace"], obj["metadata"]["name"])
    revision = await kv.put(key, json.dumps(obj).encode())
    await eventually(lambda: exporter.nodesets.revision(key) == revision, what=f"{key}@{revision}")


async def delete(exporter: Exporter, kv: KeyValue, namespace: str, name: str) -> None:
    key = subjects.object_key(namespace, name)
    await kv.delete(key)
    await eventually(lambda: key not in exporter.nodesets, what=f"{key} deleted")


def assert_metrics_equal_status(
    registry: CollectorRegistry, namespace: str, name: str, status: dict[str, int]
) -> None:
    labels = {"namespace": namespace, "nodeset": name}
    for metric, field in REFERENCE_METRICS.items():
        assert registry.get_sample_value(metric, labels) == status.get(field, 0), (metric, status)


def series_of(registry: CollectorRegistry, namespace: str, name: str) -> list[str]:
    return [
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("nodeset") == name
    ]


async def test_gauges_equal_status_after_every_step_of_scale_out_and_in(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    kv = await bus.js.key_value(NODESETS_BUCKET)
    bystander = nodeset("team-b", "cpus", 2, {"numberReady": 2, "currentNumberScheduled": 2})
    await put(exporter, kv, bystander)
    for replicas, status in SCALE_OUT_AND_IN:
        await put(exporter, kv, nodeset("team-a", "gpus", replicas, status))
        assert_metrics_equal_status(registry, "team-a", "gpus", status)
        assert_metrics_equal_status(registry, "team-b", "cpus", bystander["status"])

    await delete(exporter, kv, "team-a", "gpus")
    assert series_of(registry, "team-a", "gpus") == []
    # The reference series plus nodeflow_nodeset_draining.
    assert len(series_of(registry, "team-b", "cpus")) == len(REFERENCE_METRICS) + 1


status_steps = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            field: st.integers(min_value=0, max_value=64) for field in REFERENCE_METRICS.values()
        },
    ),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=status_steps, name=st.sampled_from(["a", "b-1", "gpu-pool"]))
async def test_generated_status_sequences_are_mirrored_then_vanish(
    bus: Bus,
    exporter: Exporter,
    registry: CollectorRegistry,
    steps: list[dict[str, int]],
    name: str,
) -> None:
    kv = await bus.js.key_value(NODESETS_BUCKET)
    for status in steps:
        await put(exporter, kv, nodeset("gen", name, 1, status))
        assert_metrics_equal_status(registry, "gen", name, status)
    await delete(exporter, kv, "gen", name)
    assert series_of(registry, "gen", name) == []


async def test_a_view_restarted_on_an_existing_bucket_reports_the_stored_status(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    kv = await bus.js.key_value(NODESETS_BUCKET)
    status = {"numberReady": 4, "currentNumberScheduled": 5, "numberUnavailable": 1}
    await put(exporter, kv, nodeset("team-c", "h100", 5, status))
    second_registry = CollectorRegistry()
    second = Exporter(bus, second_registry)
    await second.start()
    try:
        await second.wait_ready(5.0)
        assert_metrics_equal_status(second_registry, "team-c", "h100", status)
    finally:
        await second.stop(2.0)
    # Stopping unregistered everything: a new exporter can use the same registry.
    assert list(second_registry.collect()) == []
    third = Exporter(bus, second_registry)
    await third.start()
    try:
        await third.wait_ready(5.0)
        assert_metrics_equal_status(second_registry, "team-c", "h100", status)
    finally:
        await third.stop(2.0)


@pytest.mark.parametrize("status", [{}, {"numberReady": 0}])
async def test_a_nodeset_without_counts_reports_zeros(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry, status: dict[str, int]
) -> None:
    kv = await bus.js.key_value(NODESETS_BUCKET)
    await put(exporter, kv, nodeset("team-d", "fresh", 0, status))
    assert_metrics_equal_status(registry, "team-d", "fresh", {})
