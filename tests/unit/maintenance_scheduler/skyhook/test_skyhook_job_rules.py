"""The stage Job's and the interrupt request's smaller rules, each one a slip mutation testing
found no test noticed (issue 37:
`make mutate MODULES=services/maintenance_scheduler/skyhook/jobs.py`)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from maintenance_scheduler.skyhook.api import (
    NAME_LABEL,
    NODE_LABEL,
    PACKAGE_LABEL,
    RESOURCE_ID_LABEL,
    STAGE_LABEL,
    Expression,
    Interrupt,
    LabelSelector,
    Package,
    parse_skyhook,
)
from maintenance_scheduler.skyhook.jobs import (
    IDENTITY_ANNOTATION,
    build_job,
    build_maintenance,
    entry_identity,
    job_labels,
    job_name,
    maintenance_name,
    match_object,
    requestor_id,
    resource_id,
)

SKYHOOK = parse_skyhook(
    {
        "metadata": {"name": "gpu-init", "uid": "uid-1", "resourceVersion": "5"},
        "spec": {
            "podNonInterruptLabels": {"matchLabels": {"app": "training"}},
            "packages": {
                "kernel": {
                    "version": "2.0.0",
                    "image": "registry.local/kernel",
                    "interrupt": {"type": "reboot"},
                    "stageTimeout": 900,
                }
            },
        },
    }
)
KERNEL = SKYHOOK.packages[0]
DIGEST = re.compile(r"[0-9a-f]{8}")


def test_a_job_name_reads_as_its_skyhook_package_stage_and_node_then_an_8_digit_digest() -> None:
    name = job_name("gpu-init", "kernel", "2.0.0", "apply", "node-7")
    readable, _, digest = name.rpartition("-")
    assert readable == "gpu-init-kernel-apply-node-7"
    assert DIGEST.fullmatch(digest)


def test_a_job_name_cuts_each_part_to_its_share_of_the_63_characters() -> None:
    name = job_name(
        "skyhook0123456789",
        "package0123456789",
        "2.0.0",
        "post-interrupt",
        "node.rack0123456789",
        "run:config",
    )
    readable, _, digest = name.rpartition("-")
    # 12, 12, 14 and 12 characters, dots made dashes.
    assert readable == "skyhook01234-package01234-post-interrupt-node-rack012"
    assert DIGEST.fullmatch(digest)
    assert len(name) <= 63


def test_a_maintenance_name_reads_as_its_skyhook_and_node_then_an_8_digit_digest() -> None:
    name = maintenance_name("gpuinit0123456789abcdefgh", "node.rack0123456789abcdefgh")
    readable, _, digest = name.rpartition("-")
    # "skyhook-", then 20 and 24 characters.
    assert readable == "skyhook-gpuinit0123456789abc-node-rack0123456789abcde"
    assert DIGEST.fullmatch(digest)
    assert len(name) <= 63


def test_names_stay_as_earlier_releases_wrote_them_so_an_upgraded_controller_finds_its_jobs() -> (
    None
):
    # A restarted (or upgraded) controller re-creates a stage's Job by name and is refused as
    # it already exists: a name that changed between releases would start the stage twice.
    assert job_name("gpu-init", "kernel", "2.0.0", "interrupt", "node-7", "r1:c1") == (
        "gpu-init-kernel-interrupt-node-7-a642630e"
    )
    # An entry written before run and config existed keeps the older name.
    assert job_name("gpu-init", "kernel", "2.0.0", "interrupt", "node-7") == (
        "gpu-init-kernel-interrupt-node-7-8b336083"
    )
    assert job_name("gpu-init", "kernel", "2.0.0", "interrupt", "node-7", "") == (
        "gpu-init-kernel-interrupt-node-7-8b336083"
    )
    assert resource_id("gpu-init", "kernel", "2.0.0", "node-7") == "85ff0032d29d249b50eb"
    assert maintenance_name("gpu-init", "node-7") == "skyhook-gpu-init-node-7-97d5fa20"


def test_a_job_s_identity_part_names_its_run_and_config_and_is_empty_without_either() -> None:
    assert entry_identity("r1", "c1") == "r1:c1"
    assert entry_identity("r1", "") == "r1:"
    assert entry_identity("", "c1") == ":c1"
    assert entry_identity("", "") == ""


def test_a_requestor_id_is_cut_to_63_characters_without_a_trailing_dot_or_dash() -> None:
    assert requestor_id("a" * 70) == "a" * 63
    assert requestor_id("a" * 62) == "a" * 62  # the cut fell after the dot
    assert requestor_id("a" * 61 + "-") == "a" * 61
    assert requestor_id("gpu-init") == "gpu-init.skyhook.nvidia.com"


def test_job_labels_take_a_package_or_its_name() -> None:
    by_package = job_labels("gpu-init", KERNEL, "apply", "node-7", "2.0.0")
    assert by_package == job_labels("gpu-init", "kernel", "apply", "node-7", "2.0.0")
    assert by_package == {
        NAME_LABEL: "gpu-init",
        PACKAGE_LABEL: "kernel",
        NODE_LABEL: "node-7",
        STAGE_LABEL: "apply",
        RESOURCE_ID_LABEL: resource_id("gpu-init", "kernel", "2.0.0", "node-7"),
        "app.kubernetes.io/managed-by": "nodeflow-maintenance-scheduler",
    }


def test_a_stage_job_s_deadline_is_the_package_s_then_the_default_and_none_without_either() -> None:
    def deadline(package: Package, default: int) -> object:
        job = build_job(
            SKYHOOK,
            package,
            "apply",
            "node-7",
            namespace="ops",
            default_stage_timeout_seconds=default,
        )
        return job["spec"].get("activeDeadlineSeconds")

    assert deadline(KERNEL, 60) == 900
    assert deadline(replace(KERNEL, stage_timeout_seconds=None), 60) == 60
    assert deadline(replace(KERNEL, stage_timeout_seconds=None), 0) is None


def test_a_stage_job_is_owned_by_its_skyhook_records_what_it_runs_and_keeps_its_pod_alive() -> None:
    job = build_job(
        SKYHOOK,
        KERNEL,
        "config",
        "node-7",
        namespace="ops",
        default_stage_timeout_seconds=60,
        run="r1",
        config="c1",
        node_uid="n-1",
    )
    assert job["metadata"]["namespace"] == "ops"
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "name": "gpu-init",
            "uid": "uid-1",
            # Never holds up the Skyhook's own deletion.
            "blockOwnerDeletion": False,
        }
    ]
    assert json.loads(job["metadata"]["annotations"][IDENTITY_ANNOTATION]) == {
        "skyhook": "uid-1",
        "node": "n-1",
        "version": "2.0.0",
        "run": "r1",
        "config": "c1",
    }
    assert job["metadata"]["name"] == job_name(
        "gpu-init", "kernel", "2.0.0", "config", "node-7", "r1:c1"
    )
    pod = job["spec"]["template"]["spec"]
    # Not-ready and unreachable nodes (the reboot) never evict the package pod.
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert {"key": key, "operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    # The default node order is the first place.
    assert job == build_job(
        SKYHOOK,
        KERNEL,
        "config",
        "node-7",
        namespace="ops",
        default_stage_timeout_seconds=60,
        run="r1",
        config="c1",
        node_uid="n-1",
        node_order=0,
    )


def test_an_interrupt_job_without_an_interrupt_runs_a_noop() -> None:
    plain = replace(KERNEL, interrupt=None)
    job = build_job(
        SKYHOOK, plain, "interrupt", "node-7", namespace="ops", default_stage_timeout_seconds=60
    )
    noop = build_job(
        SKYHOOK,
        replace(KERNEL, interrupt=Interrupt("noop")),
        "interrupt",
        "node-7",
        namespace="ops",
        default_stage_timeout_seconds=60,
    )
    reboot = build_job(
        SKYHOOK, KERNEL, "interrupt", "node-7", namespace="ops", default_stage_timeout_seconds=60
    )
    assert job["spec"]["template"]["spec"] == noop["spec"]["template"]["spec"]
    assert job["spec"]["template"]["spec"] != reboot["spec"]["template"]["spec"]


def test_the_interrupt_request_cordons_forces_the_drain_and_waits_without_limit() -> None:
    body = build_maintenance(SKYHOOK, "node-7", namespace="ops", drain_timeout_seconds=300)
    assert body["spec"] == {
        "requestorID": "gpu-init.skyhook.nvidia.com",
        "nodeName": "node-7",
        "cordon": True,
        "drainSpec": {
            "force": True,
            "deleteEmptyDir": True,
            "podSelector": "!skyhook.nvidia.com/name,!nodewright.nvidia.com/name",
            "timeoutSeconds": 300,
        },
        "waitForPodCompletion": {"podSelector": "app=training", "timeoutSeconds": 0},
    }
    assert body["metadata"]["namespace"] == "ops"
    assert body["metadata"]["labels"] == {
        NAME_LABEL: "gpu-init",
        NODE_LABEL: "node-7",
        "app.kubernetes.io/managed-by": "nodeflow-maintenance-scheduler",
    }
    unwaited = replace(SKYHOOK, pod_non_interrupt_labels=None)
    body = build_maintenance(unwaited, "node-7", namespace="ops", drain_timeout_seconds=300)
    assert "waitForPodCompletion" not in body["spec"]


def test_a_selector_s_object_lists_each_expression_s_values_sorted() -> None:
    selector = LabelSelector(
        match_labels=(("app", "training"),),
        expressions=(Expression("tier", "In", frozenset({"b", "a", "c"})),),
    )
    assert match_object(selector) == {
        "matchLabels": {"app": "training"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b", "c"]}],
    }
