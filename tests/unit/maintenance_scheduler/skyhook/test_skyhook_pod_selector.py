"""The interrupt's NodeMaintenance waits for the pods of the Skyhook's podNonInterruptLabels:
its waitForPodCompletion.podSelector is the string nodeflow_kube.labels writes for that
metav1.LabelSelector, and the maintenance scheduler, reading it back with the same module,
selects exactly the pods the Skyhook's selector selects."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import parse_skyhook
from maintenance_scheduler.skyhook.jobs import build_maintenance
from nodeflow_kube.labels import parse_label_selector

KEYS = st.sampled_from(["app", "tier", "example.com/team", "gpu"])
VALUES = st.sampled_from(["a", "b", "training", "x-1", "v1.2"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


@st.composite
def expressions(draw: st.DrawFn) -> dict[str, Any]:
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    expression: dict[str, Any] = {"key": draw(KEYS), "operator": operator}
    if operator in ("In", "NotIn"):
        expression["values"] = draw(st.lists(VALUES, min_size=1, max_size=3))
    return expression


SELECTORS = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(KEYS, VALUES, max_size=2),
        "matchExpressions": st.lists(expressions(), max_size=3),
    },
).filter(lambda selector: any(selector.values()))  # an empty one: no wait at all


def skyhook_waiting_for(selector: dict[str, Any]) -> Any:
    return parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "uid-1", "resourceVersion": "5"},
            "spec": {
                "podNonInterruptLabels": selector,
                "packages": {
                    "kernel": {
                        "version": "2.0.0",
                        "image": "registry.local/kernel",
                        "interrupt": {"type": "reboot"},
                    }
                },
            },
        }
    )


def pod_selector(selector: dict[str, Any]) -> str:
    maintenance = build_maintenance(
        skyhook_waiting_for(selector), "node-1", namespace="ops", drain_timeout_seconds=60
    )
    return str(maintenance["spec"]["waitForPodCompletion"]["podSelector"])


def test_pod_selector_is_the_kubernetes_string_form() -> None:
    selector = {
        "matchLabels": {"tier": "b", "app": "training"},
        "matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["b", "a"]},
            {"key": "example.com/team", "operator": "NotIn", "values": ["x-1"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "tier", "operator": "DoesNotExist"},
        ],
    }
    assert pod_selector(selector) == (
        "app=training,tier=b,gpu in (a,b),example.com/team notin (x-1),gpu,!tier"
    )


@settings(max_examples=300, deadline=None)
@given(selector=SELECTORS, labels=LABELS)
def test_pod_selector_selects_the_pods_the_skyhook_selector_selects(
    selector: dict[str, Any], labels: dict[str, str]
) -> None:
    skyhook = skyhook_waiting_for(selector)
    assert skyhook.pod_non_interrupt_labels is not None
    read_back = parse_label_selector(pod_selector(selector))
    assert read_back.matches(labels) == skyhook.pod_non_interrupt_labels.matches(labels)
