"""Skyhook and DeploymentPolicy parsing: the anchor's fields, defaults and refusals."""

from __future__ import annotations

from typing import Any

import pytest

from maintenance_scheduler.skyhook.api import (
    DEFAULT_PRIORITY,
    Budget,
    Strategy,
    node_state_annotation,
    parse_deployment_policy,
    parse_skyhook,
    policy_for,
    status_key,
)


def skyhook_obj(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "gpu-init", "uid": "u1", "annotations": annotations or {}},
        "spec": spec,
    }


def policy_obj(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "safe"}, "spec": spec}


PACKAGES = {
    "driver": {"version": "1.2.0", "image": "ghcr.io/x/driver"},
    "tuning": {
        "version": "0.1.0",
        "image": "ghcr.io/x/tuning:0.1.0",
        "interrupt": {"type": "reboot"},
        "dependsOn": {"driver": "1.2.0"},
    },
}


def test_skyhook_defaults_priority_200_sequencing_node_and_strips_the_image_tag() -> None:
    skyhook = parse_skyhook(skyhook_obj({"packages": PACKAGES}))
    assert skyhook.problems == ()
    assert skyhook.priority == DEFAULT_PRIORITY
    assert skyhook.sequencing == "node"
    tuning = skyhook.package("tuning")
    assert tuning is not None
    assert tuning.image == "ghcr.io/x/tuning"
    assert tuning.image_ref == "ghcr.io/x/tuning:0.1.0"
    assert tuning.interrupt is not None and tuning.interrupt.type == "reboot"
    assert tuning.depends_on == (("driver", "1.2.0"),)


def test_skyhook_pause_and_disable_annotations() -> None:
    paused = parse_skyhook(skyhook_obj({}, {"skyhook.nvidia.com/pause": "true"}))
    disabled = parse_skyhook(skyhook_obj({}, {"skyhook.nvidia.com/disable": "true"}))
    assert paused.paused and not paused.disabled
    assert disabled.disabled and not disabled.paused


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"packages": {"a": {"version": "1.0.0", "image": "x"}}}, "must match"),
        ({"packages": {"pkg": {"image": "x"}}}, "version: required"),
        ({"packages": {"pkg": {"version": "one", "image": "x"}}}, "not a semantic version"),
        ({"packages": {"pkg": {"version": "1.0.0", "image": "x:2.0.0"}}}, "differs from version"),
        (
            {"packages": {"pkg": {"version": "1.0.0", "image": "x", "interrupt": {"type": "x"}}}},
            "interrupt.type",
        ),
        (
            {"packages": {"pkg": {"version": "1.0.0", "image": "x"}}, "priority": 0},
            "spec.priority",
        ),
        (
            {"interruptionBudget": {"percent": 10}, "deploymentPolicy": "safe"},
            "mutually exclusive",
        ),
        ({"interruptionBudget": {"percent": 10, "count": 2}}, "exactly one of percent or count"),
        (
            {
                "packages": {
                    "pkg": {
                        "version": "1.0.0",
                        "image": "x",
                        "resources": {"cpuRequest": "1"},
                    }
                }
            },
            "set all of",
        ),
        (
            {"packages": {"pkg": {"version": "1.0.0", "image": "x", "dependsOn": {"nope": "1"}}}},
            "is not a package",
        ),
        # A label value the API server would refuse: the podSelector made of it would not
        # parse, and the interrupt's NodeMaintenance would wait for ever.
        ({"podNonInterruptLabels": {"matchLabels": {"app": "a:b"}}}, "invalid label value"),
        (
            {
                "podNonInterruptLabels": {
                    "matchExpressions": [{"key": "bad key", "operator": "Exists"}]
                }
            },
            "invalid label key",
        ),
    ],
)
def test_skyhook_invalid_spec_is_reported_with_a_clear_problem(
    spec: dict[str, Any], problem: str
) -> None:
    skyhook = parse_skyhook(skyhook_obj(spec))
    assert any(problem in p for p in skyhook.problems), skyhook.problems


def test_skyhook_depends_on_cycle_is_invalid() -> None:
    packages = {
        "aa": {"version": "1.0.0", "image": "x", "dependsOn": {"bb": "1.0.0"}},
        "bb": {"version": "1.0.0", "image": "x", "dependsOn": {"cc": "1.0.0"}},
        "cc": {"version": "1.0.0", "image": "x", "dependsOn": {"aa": "1.0.0"}},
    }
    skyhook = parse_skyhook(skyhook_obj({"packages": packages}))
    assert any("dependsOn cycle aa -> bb -> cc -> aa" in p for p in skyhook.problems)


def test_policy_strategy_defaults_match_the_anchor() -> None:
    policy = parse_deployment_policy(
        policy_obj(
            {
                "default": {"budget": {"percent": 25}, "strategy": {"linear": {}}},
                "compartments": [
                    {
                        "name": "canary",
                        "selector": {"matchLabels": {"tier": "canary"}},
                        "budget": {"count": 2},
                        "strategy": {"exponential": {"failureThreshold": 2}},
                    }
                ],
            }
        )
    )
    assert policy.problems == ()
    assert policy.default.budget == Budget(percent=25)
    assert policy.default.strategy == Strategy(kind="linear")
    assert policy.default.strategy.failure_threshold is None  # never stops
    canary = policy.compartments[0]
    assert canary.strategy == Strategy(kind="exponential", failure_threshold=2)
    assert (canary.strategy.initial_batch, canary.strategy.growth_factor) == (1, 2)
    assert (canary.strategy.batch_threshold, canary.strategy.safety_limit) == (100, 50)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"default": {"budget": {}}}, "exactly one of percent or count"),
        ({"default": {"budget": {"percent": 0}}}, "between 1 and 100"),
        ({"default": {"budget": {"count": 0}}}, ">= 1"),
        (
            {"default": {"budget": {"count": 1}, "strategy": {"fixed": {}, "linear": {}}}},
            "exactly one of fixed, linear, or exponential",
        ),
        (
            {"default": {"budget": {"count": 1}, "strategy": {"exponential": {"growthFactor": 1}}}},
            "growthFactor: must be >= 2",
        ),
        (
            {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"delta": 2}}}},
            "not a field of a fixed strategy",
        ),
        (
            {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    {"name": "__default__", "selector": {}, "budget": {"count": 1}},
                ],
            },
            "reserved",
        ),
        (
            {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    {"name": "a", "selector": {"matchLabels": {"x": "1"}}, "budget": {"count": 1}},
                    {"name": "b", "selector": {"matchLabels": {"x": "1"}}, "budget": {"count": 1}},
                ],
            },
            "identical to compartment 'a'",
        ),
    ],
)
def test_policy_invalid_spec_is_reported(spec: dict[str, Any], problem: str) -> None:
    policy = parse_deployment_policy(policy_obj(spec))
    assert any(problem in p for p in policy.problems), policy.problems


def test_skyhook_without_policy_gets_a_fixed_default_from_its_interruption_budget() -> None:
    skyhook = parse_skyhook(skyhook_obj({"interruptionBudget": {"count": 3}}))
    policy = policy_for(skyhook, {})
    assert policy is not None and policy.default.budget == Budget(count=3)
    missing = parse_skyhook(skyhook_obj({"deploymentPolicy": "gone"}))
    assert policy_for(missing, {}) is None


@pytest.mark.parametrize(
    ("budget", "matched", "ceiling"),
    [
        (Budget(count=3), 10, 3),
        (Budget(percent=25), 10, 2),
        (Budget(percent=25), 3, 1),
        (Budget(percent=100), 7, 7),
        (Budget(percent=50), 0, 0),
    ],
)
def test_ceiling_is_count_or_floor_percent_at_least_one(
    budget: Budget, matched: int, ceiling: int
) -> None:
    assert budget.ceiling(matched) == ceiling


def test_node_keys_are_named_per_skyhook() -> None:
    assert node_state_annotation("gpu-init") == "skyhook.nvidia.com/nodeState_gpu-init"
    assert status_key("gpu-init") == "skyhook.nvidia.com/status_gpu-init"
