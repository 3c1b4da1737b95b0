"""The Helm chart on the real API server: what `helm template` renders with the production-like
values (our CRDs and the third-party ones, NATS with TLS, Slurm over HTTPS, RBAC scoped to a
command namespace, NetworkPolicies) passes `kubectl apply --dry-run=server`, and its pods pass
the API server's own `restricted` Pod Security admission.

The ServiceMonitors and PrometheusRules are disabled in the values here: the Prometheus
operator's CRDs are not installed on this control plane (tests/unit/test_helm_chart.py holds
those objects equal to the production overlay's)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.realkube.conftest import KUBECONFIG_ENV
from tests.unit.test_helm_chart import CHART, PRODUCTION_VALUES, RELEASE, helm, values_args

pytestmark = pytest.mark.real_kube


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={os.environ[KUBECONFIG_ENV]}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    """The release namespace, enforcing the `restricted` Pod Security Standard as the chart's
    own Namespace does, and a namespace k8s-watcher may run pods in."""
    suffix = secrets.token_hex(3)
    release, workloads = f"helm-release-{suffix}", f"helm-workloads-{suffix}"
    for namespace in (release, workloads):
        assert kubectl("create", "namespace", namespace).returncode == 0
    labelled = kubectl(
        "label", "namespace", release, "pod-security.kubernetes.io/enforce=restricted"
    )
    assert labelled.returncode == 0, labelled.stderr
    try:
        yield release, workloads
    finally:
        for namespace in (release, workloads):
            kubectl("delete", "namespace", namespace, "--wait=false")


def rendered(namespace: str, settings: dict[str, Any]) -> str:
    result = subprocess.run(
        [
            helm(),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--include-crds",
            *values_args((PRODUCTION_VALUES,), settings),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def dry_run(manifests: str) -> subprocess.CompletedProcess[str]:
    # Server-side: the CRDs are too large for client-side apply's last-applied annotation.
    return kubectl(
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "--field-manager=nodeflow-helm-test",
        "-f",
        "-",
        stdin=manifests,
    )


def production_settings(workloads: str) -> dict[str, Any]:
    return {
        "k8sWatcher.commandNamespaces": [workloads],
        "monitoring.serviceMonitor.enabled": False,
        "monitoring.prometheusRules.enabled": False,
    }


def test_rendered_chart_passes_a_server_side_dry_run(namespaces: tuple[str, str]) -> None:
    release, workloads = namespaces
    manifests = rendered(release, production_settings(workloads))
    objects = [doc for doc in yaml.safe_load_all(manifests) if doc]
    kinds = {obj["kind"] for obj in objects}
    assert {"CustomResourceDefinition", "Deployment", "StatefulSet", "Role"} <= kinds
    assert {"NetworkPolicy", "PodDisruptionBudget", "Namespace"} <= kinds
    result = dry_run(manifests)
    assert result.returncode == 0, result.stderr
    accepted = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), result.stdout
    # The release namespace enforces `restricted`: the API server warns for any pod template
    # that would be refused.
    assert "would violate PodSecurity" not in result.stderr, result.stderr


def test_server_side_dry_run_refuses_what_the_api_server_refuses(
    namespaces: tuple[str, str],
) -> None:
    release, workloads = namespaces
    # The chart's schema leaves a resource quantity's format to the API server, which refuses
    # this one (nats.storage.size has a pattern of its own: the store limit is derived from it).
    settings = production_settings(workloads) | {"nats.resources.requests.cpu": "lots"}
    result = dry_run(rendered(release, settings))
    assert result.returncode != 0
    assert "quantities must match the regular expression" in result.stderr
