"""Migration from Slinky's slurm-operator: `python -m nodeset_controller.migrate slinky`.

Slinky's own example NodeSets (tests/fixtures/slinky, rendered from its Helm chart) convert
cleanly and pass our controller's spec validation; each mapping rule, each unsupported field
and each exit status has its test. The command runs as a user runs it (a subprocess, YAML on
stdin); the conversion's pure core is checked directly for the rules."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeset_controller.migrate import Options, convert_slinky, run
from nodeset_controller.spec import validate

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "slinky"
SLINKY_EXAMPLES = sorted(FIXTURES.glob("*.yaml"))


def slinky_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def chart_default() -> dict[str, Any]:
    return copy.deepcopy(slinky_docs(FIXTURES / "chart-default.yaml")[0])


def migrate(stdin: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run(["slinky", *args], io.StringIO(stdin), out, err)
    return status, out.getvalue(), err.getvalue()


def dump(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(docs))


def test_slinky_examples_are_there_with_their_upstream_path_and_commit() -> None:
    assert len(SLINKY_EXAMPLES) >= 4
    for path in SLINKY_EXAMPLES:
        head = path.read_text().splitlines()[:3]
        assert "SlinkyProject/slurm-operator" in head[0] and "helm/slurm" in "".join(head)


@pytest.mark.parametrize("path", SLINKY_EXAMPLES, ids=lambda p: p.stem)
def test_rule_migrate_converts_slinkys_own_example_nodesets(path: Path) -> None:
    """The real command on Slinky's chart output: exit 0, one NodeSet of ours per input, each
    one our controller accepts (no spec problem)."""
    result = subprocess.run(
        [sys.executable, "-m", "nodeset_controller.migrate", "slinky"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    converted = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert len(converted) == len(slinky_docs(path))
    for ours in converted:
        assert ours["apiVersion"] == "nodeflow.dev/v1alpha1" and ours["kind"] == "NodeSet"
        assert validate(ours) == [], ours
    assert "note:" in result.stderr and "change:" not in result.stderr


def test_rule_migrate_slurmd_becomes_the_templates_first_container() -> None:
    slinky = chart_default()
    slinky["spec"]["template"]["spec"]["containers"] = [{"name": "sidecar", "image": "busybox"}]
    slinky["spec"]["slurmd"]["args"] = ["-vvv"]
    ours = convert_slinky(slinky).nodeset
    assert ours is not None
    containers = ours["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["slurmd", "sidecar"]
    slurmd = containers[0]
    assert slurmd["image"] == slinky["spec"]["slurmd"]["image"]
    # What Slinky's operator added by itself is written out, the user's arguments last.
    assert slurmd["args"] == [
        "-Z",
        "--conf-server",
        "slurm-controller.slurm:6817",
        "--conf",
        "Features=slinky",
        "-vvv",
    ]
    assert slurmd["securityContext"]["privileged"] is True
    assert {"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": True} in slurmd[
        "volumeMounts"
    ]
    volume = ours["spec"]["template"]["spec"]["volumes"][0]
    assert volume["projected"]["sources"][0]["secret"]["name"] == "slurm-auth-slurm"
    # Slinky's hostname prefix names the pods (a hostname of ours must stay unset).
    assert ours["spec"]["podNamePrefix"] == "slinky"
    assert "hostname" not in ours["spec"]["template"]["spec"]


def test_rule_migrate_extra_conf_goes_into_slurmds_conf_with_the_nodeset_feature() -> None:
    slinky = chart_default()
    slinky["spec"]["extraConf"] = "Features=h100,ib Weight=10"
    ours = convert_slinky(slinky).nodeset
    assert ours is not None
    args = ours["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--conf") + 1] == "Features=h100,ib,slinky Weight=10"


def test_rule_migrate_controller_ref_becomes_slurm_cluster() -> None:
    ours = convert_slinky(chart_default()).nodeset
    assert ours is not None and ours["spec"]["slurmCluster"] == "slurm"
    options = Options(slurm_cluster="prod", conf_server="ctld.example:6817")
    named = convert_slinky(chart_default(), options).nodeset
    assert named is not None and named["spec"]["slurmCluster"] == "prod"
    assert "ctld.example:6817" in named["spec"]["template"]["spec"]["containers"][0]["args"]
    no_ref = chart_default()
    del no_ref["spec"]["controllerRef"]
    assert convert_slinky(no_ref).errors


def test_rule_migrate_daemonset_mode_leaves_replicas_unset() -> None:
    slinky = chart_default()
    slinky["spec"]["scalingMode"] = "DaemonSet"
    ours = convert_slinky(slinky).nodeset
    assert ours is not None and "replicas" not in ours["spec"]
    # StatefulSet mode keeps the count, and Slinky's default of 1 is written out (ours, unset,
    # would mean every node).
    unset = chart_default()
    del unset["spec"]["replicas"]
    statefulset = convert_slinky(unset).nodeset
    assert statefulset is not None and statefulset["spec"]["replicas"] == 1


def test_rule_migrate_max_unavailable_defaults_to_slinkys_25_percent() -> None:
    slinky = chart_default()
    del slinky["spec"]["updateStrategy"]
    ours = convert_slinky(slinky).nodeset
    assert ours is not None
    assert ours["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%"},
    }
    # v1alpha1's controller fell back to 1.
    old = chart_default()
    old["apiVersion"] = "slinky.slurm.net/v1alpha1"
    del old["spec"]["updateStrategy"], old["spec"]["scalingMode"]
    old["spec"]["partition"] = {"enabled": False}
    converted = convert_slinky(old).nodeset
    assert converted is not None
    assert converted["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    on_delete = chart_default()
    on_delete["spec"]["updateStrategy"] = {"type": "OnDelete"}
    kept = convert_slinky(on_delete).nodeset
    assert kept is not None and kept["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_rule_migrate_carries_protection_off_and_record_pruning_in_daemonset_mode() -> None:
    slinky = chart_default()
    slinky["spec"]["workloadDisruptionProtection"] = False
    slinky["spec"]["pruneSlurmNodeRecords"] = "NodeNotFound"
    statefulset = convert_slinky(slinky).nodeset
    assert statefulset is not None
    assert statefulset["spec"]["workloadDisruptionProtection"] is False
    # Slinky prunes only in DaemonSet mode: StatefulSet mode keeps Never (the default).
    assert "pruneSlurmNodeRecords" not in statefulset["spec"]
    slinky["spec"]["scalingMode"] = "DaemonSet"
    daemonset = convert_slinky(slinky).nodeset
    assert daemonset is not None and daemonset["spec"]["pruneSlurmNodeRecords"] == "NodeNotFound"
    assert validate(daemonset) == []
    # Slinky's defaults (protection on, Never, 0) are ours: nothing written.
    default = convert_slinky(chart_default()).nodeset
    assert default is not None
    assert {"workloadDisruptionProtection", "pruneSlurmNodeRecords", "minReadySeconds"}.isdisjoint(
        default["spec"]
    )


def test_rule_migrate_carries_min_ready_seconds() -> None:
    """minReadySeconds means the same in both: carried, with no listed change (exit 0)."""
    slinky = chart_default()
    slinky["spec"]["minReadySeconds"] = 30
    status, out, err = migrate(dump(slinky))
    assert status == 0, err
    (converted,) = [doc for doc in yaml.safe_load_all(out) if doc]
    assert converted["spec"]["minReadySeconds"] == 30
    assert validate(converted) == []
    assert "minReadySeconds" not in err


def test_rule_migrate_carries_revision_history_limit() -> None:
    """revisionHistoryLimit means the same in both (ControllerRevisions kept for a rollback):
    carried as set, 0 included, with no listed change (exit 0)."""
    for limit in (0, 4):
        slinky = chart_default()
        slinky["spec"]["revisionHistoryLimit"] = limit
        status, out, err = migrate(dump(slinky))
        assert status == 0, err
        (converted,) = [doc for doc in yaml.safe_load_all(out) if doc]
        assert converted["spec"]["revisionHistoryLimit"] == limit
        assert validate(converted) == []
        assert "revisionHistoryLimit" not in err


UNSUPPORTED: list[tuple[str, Any]] = [
    ("ssh", {"enabled": True}),
    ("partition", {"enabled": True, "config": "MaxTime=1:00:00"}),
    ("volumeClaimTemplates", [{"metadata": {"name": "scratch"}}]),
    ("oversubscribeNode", True),
    ("someFutureField", "x"),
]


@pytest.mark.parametrize(("field", "value"), UNSUPPORTED, ids=[f for f, _ in UNSUPPORTED])
def test_rule_migrate_refuses_a_silent_behaviour_change(field: str, value: Any) -> None:
    """An unsupported field that matters is listed with what to do instead; exit 2 and
    nothing on stdout, so `| kubectl apply -f -` applies nothing; --accept-changes writes."""
    slinky = chart_default()
    slinky["spec"][field] = value
    status, out, err = migrate(dump(slinky))
    assert status == 2 and out == ""
    listed = [line for line in err.splitlines() if line.startswith("change:")]
    assert len(listed) == 1 and f"spec.{field}" in listed[0]
    status, out, err = migrate(dump(slinky), "--accept-changes")
    assert status == 0 and validate(yaml.safe_load(out)) == []


def test_rule_migrate_defaults_of_unsupported_fields_pass_with_a_note() -> None:
    """Slinky's chart writes every field at its default: only notes, exit 0."""
    status, out, err = migrate((FIXTURES / "chart-default.yaml").read_text())
    assert status == 0 and out
    assert "spec.logfile" in err and all(line.startswith("note:") for line in err.splitlines())


@pytest.mark.parametrize(
    "stdin",
    [
        "spec: [unclosed",
        "",
        dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
        dump({"apiVersion": "other.io/v1", "kind": "NodeSet", "metadata": {"name": "x"}}),
    ],
    ids=["not-yaml", "empty", "no-nodeset", "not-slinky"],
)
def test_rule_migrate_input_it_cannot_convert_exits_1(stdin: str) -> None:
    status, out, _ = migrate(stdin)
    assert status == 1 and out == ""


def test_rule_migrate_reads_lists_and_skips_other_kinds() -> None:
    other = chart_default()
    other["metadata"]["name"] = "slurm-worker-other"
    listed = {"apiVersion": "v1", "kind": "List", "items": [chart_default(), other]}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slurm-config"}}
    status, out, err = migrate(dump(listed, config))
    assert status == 0
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out)]
    assert names == ["slurm-worker-slinky", "slurm-worker-other"]
    assert "skipped: ConfigMap slurm-config" in err


def test_rule_migrate_carries_scheduled_update_with_its_window() -> None:
    """Slinky's ScheduledUpdate is ours too: the window carried as is (duration defaulted to
    Slinky's 30m), maxUnavailable written, what differs noted; exit 0. One without a
    startTime (Slinky's CRD refuses it too) is an error."""
    slinky = chart_default()
    slinky["spec"]["updateStrategy"] = {
        "type": "ScheduledUpdate",
        "scheduledUpdate": {"startTime": "2026-12-01T02:00:00Z", "flags": ["FLEX"]},
    }
    status, out, err = migrate(dump(slinky))
    assert status == 0, err
    (converted,) = [doc for doc in yaml.safe_load_all(out) if doc]
    strategy = converted["spec"]["updateStrategy"]
    assert strategy["type"] == "ScheduledUpdate"
    assert strategy["scheduledUpdate"] == {
        "startTime": "2026-12-01T02:00:00Z",
        "duration": "30m",
        "flags": ["FLEX"],
    }
    assert validate(converted) == []
    assert "spec.updateStrategy.scheduledUpdate: inside the window" in err
    assert "maxUnavailable" in err
    slinky["spec"]["updateStrategy"] = {"type": "ScheduledUpdate", "scheduledUpdate": {}}
    status, out, err = migrate(dump(slinky))
    assert status != 0 and out == "" and "startTime" in err


def test_rule_migrate_refuses_a_recurring_scheduled_update_it_would_run_once() -> None:
    """Slinky replaces pods at every recurrence of a DAILY (WEEKLY...) reservation; our window
    is one startTime + duration: carrying the flag would silently update once. A behaviour
    change (exit 2, nothing written unless --accept-changes), naming the flag and what to do
    instead."""
    slinky = chart_default()
    slinky["spec"]["updateStrategy"] = {
        "type": "ScheduledUpdate",
        "scheduledUpdate": {"startTime": "2026-12-01T02:00:00Z", "flags": ["daily", "FLEX"]},
    }
    status, out, err = migrate(dump(slinky))
    assert status == 2 and out == ""
    assert "spec.updateStrategy.scheduledUpdate.flags" in err and "DAILY" in err
    assert "new startTime" in err
    status, out, _ = migrate(dump(slinky), "--accept-changes")
    converted = yaml.safe_load(out)
    assert status == 0 and validate(converted) == []
    assert converted["spec"]["updateStrategy"]["scheduledUpdate"]["flags"] == ["FLEX"]
