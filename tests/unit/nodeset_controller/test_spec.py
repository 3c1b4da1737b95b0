"""Rule 9 (bad input) and the option resolution of the NodeSet spec."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_runtime.config import ConfigError, load_config
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.spec import (
    Defaults,
    parse,
    resolve_max_unavailable,
    validate,
)
from tests.unit.nodeset_controller.builders import TEMPLATE_SPEC, nodeset


def fields_and_reasons(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p.field, p.reason) for p in validate(obj)}


MU = "spec.updateStrategy.rollingUpdate.maxUnavailable"


def test_rule_bad_input_valid_spec_has_no_problem() -> None:
    assert validate(nodeset(max_unavailable="25%")) == []
    assert validate(nodeset(max_unavailable=2, replicas=None)) == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("150%", "MaxUnavailableOver100Percent"),
        ("abc", "MaxUnavailableNotIntOrPercent"),
        (-1, "NegativeMaxUnavailable"),
        ("-5%", "MaxUnavailableNotIntOrPercent"),
        (0, "ZeroMaxUnavailable"),
        (1.5, "MaxUnavailableNotIntOrPercent"),
    ],
)
def test_rule_bad_input_max_unavailable_is_named_with_field_and_reason(
    value: Any, reason: str
) -> None:
    assert fields_and_reasons(nodeset(max_unavailable=value)) == {(MU, reason)}


def test_rule_bad_input_negative_replicas() -> None:
    assert fields_and_reasons(nodeset(replicas=-1)) == {("spec.replicas", "NegativeReplicas")}


@pytest.mark.parametrize(
    ("template_spec", "field"),
    [
        ({"containers": []}, "spec.template.spec.containers"),
        (
            {"containers": [{"name": "Bad_Name", "image": "x"}]},
            "spec.template.spec.containers[0].name",
        ),
        ({"containers": [{"name": "a", "image": ""}]}, "spec.template.spec.containers[0].image"),
        (
            {
                "containers": [
                    {"name": "a", "image": "x", "resources": {"requests": {"cpu": "lots"}}}
                ]
            },
            "spec.template.spec.containers[0].resources.requests[cpu]",
        ),
        (
            {"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]},
            "spec.template.spec.containers[1].name",
        ),
        (
            {**TEMPLATE_SPEC, "tolerations": [{"key": "k", "operator": "Sometimes"}]},
            "spec.template.spec.tolerations[0]",
        ),
    ],
)
def test_rule_bad_input_template_the_api_server_would_reject(
    template_spec: dict[str, Any], field: str
) -> None:
    problems = validate(nodeset(template_spec=template_spec))
    assert [(p.field, p.reason) for p in problems] == [(field, "InvalidTemplate")]


def test_rule_bad_input_every_problem_is_reported_at_once() -> None:
    problems = validate(
        nodeset(replicas=-2, max_unavailable="abc", template_spec={"containers": []})
    )
    assert {p.field for p in problems} == {"spec.replicas", MU, "spec.template.spec.containers"}


def test_rule_bad_input_bad_label_in_template_metadata() -> None:
    obj = nodeset()
    obj["spec"]["template"]["metadata"]["labels"] = {"app": "not a label value"}
    assert [p.reason for p in validate(obj)] == ["InvalidTemplate"]


def test_max_unavailable_percent_rounds_up_like_kubernetes() -> None:
    assert resolve_max_unavailable("25%", 10) == 3
    assert resolve_max_unavailable("10%", 3) == 1
    assert resolve_max_unavailable("100%", 7) == 7
    assert resolve_max_unavailable(2, 100) == 2


@given(st.integers(min_value=1, max_value=100), st.integers(min_value=0, max_value=5000))
def test_max_unavailable_percent_is_the_least_integer_at_or_above_the_share(
    percent: int, desired: int
) -> None:
    value = resolve_max_unavailable(f"{percent}%", desired)
    assert value * 100 >= percent * desired
    assert (value - 1) * 100 < percent * desired


def test_options_come_from_the_service_unless_the_nodeset_overrides_them() -> None:
    defaults = Defaults(scale_down_priority_ordering=True, force_delete_known_timeout=30.0)
    plain = parse(nodeset(), defaults)
    assert plain.scale_down_priority_ordering is True
    assert plain.force_delete_known_timeout == 30.0
    assert plain.force_delete_unknown_timeout == 0.0
    assert plain.max_unavailable == 1
    assert plain.pod_name_prefix == "gpu"
    overridden = parse(
        nodeset(
            extra={
                "scaleDownPriorityOrdering": False,
                "forceScalingDeleteKnownConditionTimeout": 5,
                "forceScalingDeleteUnknownConditionTimeout": 7,
                "podNamePrefix": "compute",
            }
        ),
        defaults,
    )
    assert overridden.scale_down_priority_ordering is False
    assert overridden.force_delete_known_timeout == 5.0
    assert overridden.force_delete_unknown_timeout == 7.0
    assert overridden.pod_name_prefix == "compute"


def test_rule_bad_input_negative_timeout_override() -> None:
    reasons = fields_and_reasons(nodeset(extra={"forceScalingDeleteKnownConditionTimeout": -3}))
    assert reasons == {("spec.forceScalingDeleteKnownConditionTimeout", "InvalidTimeout")}


def test_slurm_trust_and_lock_settings_come_from_the_environment() -> None:
    config = load_config(
        NodeSetControllerConfig,
        {
            "NATS_URL": "nats://x:4222",
            "SLURM_STATE_MAX_AGE_SECONDS": "60",
            "SLURM_ABSENCE_GRACE_SECONDS": "120",
            "LOCK_TOLERATION_KEY": "example.com/lock",
        },
    )
    assert config.slurm_state_max_age_seconds == 60
    assert config.slurm_absence_grace_seconds == 120
    assert config.defaults.lock_toleration_key == "example.com/lock"
    defaults = load_config(NodeSetControllerConfig, {"NATS_URL": "nats://x:4222"})
    assert defaults.slurm_state_max_age_seconds == 0
    assert defaults.slurm_absence_grace_seconds == 300
    assert defaults.lock_toleration_key == "sunk.coreweave.com/lock"
    with pytest.raises(ConfigError):
        load_config(
            NodeSetControllerConfig,
            {"NATS_URL": "nats://x:4222", "SLURM_ABSENCE_GRACE_SECONDS": "-1"},
        )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"hostNetwork": True}, "spec.template.spec.hostNetwork"),
        ({"hostname": "slurm-node"}, "spec.template.spec.hostname"),
    ],
)
def test_rule_bad_input_slurm_node_name_must_be_the_pod_name(
    extra: dict[str, Any], field: str
) -> None:
    """Issue 28 item 4: with hostNetwork or a hostname, slurmd registers under another name
    than the pod's, so the pod would look unregistered and be deleted past the absence grace
    while its jobs run. The template is refused (InvalidSpec), the name never guessed."""
    problems = validate(nodeset(template_spec={**TEMPLATE_SPEC, **extra}))
    assert [(p.field, p.reason) for p in problems] == [(field, "SlurmNodeNameNotPodName")]


def test_rule_bad_input_pod_named_hostname_settings_are_accepted() -> None:
    """hostNetwork false, an empty hostname and a subdomain leave the hostname the pod name."""
    template = {**TEMPLATE_SPEC, "hostNetwork": False, "hostname": "", "subdomain": "slurm"}
    assert validate(nodeset(template_spec=template)) == []
