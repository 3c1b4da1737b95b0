"""k8s-watcher's own identity on the real API server: k8s/rbac applied as is (its
ServiceAccount, ClusterRole and binding in nodeflow-system), a token minted for that
ServiceAccount through the TokenRequest API (`kubectl create token`), and a kubeconfig that
holds only that token. Whatever k8s-watcher does with it, the API server authorizes with
exactly the RBAC we ship."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.realkube.support import REPO, admin_kubeconfig, kubectl

INSTALL_NAMESPACE = "nodeflow-system"
SERVICE_ACCOUNT = "k8s-watcher"
TOKEN_DURATION = "2h"


async def install_rbac() -> None:
    await kubectl("apply", "-f", str(REPO / "k8s/base/namespace.yaml"))
    # Namespaced by its own kustomization (nodeflow-system; its ConfigMap Role in skyhook).
    await kubectl("apply", "-k", str(REPO / "k8s/rbac"))


async def watcher_kubeconfig(directory: Path, namespace: str | None = None) -> Path:
    """A kubeconfig for the real API server that authenticates as k8s-watcher's
    ServiceAccount (a bound token from the TokenRequest API), written under `directory`:
    k8s/rbac's, installed here, or (`namespace`) one already installed there, e.g. by Helm."""
    if namespace is None:
        await install_rbac()
        namespace = INSTALL_NAMESPACE
    _, token, _ = await kubectl(
        "-n", namespace, "create", "token", SERVICE_ACCOUNT, f"--duration={TOKEN_DURATION}"
    )
    admin = yaml.safe_load(admin_kubeconfig().read_text())
    cluster = admin["clusters"][0]
    user = f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token.strip()}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }
    path = directory / "k8s-watcher.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
