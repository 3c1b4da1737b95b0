"""Our deploy artifacts on the real API server: `kubectl apply --dry-run=server` of
k8s/overlays/dev, k8s/overlays/production and k8s/third-party-crds is accepted whole, with
strict field validation, and without a PodSecurity warning in the `restricted` namespace.

Client-side apply, as the README tells operators (our CRDs are already installed that way
by tools/kube/real_kube.sh, so a server-side apply would conflict with that field manager).
A server dry run runs admission and validation but persists nothing, so the namespace the
overlays install into, and the workload namespaces their Roles name, are created for real
first (the dry run of a Namespace does not make the objects in it admissible), and so are the
Prometheus operator's CRDs the production overlay's ServiceMonitors and PrometheusRules
need."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.realkube.support import REPO, kubectl

pytestmark = pytest.mark.real_kube

PROMETHEUS_CRDS = REPO / "tests/realkube/fixtures/prometheus-operator-crds.yaml"


async def rendered(kustomization: str) -> list[dict[str, Any]]:
    _, out, _ = await kubectl("kustomize", kustomization)
    return [doc for doc in yaml.safe_load_all(out) if isinstance(doc, dict)]


async def rendered_names(kustomization: str) -> set[str]:
    """`kind/name` of every object the kustomization renders, lowercased as kubectl prints."""
    return {
        f"{doc['kind'].lower()}/{doc['metadata']['name']}" for doc in await rendered(kustomization)
    }


async def create_workload_namespaces(kustomization: str) -> None:
    """The namespaces the objects live in (the production overlay's Roles go to the workload
    namespaces, e.g. `slurm`), made for real as an operator makes them before installing."""
    namespaces = {
        doc["metadata"]["namespace"]
        for doc in await rendered(kustomization)
        if doc["metadata"].get("namespace")
    }
    for namespace in sorted(namespaces):
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        await kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest))


def printed_names(out: str) -> set[str]:
    """`kind/name` of each `kind.group/name` line of `kubectl ... -o name`."""
    names = set()
    for line in out.split():
        kind_group, name = line.split("/", 1)
        names.add(f"{kind_group.split('.', 1)[0]}/{name}")
    return names


@pytest.fixture(autouse=True)
async def install_namespace_and_prometheus_crds() -> None:
    await kubectl("apply", "--server-side", "-f", str(PROMETHEUS_CRDS))
    await kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=90s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    )
    await kubectl("apply", "--server-side", "-f", str(REPO / "k8s/base/namespace.yaml"))


@pytest.mark.parametrize(
    "kustomization", ["k8s/overlays/dev", "k8s/overlays/production", "k8s/third-party-crds"]
)
async def test_server_dry_run_accepts_every_object_of_the_kustomization(
    kustomization: str,
) -> None:
    await create_workload_namespaces(kustomization)
    code, out, err = await kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "name",
        "-k",
        kustomization,
        check=False,
    )
    assert code == 0, err
    assert printed_names(out) == await rendered_names(kustomization)
    # The namespace enforces the `restricted` Pod Security Standard: a Deployment or the NATS
    # StatefulSet whose pods it would refuse is admitted with this warning, not refused.
    assert "would violate PodSecurity" not in err
    assert "unknown field" not in err


async def test_server_dry_run_persists_nothing() -> None:
    await kubectl("apply", "--dry-run=server", "-o", "name", "-k", "k8s/overlays/dev")
    code, _, err = await kubectl(
        "-n", "nodeflow-system", "get", "deployment/k8s-watcher", check=False
    )
    assert code != 0
    assert "NotFound" in err
