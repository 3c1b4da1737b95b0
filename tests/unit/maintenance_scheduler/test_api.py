"""Parsing of the maintenance.nvidia.com/v1alpha1 API: the reference's fields and defaults."""

from __future__ import annotations

import pytest

from maintenance_scheduler.api import (
    IntOrPercent,
    config_warnings,
    parse_int_or_percent,
    parse_node_maintenance,
    parse_operator_config,
)
from tests.unit.maintenance_scheduler.builders import nm, nm_object


def test_rule_defaults_cordon_true_drain_timeout_300() -> None:
    request = nm("r", "n1", drainSpec={})
    assert request.cordon is True
    assert request.drain_spec is not None
    assert request.drain_spec.timeout_seconds == 300
    assert request.drain_spec.force is False
    assert request.drain_spec.delete_empty_dir is False
    assert request.wait_for_pod_completion is None
    assert request.phase == ""


def test_rule_wait_for_pod_completion_timeout_defaults_to_forever() -> None:
    request = nm("r", "n1", waitForPodCompletion={"podSelector": "app=x"})
    assert request.wait_for_pod_completion is not None
    assert request.wait_for_pod_completion.timeout_seconds == 0


def test_rule_reference_example_manifest_parses() -> None:
    request = nm(
        "my-maintenance-operation",
        "wokrer-01",
        requestor="some.one.acme.com",
        cordon=True,
        waitForPodCompletion={"podSelector": "app=important", "timeoutSeconds": 0},
        drainSpec={
            "force": True,
            "podSelector": "",
            "timeoutSeconds": 0,
            "deleteEmptyDir": True,
            "podEvictionFilters": [
                {"byResourceNameRegex": "nvidia.com/gpu-*"},
                {"byResourceNameRegex": "nvidia.com/rdma*"},
            ],
        },
    )
    assert request.problems == ()
    assert request.drain_spec is not None
    assert request.drain_spec.eviction_filters == ("nvidia.com/gpu-*", "nvidia.com/rdma*")
    assert request.drain_spec.timeout_seconds == 0


@pytest.mark.parametrize("requestor", ["a", "-bad.com", "x" * 64, "has space"])
def test_rule_requestor_id_is_validated(requestor: str) -> None:
    assert nm("r", "n1", requestor=requestor).problems


def test_rule_node_name_is_required() -> None:
    obj = nm_object("r", "")
    assert "spec.nodeName is required" in parse_node_maintenance(obj).problems


def test_rule_additional_requestors_is_a_set() -> None:
    request = nm("r", "n1", additionalRequestors=["a.com", "b.com", "a.com"])
    assert request.additional_requestors == ("a.com", "b.com")


def test_rule_phase_is_the_ready_reason() -> None:
    assert nm("r", "n1", phase="Draining").phase == "Draining"
    assert nm("r", "n1", phase="Draining").in_progress
    assert not nm("r", "n1", phase="Pending").in_progress


def test_rule_config_defaults() -> None:
    cfg = parse_operator_config(None)
    assert cfg.max_parallel_operations == IntOrPercent(1)
    assert cfg.max_unavailable is None
    assert cfg.max_node_maintenance_time_seconds == 3600
    assert cfg.log_level == "info"


def test_rule_config_reads_int_or_percent() -> None:
    cfg = parse_operator_config(
        {"spec": {"maxParallelOperations": "25%", "maxUnavailable": 3, "logLevel": "debug"}}
    )
    assert cfg.parallel_limit(10) == 3  # 2.5 rounds up
    assert cfg.unavailable_limit(10) == 3
    assert parse_int_or_percent("7") == IntOrPercent(7)
    assert parse_int_or_percent(-1) is None


def test_rule_unreadable_max_unavailable_fails_closed() -> None:
    cfg = parse_operator_config({"spec": {"maxUnavailable": "lots"}})
    assert cfg.problems
    assert cfg.unavailable_limit(100) == 0


def test_rule_an_eviction_filter_without_regex_is_refused() -> None:
    """Skipped, `[{}]` would read as no filter, and no filter evicts every pod."""
    request = nm("r", "n1", drainSpec={"podEvictionFilters": [{}]})
    assert any(
        "drainSpec.podEvictionFilters[0].byResourceNameRegex is required" in p
        for p in request.problems
    )
    numbered = nm(
        "r",
        "n1",
        drainSpec={"podEvictionFilters": [{"byResourceNameRegex": "gpu"}, {"other": 1}]},
    )
    assert [p for p in numbered.problems if "podEvictionFilters[1]" in p]
    assert nm("r", "n1", drainSpec={"podEvictionFilters": []}).problems == ()


def test_rule_max_parallel_operations_zero_means_no_limit_with_a_warning() -> None:
    """The field's documentation says 0 means no limit, and so it reads here; upstream's
    controller schedules nothing with it, so the config is told (a Warning Event)."""
    for zero in (0, "0", "0%"):
        cfg = parse_operator_config({"spec": {"maxParallelOperations": zero}})
        assert cfg.parallel_limit(10) is None
        ((reason, message),) = config_warnings(cfg)
        assert reason == "UnlimitedParallelOperations"
        assert "no limit" in message and "schedules nothing" in message
    assert config_warnings(parse_operator_config({"spec": {"maxParallelOperations": 2}})) == ()
    assert config_warnings(parse_operator_config(None)) == ()
