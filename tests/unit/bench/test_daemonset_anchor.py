"""The DaemonSet anchor's pure parts (bench/_daemonset_anchor.py): who wrote what, from the API
server's audit log, and the ratios of a NodeSet step to the DaemonSet's (issue #36)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench._daemonset_anchor import (
    AuditLog,
    anchor_daemonset,
    audited_writes,
    client_of,
    compare,
    controller_writes_per_pod,
)
from bench.nodeset_controller import TEMPLATE, StepFigures


def event(
    user: str,
    verb: str,
    resource: str,
    *,
    subresource: str = "",
    code: int = 201,
    stage: str = "ResponseComplete",
    agent: str = "kube-controller-manager/v1.36.3",
) -> str:
    ref: dict[str, Any] = {"resource": resource, "namespace": "default"}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "stage": stage,
            "verb": verb,
            "user": {"username": user},
            "userAgent": agent,
            "objectRef": ref,
            "responseStatus": {"code": code},
        }
    )


DS = "system:serviceaccount:kube-system:daemon-set-controller"


def test_rule_a_write_is_named_after_the_client_that_sent_it() -> None:
    assert client_of({"user": {"username": DS}}) == "kube-controller-manager/daemon-set-controller"
    assert client_of({"user": {"username": "system:kube-scheduler"}}) == "kube-scheduler"
    kwok = {"user": {"username": "nodeflow-admin"}, "userAgent": "kwok/v0.8.0 (linux/amd64)"}
    assert client_of(kwok) == "kwok"
    ours = {"user": {"username": "nodeflow-admin"}, "userAgent": "Python/3.11 aiohttp/3.13"}
    assert client_of(ours) == "nodeflow-admin (Python)"


def test_rule_only_answered_accepted_writes_are_counted_with_their_subresource() -> None:
    lines = [
        event(DS, "create", "pods"),
        event(DS, "create", "pods"),
        event(DS, "create", "pods", code=409),  # refused: not a write
        event(DS, "create", "pods", stage="ResponseStarted"),  # not answered yet
        event(DS, "update", "daemonsets", subresource="status", code=200),
        event("system:kube-scheduler", "create", "pods", subresource="binding"),
        "",
    ]
    assert audited_writes(lines) == Counter(
        {
            ("kube-controller-manager/daemon-set-controller", "create", "pods"): 2,
            ("kube-controller-manager/daemon-set-controller", "update", "daemonsets/status"): 1,
            ("kube-scheduler", "create", "pods/binding"): 1,
        }
    )


def test_rule_the_daemonset_controllers_writes_per_pod_leave_the_other_clients_out() -> None:
    audited = audited_writes(
        [event(DS, "create", "pods")] * 4
        + [event(DS, "create", "events")] * 2
        + [event("system:kube-scheduler", "create", "pods", subresource="binding")] * 4
    )
    assert controller_writes_per_pod(audited, 4) == pytest.approx(1.5)


def test_the_audit_log_is_read_from_where_it_stopped_and_a_half_written_line_waits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    assert log.take() == Counter()  # not written yet
    first = event(DS, "create", "pods")
    path.write_text(first + "\n" + first[:20])
    assert sum(log.take().values()) == 1
    with path.open("a") as more:
        more.write(first[20:] + "\n")
    assert sum(log.take().values()) == 1
    assert log.take() == Counter()


def test_rule_a_nodeset_step_reads_as_ratios_to_the_daemonset_step() -> None:
    nodeset = StepFigures(
        0,
        4000,
        120.0,
        {
            "k8s-watcher": 28.0,
            "nodeset-controller": 20.0,
            "slurm-syncer": 8.0,
            "nats-server": 12.0,
            "kube-apiserver": 100.0,
        },
        Counter(
            {("nodeset-controller", "create", "Pod"): 4000, ("slurm-syncer", "patch", "Pod"): 4000}
        ),
    )
    daemonset = StepFigures(
        0, 4000, 60.0, {"kube-controller-manager": 27.0, "kube-apiserver": 80.0}, Counter()
    )
    comparison = compare(nodeset, daemonset, 1.25)
    assert comparison.rate_ratio == pytest.approx(0.5)
    assert comparison.our_cpu_ms == pytest.approx(17.0)
    assert comparison.controller_cpu_ms == pytest.approx(6.75)
    assert comparison.cpu_ratio == pytest.approx(17.0 / 6.75)
    assert comparison.all_cpu_ms == pytest.approx((42.0, 26.75))
    assert comparison.our_writes == pytest.approx(2.0)
    assert comparison.controller_writes == 1.25


def test_the_anchor_runs_the_nodeset_pod_on_every_node() -> None:
    daemonset = anchor_daemonset()
    template = daemonset["spec"]["template"]
    assert template["spec"]["containers"] == TEMPLATE["spec"]["containers"]
    assert template["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert "nodeSelector" not in template["spec"]
    assert daemonset["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
    assert "tolerations" not in TEMPLATE["spec"]  # the NodeSet's template is left as it was
