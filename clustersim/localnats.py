"""`make run`'s nats-server as the simulated cluster shows it: what an install puts in the
services' namespace for NATS, so `kubectl nodeflow` finds NATS on the local stack the way it
does in a cluster (its own port-forward to a pod behind the Service `nats`, as the operators'
user with the password of the admin Secret; nodeflow_cli.main.open_nats).

The Services are k8s/nats/service.yaml's and the pod is the first of k8s/nats/statefulset.yaml
(its labels, containers and named ports), so the CLI resolves the Service, its selector and
its `client` port exactly as on a real install. The nats-server runs on the host, not in a
simulated node: the pod's `clustersim.nodeflow.dev/port-forward` annotation maps its client
and monitor ports to the host's, and the pod has no node. Its scheduler is one nobody serves
(the emulator's default scheduler would otherwise bind it to a GPU node, where drains, budgets
and placements would count it) and the runner writes its Running status, as the kubelet of
the node it does not have would. The admin Secret is the chart's (nats-credentials.yaml) with
the password nats-server was started with.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from clustersim.cluster.podlife import running_status
from clustersim.kube.objects import Obj, now_rfc3339
from clustersim.kube.portforward import PORT_FORWARD_ANNOTATION
from clustersim.kube.store import Store
from nodeflow_cli.main import ADMIN_SECRET, ADMIN_SECRET_KEY, NATS_CLIENT_PORT, NATS_SERVICE
from nodeflow_contracts.permissions import ADMIN_USER

NATS_MANIFEST_DIR = Path(__file__).resolve().parents[1] / "k8s" / "nats"
# No scheduler serves it: the pod stands for a process on the host, not on a simulated node.
HOST_SCHEDULER = "clustersim-host"
MONITOR_PORT = "monitor"


@dataclass(frozen=True)
class LocalNats:
    """Where the host's nats-server listens and the file holding the operators' password."""

    client_url: str  # nats://host:port
    admin_password_file: Path
    monitor_url: str = ""  # http://host:port; empty: the monitor port maps nothing


def _address(url: str) -> str:
    """`host:port` of a URL that names both (ValueError otherwise)."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r} names no host and port")
    return f"{parts.hostname}:{parts.port}"


def _documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]


def nats_services(manifest_dir: Path, namespace: str) -> list[Obj]:
    """The Services of k8s/nats/service.yaml, in `namespace`."""
    services = [d for d in _documents(manifest_dir / "service.yaml") if d.get("kind") == "Service"]
    for service in services:
        service["metadata"]["namespace"] = namespace
    return services


def _container_port(containers: Sequence[Obj], name: str) -> int:
    for container in containers:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                number: int = port["containerPort"]
                return number
    raise ValueError(f"the NATS StatefulSet has no container port named {name!r}")


def nats_pod(manifest_dir: Path, namespace: str, local: LocalNats) -> Obj:
    """The StatefulSet's first pod (k8s/nats/statefulset.yaml), its client (and monitor) port
    forwarded to the host's nats-server. Only what a port-forward reads is kept of the
    template: labels, and each container's name, image and ports (its env, volumes and probes
    name objects the emulator does not hold)."""
    statefulset = next(
        d for d in _documents(manifest_dir / "statefulset.yaml") if d.get("kind") == "StatefulSet"
    )
    template = statefulset["spec"]["template"]
    containers = [
        {key: container[key] for key in ("name", "image", "ports") if key in container}
        for container in template["spec"]["containers"]
    ]
    forwards = [f"{_container_port(containers, NATS_CLIENT_PORT)}={_address(local.client_url)}"]
    if local.monitor_url:
        forwards.append(
            f"{_container_port(containers, MONITOR_PORT)}={_address(local.monitor_url)}"
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{statefulset['metadata']['name']}-0",
            "namespace": namespace,
            "labels": dict(template["metadata"]["labels"]),
            "annotations": {PORT_FORWARD_ANNOTATION: ",".join(forwards)},
        },
        "spec": {"schedulerName": HOST_SCHEDULER, "containers": containers},
    }


def admin_secret(namespace: str, password: str) -> Obj:
    """The operators' NATS Secret as the chart generates it (nats-credentials.yaml)."""

    def encoded(value: str) -> str:
        return base64.b64encode(value.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": ADMIN_SECRET,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "nats"},
        },
        "type": "Opaque",
        "data": {"user": encoded(ADMIN_USER), ADMIN_SECRET_KEY: encoded(password)},
    }


def install_local_nats(
    store: Store, local: LocalNats, namespace: str, manifest_dir: Path = NATS_MANIFEST_DIR
) -> Obj:
    """Create the Services, the Running pod behind `nats` and the admin Secret in
    `namespace`; the pod as stored."""
    services = nats_services(manifest_dir, namespace)
    if not any(s["metadata"]["name"] == NATS_SERVICE for s in services):
        raise ValueError(f"{manifest_dir / 'service.yaml'} has no Service {NATS_SERVICE}")
    for service in services:
        store.create("services", service, namespace)
    password = local.admin_password_file.read_text(encoding="utf-8").strip()
    store.create("secrets", admin_secret(namespace, password), namespace)
    pod = store.create("pods", nats_pod(manifest_dir, namespace, local), namespace)
    # Running and Ready as the kubelet writes it; its IP, where nats-server listens.
    host = urlsplit(local.client_url).hostname or ""
    now = now_rfc3339()
    pod["status"] = running_status(pod, host, host, now, now)
    stored: dict[str, Any] = store.update("pods", pod, namespace, subresource="status")
    return stored
