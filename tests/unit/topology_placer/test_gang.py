"""Rules of reading PodGroups and Koordinator's gang annotations."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from nodeflow_contracts.durations import go_duration_seconds
from tests.unit.topology_placer.builders import pod, pod_group
from topology_placer.gang import (
    GROUPS,
    MATCH_POLICY,
    MATCH_POLICY_ALIAS,
    MIN_AVAILABLE,
    MODE,
    NAME,
    TOTAL_NUMBER,
    WAITING_TIME,
    GangSpecError,
    GatherRule,
    GroupKey,
    annotation_gang_object,
    is_annotation_gang_member,
    natural_key,
    parse_pod_group,
    pod_group_of,
    rank_key,
    topology_index,
)


def test_defaults_are_strict_once_satisfied_600_seconds_and_a_group_of_one() -> None:
    spec = parse_pod_group(pod_group("gang", 4))
    assert spec.min_member == 4
    assert spec.total_number == 4
    assert spec.mode == "Strict"
    assert spec.match_policy == "once-satisfied"
    assert spec.waiting_seconds == 600.0
    assert spec.gang_group == (GroupKey("default", "gang"),)
    assert spec.gather == ()


def test_groups_annotation_forms_a_sorted_gang_group_that_includes_itself() -> None:
    annotations = {GROUPS: '["default/worker"]'}
    spec = parse_pod_group(pod_group("master", 1, annotations=annotations))
    assert spec.gang_group == (GroupKey("default", "master"), GroupKey("default", "worker"))


@pytest.mark.parametrize(
    "raw", ["not json", '{"a": 1}', '["no-slash"]', '["a/b/c"]', "[1]", '["/x"]']
)
def test_bad_groups_annotation_is_an_error_naming_the_key(raw: str) -> None:
    with pytest.raises(GangSpecError, match=GROUPS):
        parse_pod_group(pod_group("g", 1, annotations={GROUPS: raw}))


def test_schedule_timeout_seconds_wins_over_waiting_time() -> None:
    group = pod_group("g", 1, timeout=30, annotations={WAITING_TIME: "10m"})
    assert parse_pod_group(group).waiting_seconds == 30.0


@pytest.mark.parametrize(("raw", "seconds"), [("600s", 600.0), ("10m", 600.0), ("1h30m", 5400.0)])
def test_waiting_time_is_a_go_duration(raw: str, seconds: float) -> None:
    assert parse_pod_group(pod_group("g", 1, annotations={WAITING_TIME: raw})).waiting_seconds == (
        seconds
    )
    assert go_duration_seconds(raw) == seconds


@pytest.mark.parametrize("raw", ["ten minutes", "0s", "", "5"])
def test_bad_waiting_time_is_an_error_not_a_silent_default(raw: str) -> None:
    with pytest.raises(GangSpecError, match=WAITING_TIME):
        parse_pod_group(pod_group("g", 1, annotations={WAITING_TIME: raw}))


def test_mode_and_match_policy_accept_only_their_values() -> None:
    spec = parse_pod_group(
        pod_group("g", 1, annotations={MODE: "NonStrict", MATCH_POLICY_ALIAS: "only-waiting"})
    )
    assert (spec.mode, spec.match_policy) == ("NonStrict", "only-waiting")
    with pytest.raises(GangSpecError, match=MODE):
        parse_pod_group(pod_group("g", 1, annotations={MODE: "strict-ish"}))
    with pytest.raises(GangSpecError, match=MATCH_POLICY):
        parse_pod_group(pod_group("g", 1, annotations={MATCH_POLICY: "whenever"}))


def test_total_number_is_floored_at_min_member() -> None:
    assert parse_pod_group(pod_group("g", 4, annotations={TOTAL_NUMBER: "2"})).total_number == 4
    assert parse_pod_group(pod_group("g", 4, annotations={TOTAL_NUMBER: "6"})).total_number == 6
    with pytest.raises(GangSpecError, match=TOTAL_NUMBER):
        parse_pod_group(pod_group("g", 4, annotations={TOTAL_NUMBER: "six"}))


def test_rule_min_member_zero_is_read_as_upstream_and_a_negative_one_is_an_error() -> None:
    # minMember 0 is the PodGroup CRD's default: no gang check (each pod placed on its own).
    assert parse_pod_group(pod_group("g", 0)).min_member == 0
    with pytest.raises(GangSpecError, match=r"spec\.minMember"):
        parse_pod_group(pod_group("g", -1))


@pytest.mark.parametrize("timeout", [0, -5])
def test_rule_schedule_timeout_seconds_zero_means_the_600_second_default(timeout: int) -> None:
    # Koordinator's GetWaitTimeDuration: a scheduleTimeoutSeconds that is not positive falls
    # back to the default timeout, it does not make the PodGroup invalid.
    assert parse_pod_group(pod_group("g", 1, timeout=timeout)).waiting_seconds == 600.0


def test_network_topology_spec_reads_layers_strategies_and_multiples() -> None:
    gather: list[dict[str, Any]] = [
        {"layer": "BlockLayer", "strategy": "PreferGather"},
        {"layer": "SpineLayer", "strategy": "MustGather", "podCountMultiple": 4},
    ]
    spec = parse_pod_group(pod_group("g", 1, gather=gather))
    assert spec.gather == (
        GatherRule("BlockLayer", "PreferGather", 1),
        GatherRule("SpineLayer", "MustGather", 4),
    )


@pytest.mark.parametrize(
    "rule",
    [
        {"layer": "BlockLayer", "strategy": "Gather"},
        {"strategy": "MustGather"},
        {"layer": "BlockLayer", "strategy": "MustGather", "podCountMultiple": 0},
    ],
)
def test_bad_network_topology_spec_is_an_error(rule: dict[str, object]) -> None:
    with pytest.raises(GangSpecError, match="network-topology-spec"):
        parse_pod_group(pod_group("g", 1, gather=[rule]))


def test_membership_is_the_pod_group_label_in_the_pods_namespace() -> None:
    assert pod_group_of(pod("p", "gang", namespace="ml")) == GroupKey("ml", "gang")
    assert pod_group_of(pod("p", None)) is None


def test_rank_order_is_index_then_unindexed_by_natural_name() -> None:
    pods = [("pod-10", None), ("pod-2", None), ("z", 1), ("a", 0)]
    ordered = sorted(pods, key=lambda p: rank_key(p[1], p[0]))
    assert [name for name, _ in ordered] == ["a", "z", "pod-2", "pod-10"]


def test_bad_topology_index_is_an_error() -> None:
    bad = pod("p", index=None)
    bad["metadata"]["annotations"]["gang.scheduling.koordinator.sh/network-topology-index"] = "x"
    with pytest.raises(GangSpecError, match="network-topology-index"):
        topology_index(bad)
    assert topology_index(pod("p", index=3)) == 3


@pytest.mark.parametrize("value", [2.5, [2], {"n": 2}])
def test_rule_a_minimum_that_is_neither_an_integer_nor_a_string_is_an_error_naming_the_key(
    value: object,
) -> None:
    group = pod_group("g", 1)
    group["spec"]["minMember"] = value
    with pytest.raises(GangSpecError, match=r"spec\.minMember: .* is not an integer"):
        parse_pod_group(group)


@pytest.mark.parametrize("layer", ["", 5, None])
def test_rule_a_gather_rule_names_its_layer_as_a_non_empty_string(layer: object) -> None:
    rule = {"layer": layer, "strategy": "MustGather"}
    with pytest.raises(GangSpecError, match="a rule has no layer"):
        parse_pod_group(pod_group("g", 1, gather=[rule]))


def test_rule_a_pod_group_without_a_namespace_or_name_reads_them_as_empty_not_none() -> None:
    group = pod_group("g", 1)
    del group["metadata"]["namespace"]
    del group["metadata"]["name"]
    assert parse_pod_group(group).key == GroupKey("", "")


def _declared_by_annotation(min_available: str) -> dict[str, Any]:
    """A PodGroup object with no minMember: its minimum comes from the annotation."""
    group = pod_group("g", 1, annotations={MIN_AVAILABLE: min_available})
    del group["spec"]["minMember"]
    return group


def test_rule_a_gang_declared_by_annotation_needs_a_min_available_of_at_least_one() -> None:
    assert parse_pod_group(_declared_by_annotation("1")).min_member == 1
    with pytest.raises(GangSpecError, match=f"{MIN_AVAILABLE}: 0 is below the minimum 1"):
        parse_pod_group(_declared_by_annotation("0"))


def test_rule_total_number_zero_reads_as_min_member_and_a_negative_one_is_an_error() -> None:
    assert parse_pod_group(pod_group("g", 3, annotations={TOTAL_NUMBER: "0"})).total_number == 3
    with pytest.raises(GangSpecError, match=f"{TOTAL_NUMBER}: -1 is below the minimum 0"):
        parse_pod_group(pod_group("g", 3, annotations={TOTAL_NUMBER: "-1"}))


def test_rule_min_resources_are_read_as_quantities_and_a_bad_one_is_an_error() -> None:
    group = pod_group("g", 2)
    group["spec"]["minResources"] = {"cpu": "500m", "nvidia.com/gpu": "16"}
    assert parse_pod_group(group).min_resources == {
        "cpu": Fraction(1, 2),
        "nvidia.com/gpu": Fraction(16),
    }
    group["spec"]["minResources"] = {"cpu": "lots"}
    with pytest.raises(GangSpecError, match=r"spec\.minResources"):
        parse_pod_group(group)


def test_rule_schedule_timeout_seconds_is_an_int32_and_one_second_is_kept() -> None:
    assert parse_pod_group(pod_group("g", 1, timeout=1)).waiting_seconds == 1.0
    # int32's minimum is read (and, not positive, falls back to the default); below it is
    # no int32 at all.
    assert parse_pod_group(pod_group("g", 1, timeout=-(2**31))).waiting_seconds == 600.0
    with pytest.raises(GangSpecError, match=r"spec\.scheduleTimeoutSeconds"):
        parse_pod_group(pod_group("g", 1, timeout=-(2**31) - 1))


@pytest.mark.parametrize(("raw", "seconds"), [("1s", 1.0), ("500ms", 0.5)])
def test_rule_any_positive_waiting_time_is_kept_even_below_a_second(
    raw: str, seconds: float
) -> None:
    group = pod_group("g", 1, annotations={WAITING_TIME: raw})
    assert parse_pod_group(group).waiting_seconds == seconds


def test_rule_a_pod_group_keeps_its_uid_and_one_without_a_uid_has_an_empty_one() -> None:
    group = pod_group("g", 1)
    assert parse_pod_group(group).uid == "uid-pg-default-g"
    del group["metadata"]["uid"]
    assert parse_pod_group(group).uid == ""


def test_rule_a_pod_without_a_namespace_belongs_to_its_gang_in_the_empty_namespace() -> None:
    member = pod("p", "gang")
    del member["metadata"]["namespace"]
    assert pod_group_of(member) == GroupKey("", "gang")


def test_rule_a_pod_with_the_pod_group_label_is_no_annotation_gang_member() -> None:
    declared = pod("p", None)
    declared["metadata"]["annotations"][NAME] = "by-annotation"
    assert is_annotation_gang_member(declared)
    labelled = pod("q", "gang")
    labelled["metadata"]["annotations"][NAME] = "by-annotation"
    assert not is_annotation_gang_member(labelled)
    assert not is_annotation_gang_member(pod("r", "gang"))


def test_rule_a_gang_declared_by_a_pod_without_a_namespace_is_in_the_empty_namespace() -> None:
    member = pod("p", None)
    member["metadata"]["annotations"][NAME] = "by-annotation"
    del member["metadata"]["namespace"]
    read = annotation_gang_object(member)
    assert read["metadata"]["name"] == "by-annotation"
    assert read["metadata"]["namespace"] == ""


def test_rule_a_negative_topology_index_is_an_error_and_zero_is_the_first_rank() -> None:
    first = pod("p", index=0)
    assert topology_index(first) == 0
    first["metadata"]["annotations"]["gang.scheduling.koordinator.sh/network-topology-index"] = "-1"
    with pytest.raises(GangSpecError, match="-1 is below the minimum 0"):
        topology_index(first)


def test_rule_natural_order_puts_numbers_before_words_and_never_compares_the_two() -> None:
    names = ["b", "x1", "10", "a", "9", "1a"]
    assert sorted(names, key=natural_key) == ["1a", "9", "10", "a", "b", "x1"]


def test_rule_rank_order_follows_the_index_before_the_name() -> None:
    pods = [("a", 2), ("m", None), ("z", 0), ("b", 1)]
    ordered = sorted(pods, key=lambda p: rank_key(p[1], p[0]))
    assert [name for name, _ in ordered] == ["z", "b", "a", "m"]
