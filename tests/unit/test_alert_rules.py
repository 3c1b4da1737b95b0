"""The alert rules, checked and run by Prometheus' own promtool: each expression parses, and
each alert fires on the series that mean trouble, with its labels and runbook, and stays quiet
on those that do not (`promtool test rules` over synthetic series).

The rules are the PrometheusRule's groups (the chart's file; the production overlay carries
the same file, see test_manifests)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeflow_contracts.permissions import SERVICES
from tests.fixtures.tools import built_tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "nodeflow" / "files" / "prometheus-rules.yaml"
OVERLAY_RULES = ROOT / "k8s" / "overlays" / "production" / "prometheusrules.yaml"
LABEL_REFERENCE = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def promtool() -> str:
    """promtool: PROMTOOL, .tools/bin/promtool (`make tools`), or promtool on PATH."""
    return built_tool("promtool", "make tools runs tools/prometheus/build_promtool.sh")


def rules() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": yaml.safe_load(RULES.read_text())["spec"]["groups"]}))
    return path


def up_of_every_service(but: str = "") -> dict[str, str]:
    return {
        f'up{{job="{service}", pod="{service}-0"}}': "1x20"
        for service in SERVICES
        if service != but
    }


@dataclass(frozen=True)
class Case:
    """Series (selector -> promtool values), when to evaluate, and the label sets expected to
    fire (the rule's own labels and annotations are added from the rule)."""

    name: str
    alert: str
    series: dict[str, str]
    eval_time: str
    fired: tuple[dict[str, str], ...] = field(default=())


CASES = (
    Case(
        "a service whose every replica is down",
        "NodeflowServiceDown",
        {
            **up_of_every_service(but="slurm-syncer"),
            'up{job="slurm-syncer", pod="slurm-syncer-0"}': "0x20",
            'up{job="slurm-syncer", pod="slurm-syncer-1"}': "0x20",
        },
        "6m",
        ({"job": "slurm-syncer"},),
    ),
    Case(
        "one replica of two down is not a service down",
        "NodeflowServiceDown",
        {
            **up_of_every_service(but="slurm-syncer"),
            'up{job="slurm-syncer", pod="slurm-syncer-0"}': "0x20",
            'up{job="slurm-syncer", pod="slurm-syncer-1"}': "1x20",
        },
        "10m",
    ),
    Case(
        "a service down for less than five minutes",
        "NodeflowServiceDown",
        {**up_of_every_service(but="k8s-watcher"), 'up{job="k8s-watcher", pod="w"}': "1x5 0x20"},
        "9m",
    ),
    Case(
        "a service that is not scraped at all",
        "NodeflowServiceDown",
        up_of_every_service(but="metrics-exporter"),
        "6m",
        ({"job": "metrics-exporter"},),
    ),
    Case(
        "no replica leads a lease",
        "NodeflowNoLeader",
        {
            'nodeflow_bus_lease_is_leader{lease="nodeset-controller", pod="a"}': "0x5",
            'nodeflow_bus_lease_is_leader{lease="nodeset-controller", pod="b"}': "0x5",
            'nodeflow_bus_lease_is_leader{lease="topology-placer", pod="a"}': "1x5",
            'nodeflow_bus_lease_is_leader{lease="topology-placer", pod="b"}': "0x5",
        },
        "2m",
        ({"lease": "nodeset-controller"},),
    ),
    Case(
        "a leader change within a minute",
        "NodeflowNoLeader",
        {
            'nodeflow_bus_lease_is_leader{lease="slurm-syncer", pod="a"}': "1 0 0 0 0",
            'nodeflow_bus_lease_is_leader{lease="slurm-syncer", pod="b"}': "0 0 1 1 1",
        },
        "3m",
    ),
    Case(
        "a replica without NATS",
        "NodeflowNatsDisconnected",
        {
            'nodeflow_bus_connected{job="topology-placer", pod="p-0"}': "0x5",
            'nodeflow_bus_connected{job="topology-placer", pod="p-1"}': "1x5",
        },
        "3m",
        ({"job": "topology-placer", "pod": "p-0"},),
    ),
    Case(
        "JetStream's API does not answer",
        "NodeflowJetStreamUnhealthy",
        {
            'nodeflow_jetstream_api_up{pod="m-0"}': "0x5",
            'nodeflow_jetstream_api_up{pod="m-1"}': "0x5",
            'nodeflow_jetstream_stream_leader{pod="m-0", stream="DECISIONS"}': "1x5",
        },
        "3m",
        ({},),
    ),
    Case(
        "a stream without a leader",
        "NodeflowJetStreamUnhealthy",
        {
            'nodeflow_jetstream_api_up{pod="m-0"}': "1x5",
            'nodeflow_jetstream_stream_leader{pod="m-0", stream="K8S_COMMANDS"}': "0x5",
            'nodeflow_jetstream_stream_leader{pod="m-1", stream="K8S_COMMANDS"}': "0x5",
            'nodeflow_jetstream_stream_leader{pod="m-0", stream="DECISIONS"}': "1x5",
        },
        "3m",
        ({"stream": "K8S_COMMANDS"},),
    ),
    Case(
        "one exporter replica cut off while the other reads JetStream healthy",
        "NodeflowJetStreamUnhealthy",
        {
            'nodeflow_jetstream_api_up{pod="m-0"}': "0x5",
            'nodeflow_jetstream_api_up{pod="m-1"}': "1x5",
            'nodeflow_jetstream_stream_leader{pod="m-0", stream="DECISIONS"}': "0x5",
            'nodeflow_jetstream_stream_leader{pod="m-1", stream="DECISIONS"}': "1x5",
        },
        "3m",
    ),
    Case(
        "a stream with a replica behind for ten minutes",
        "NodeflowJetStreamReplicasBehind",
        {
            'nodeflow_jetstream_stream_replicas_current{pod="m-0", stream="KV_leases"}': "2x15",
            'nodeflow_jetstream_stream_replicas_desired{pod="m-0", stream="KV_leases"}': "3x15",
            'nodeflow_jetstream_stream_replicas_current{pod="m-0", stream="DECISIONS"}': "3x15",
            'nodeflow_jetstream_stream_replicas_desired{pod="m-0", stream="DECISIONS"}': "3x15",
        },
        "11m",
        ({"stream": "KV_leases"},),
    ),
    Case(
        "a Slurm cluster not read for over five minutes",
        "NodeflowSlurmPollStale",
        {
            'nodeflow_slurm_last_successful_poll_age_seconds{cluster="main"}': "290+60x12",
            'nodeflow_slurm_last_successful_poll_age_seconds{cluster="lab"}': "10x12",
        },
        "7m",
        ({"cluster": "main"},),
    ),
    Case(
        "a rollout that made no progress for an hour",
        "NodeflowRolloutStopped",
        {
            'kube_sunk_nodeset_up_to_date{namespace="slurm", nodeset="gpu"}': "3x150",
            'kube_sunk_nodeset_desired{namespace="slurm", nodeset="gpu"}': "8x150",
            'kube_sunk_nodeset_up_to_date{namespace="slurm", nodeset="cpu"}': "0+1x150",
            'kube_sunk_nodeset_desired{namespace="slurm", nodeset="cpu"}': "200x150",
        },
        "2h30m",
        ({"namespace": "slurm", "nodeset": "gpu"},),
    ),
    Case(
        "dead letters keep coming",
        "NodeflowDeadLettersGrowing",
        {'nodeflow_bus_dead_lettered_total{job="k8s-watcher", pod="w"}': "0 1 2 3 4 5"},
        "5m",
        ({"job": "k8s-watcher", "pod": "w"},),
    ),
)


def expected(alert: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    def render(text: str) -> str:
        return LABEL_REFERENCE.sub(lambda match: labels.get(match.group(1), ""), text)

    return {
        "exp_labels": {**labels, **alert.get("labels", {})},
        "exp_annotations": {key: render(value) for key, value in alert["annotations"].items()},
    }


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_rule_the_alert_fires_exactly_on_the_series_that_mean_trouble(
    case: Case, rule_file: Path, tmp_path: Path
) -> None:
    alert = rules()[case.alert]
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series, "values": values} for series, values in case.series.items()
                ],
                "alert_rule_test": [
                    {
                        "eval_time": case.eval_time,
                        "alertname": case.alert,
                        "exp_alerts": [expected(alert, labels) for labels in case.fired],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_rule_parses_and_the_overlay_carries_the_same_rules(rule_file: Path) -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load(OVERLAY_RULES.read_text()) == yaml.safe_load(RULES.read_text())


def test_every_new_operational_alert_has_a_case() -> None:
    """The alerts of a service down, no leader, NATS and JetStream trouble are run above."""
    covered = {case.alert for case in CASES}
    assert (
        {
            "NodeflowServiceDown",
            "NodeflowNoLeader",
            "NodeflowNatsDisconnected",
            "NodeflowJetStreamUnhealthy",
            "NodeflowJetStreamReplicasBehind",
        }
        <= covered
        <= set(rules())
    )
