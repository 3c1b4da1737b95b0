"""The NodeSet CRD offers only what the controller honours (issue 28 item 5: a field users
set that does nothing is the worst option), and refuses templates whose slurmd would not
register under the pod's name (item 4), as the controller does (`spec.validate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nodeset_controller.spec import parse, validate
from slurm_syncer.prune import prune_mode
from tests.unit.nodeset_controller.builders import DEFAULTS, TEMPLATE_SPEC, nodeset

ROOT = Path(__file__).resolve().parents[3]
CRDS = (
    ROOT / "k8s" / "crds" / "nodesets.nodeflow.dev.yaml",
    ROOT / "charts" / "nodeflow" / "crds" / "nodesets.nodeflow.dev.yaml",
)

# For each spec field: two values that must give two different parsed specs.
HONOURED: dict[str, tuple[Any, Any]] = {
    "replicas": (3, 4),
    "podNamePrefix": ("a", "b"),
    "slurmCluster": ("x", "y"),
    "template": (
        {"spec": TEMPLATE_SPEC},
        {"spec": {"containers": [{"name": "slurmd", "image": "slurmd:25.05"}]}},
    ),
    "updateStrategy": ({"type": "RollingUpdate"}, {"type": "OnDelete"}),
    "scaleDownPriorityOrdering": (True, False),
    "forceScalingDeleteKnownConditionTimeout": (0, 10),
    "forceScalingDeleteUnknownConditionTimeout": (0, 10),
    "workloadDisruptionProtection": (True, False),
    "minReadySeconds": (0, 30),
    "revisionHistoryLimit": (0, 10),
}


def _spec_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


# Spec fields slurm-syncer acts on (the controller only validates them): two values that its
# reading tells apart.
HONOURED_BY_SLURM_SYNCER: dict[str, tuple[Any, Any]] = {
    "pruneSlurmNodeRecords": ("Never", "NodeNotFound"),
}


def test_rule_every_crd_spec_field_is_honoured_by_the_controller() -> None:
    for path in CRDS:
        fields = set(_spec_schema(path)["properties"])
        honoured = set(HONOURED) | set(HONOURED_BY_SLURM_SYNCER)
        assert fields == honoured, (path, fields ^ honoured)
    for field, (one, other) in HONOURED_BY_SLURM_SYNCER.items():
        first, second = nodeset(extra={field: one}), nodeset(extra={field: other})
        assert validate(first) == [] and validate(second) == [], field
        assert prune_mode(first) != prune_mode(second), field
        assert validate(nodeset(extra={field: "Sometimes"})) != [], field
    for field, (one, other) in HONOURED.items():
        first, second = nodeset(extra={field: one}), nodeset(extra={field: other})
        assert validate(first) == [] and validate(second) == [], field
        assert parse(first, DEFAULTS) != parse(second, DEFAULTS), field


def test_rule_crd_refuses_templates_whose_slurm_node_is_not_the_pod() -> None:
    for path in CRDS:
        pod_spec = _spec_schema(path)["properties"]["template"]["properties"]["spec"]
        fields = pod_spec["properties"]
        assert fields["hostNetwork"]["enum"] == [False]
        assert fields["hostname"]["maxLength"] == 0


def test_rule_crd_offers_scheduled_update_with_slinkys_fields_and_requires_its_start() -> None:
    """updateStrategy ScheduledUpdate (Slinky's `scheduledUpdate {startTime, duration, flags}`)
    is offered and parsed (two startTimes are two windows); the CRD's rule refuses the type
    without a startTime, as the API server evaluates it."""
    from clustersim.kube.crd_rules import compile_errors, rule_causes

    for path in CRDS:
        strategy = _spec_schema(path)["properties"]["updateStrategy"]
        assert "ScheduledUpdate" in strategy["properties"]["type"]["enum"]
        window = strategy["properties"]["scheduledUpdate"]["properties"]
        assert set(window) == {"startTime", "duration", "flags"}
        assert window["duration"]["default"] == "30m"
        assert compile_errors(strategy, "updateStrategy") == []
        without_start = {"type": "ScheduledUpdate", "scheduledUpdate": {"duration": "30m"}}
        assert rule_causes(without_start, None, strategy) != []
        with_start = {"type": "ScheduledUpdate", "scheduledUpdate": {"startTime": "x"}}
        assert rule_causes(with_start, None, strategy) == []
        assert rule_causes({"type": "OnDelete"}, None, strategy) == []
    first, second = (
        nodeset(
            extra={
                "updateStrategy": {
                    "type": "ScheduledUpdate",
                    "scheduledUpdate": {"startTime": start},
                }
            }
        )
        for start in ("2026-12-01T02:00:00Z", "2026-12-08T02:00:00Z")
    )
    assert validate(first) == [] and validate(second) == []
    assert parse(first, DEFAULTS) != parse(second, DEFAULTS)
