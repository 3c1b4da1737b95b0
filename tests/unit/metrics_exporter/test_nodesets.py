"""The NodeSet gauges equal the stored status, field by field; a missing NodeSet has none."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from metrics_exporter.nodesets import NODESET_METRICS, NodeSetCollector, nodeset_rows

FIELDS = [field for _, field, _ in NODESET_METRICS]


class FakeView:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        return list(self.objects.items())


def nodeset(namespace: str, name: str, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"namespace": namespace, "name": name, "uid": "u-1"},
        "spec": {"replicas": 3},
    }
    if status is not None:
        obj["status"] = status
    return obj


def registry_with(view: FakeView) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(NodeSetCollector(view))
    return registry


def test_metric_names_and_fields_follow_the_reference() -> None:
    assert dict((name, field) for name, field, _ in NODESET_METRICS) == {
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


statuses = st.fixed_dictionaries(
    {}, optional={field: st.integers(min_value=0, max_value=10_000) for field in FIELDS}
)


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), statuses, max_size=4))
def test_every_gauge_equals_its_status_field(status_by_name: dict[str, dict[str, int]]) -> None:
    view = FakeView()
    view.objects = {
        f"team.{name}": nodeset("team", name, status) for name, status in status_by_name.items()
    }
    registry = registry_with(view)
    for name, status in status_by_name.items():
        labels = {"namespace": "team", "nodeset": name}
        for metric, field, _ in NODESET_METRICS:
            # Kubernetes omits zero counts from a status: an absent field is 0.
            assert registry.get_sample_value(metric, labels) == status.get(field, 0)
    for metric, _, _ in NODESET_METRICS:
        families = [f for f in registry.collect() if f.name == metric]
        assert len(families[0].samples) == len(status_by_name)


def test_a_deleted_nodeset_has_no_series_and_others_keep_theirs() -> None:
    view = FakeView()
    view.objects["a.one"] = nodeset("a", "one", {"numberReady": 2})
    view.objects["a.two"] = nodeset("a", "two", {"numberReady": 5})
    registry = registry_with(view)
    assert (
        registry.get_sample_value("kube_sunk_nodeset_ready", {"namespace": "a", "nodeset": "one"})
        == 2
    )
    del view.objects["a.one"]
    text = generate_latest(registry).decode()
    assert 'nodeset="one"' not in text
    assert (
        registry.get_sample_value("kube_sunk_nodeset_ready", {"namespace": "a", "nodeset": "two"})
        == 5
    )


def test_nodeset_without_status_reports_zero_and_names_fall_back_to_the_key() -> None:
    rows = list(nodeset_rows([("ns.fresh", {"kind": "NodeSet"})]))
    assert rows[0].namespace == "ns"
    assert rows[0].name == "fresh"
    assert rows[0].values == dict.fromkeys(FIELDS, 0.0)


def test_a_non_numeric_status_field_is_left_out_rather_than_invented() -> None:
    rows = list(
        nodeset_rows(
            [("ns.x", nodeset("ns", "x", {"numberReady": "three", "numberRunning": True}))]
        )
    )
    assert "numberReady" not in rows[0].values
    assert "numberRunning" not in rows[0].values
    assert rows[0].values["numberFeasible"] == 0.0
