"""kubectl end to end: get/describe/create/apply/patch/scale/delete/cordon/drain/get -w.

These need a kubectl binary.  Without one they skip locally but FAIL under CI=true (the CI
script installs kubernetes-client), so a missing tool can never pass silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.k8s.conftest import Kube
from tests.conformance.k8s.test_k8s_crd import widget_crd

KUBECTL = shutil.which("kubectl")


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


async def kubectl(kube: Kube, *args: str, stdin: str | None = None, check: bool = True) -> str:
    assert KUBECTL is not None
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={kube.kubeconfig}",
        f"--namespace={kube.namespace}",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECACHEDIR": str(kube.kubeconfig.parent / "cache")},
    )
    out, err = await asyncio.wait_for(
        proc.communicate(stdin.encode() if stdin is not None else None), 60
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode()}{out.decode()}")
    return out.decode() + ("" if check else err.decode())


def write(tmp: Path, name: str, docs: list[dict[str, Any]]) -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {"containers": [{"name": "main", "image": "nginx"}]},
}


async def test_kubectl_create_get_describe_delete_pod(kube: Kube, tmp_path: Path) -> None:
    manifest = write(tmp_path, "pod.yaml", [POD])
    assert "pod/web created" in await kubectl(kube, "create", "-f", str(manifest))
    table = await kubectl(kube, "get", "pods")
    header, row = table.strip().splitlines()[:2]
    assert header.split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:3] == ["web", "0/1", "Pending"]
    as_json = json.loads(await kubectl(kube, "get", "pod", "web", "-o", "json"))
    assert as_json["metadata"]["labels"] == {"app": "web"}
    described = await kubectl(kube, "describe", "pod", "web")
    assert "Name:" in described and "web" in described and "nginx" in described
    assert "deleted" in await kubectl(kube, "delete", "pod", "web")
    assert "No resources found" in await kubectl(kube, "get", "pods", check=False)


async def test_kubectl_create_generators_send_protobuf_bodies(kube: Kube) -> None:
    # kubectl's typed clients encode built-in kinds as protobuf (client-go >= 1.31).
    ns = kube.unique("gen")
    assert f"namespace/{ns} created" in await kubectl(kube, "create", "namespace", ns)
    try:
        stored_ns = await kube.core.read_namespace(ns)
        assert stored_ns.status.phase == "Active"
        out = await kubectl(
            kube, "create", "configmap", "lit", "--from-literal=a=b", "--from-literal=empty="
        )
        assert "configmap/lit created" in out
        stored = await kube.core.read_namespaced_config_map("lit", kube.namespace)
        assert stored.data == {"a": "b", "empty": ""}
        listed = await kubectl(kube, "get", "namespace", ns, "--no-headers")
        assert listed.split()[:2] == [ns, "Active"]
        assert re.fullmatch(r"\d+s", listed.split()[2]), listed
    finally:
        await kubectl(kube, "delete", "namespace", ns, "--wait=false", check=False)


async def test_kubectl_apply_creates_then_configures(kube: Kube, tmp_path: Path) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"a": "1", "b": "2"},
    }
    manifest = write(tmp_path, "cm.yaml", [cm])
    assert "created" in await kubectl(kube, "apply", "-f", str(manifest))
    cm["data"] = {"a": "10"}
    manifest = write(tmp_path, "cm.yaml", [cm])
    assert "configured" in await kubectl(kube, "apply", "-f", str(manifest))
    stored = await kube.core.read_namespaced_config_map("cfg", kube.namespace)
    assert stored.data == {"a": "10"}
    assert "unchanged" in await kubectl(kube, "apply", "-f", str(manifest))


async def test_kubectl_patch_and_label(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "pt"}})
    await kubectl(kube, "patch", "configmap", "pt", "--type=merge", "-p", '{"data":{"k":"v"}}')
    await kubectl(kube, "label", "configmap", "pt", "tier=web")
    out = await kubectl(kube, "get", "configmaps", "-l", "tier=web", "-o", "name")
    assert out.strip() == "configmap/pt"
    stored = await kube.core.read_namespaced_config_map("pt", kube.namespace)
    assert stored.data == {"k": "v"}


async def test_kubectl_crd_get_with_printer_columns_and_scale(kube: Kube, tmp_path: Path) -> None:
    group = kube.unique("k").replace("-", "") + ".example.com"
    crd_path = write(tmp_path, "crd.yaml", [widget_crd(group)])
    await kubectl(kube, "apply", "-f", str(crd_path))
    obj = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": "large", "replicas": 2},
    }
    try:
        for _ in range(50):
            out = await kubectl(
                kube, "apply", "-f", str(write(tmp_path, "w.yaml", [obj])), check=False
            )
            if "created" in out:
                break
            await asyncio.sleep(0.2)
        table = await kubectl(kube, "get", f"widgets.{group}")
        header, row = table.strip().splitlines()[:2]
        assert header.split()[:4] == ["NAME", "SIZE", "REPLICAS", "AGE"]
        assert row.split()[:3] == ["w1", "large", "2"]
        assert re.fullmatch(r"\d+s", row.split()[3]), row  # a human duration, not a timestamp
        await kubectl(kube, "scale", f"widgets.{group}/w1", "--replicas=4")
        scaled = await kube.custom.get_namespaced_custom_object(
            group, "v1", kube.namespace, "widgets", "w1"
        )
        assert scaled["spec"]["replicas"] == 4
        bad = dict(obj, metadata={"name": "w2"}, spec={"size": "huge"})
        out = await kubectl(
            kube, "apply", "-f", str(write(tmp_path, "bad.yaml", [bad])), check=False
        )
        assert "spec.size" in out and "Unsupported value" in out
    finally:
        await kubectl(kube, "delete", "crd", f"widgets.{group}", check=False)


@contextlib.asynccontextmanager
async def fake_kubelet(kube: Kube) -> AsyncIterator[None]:
    """Finish graceful pod deletions the way a kubelet would (delete with grace 0)."""

    async def loop() -> None:
        while True:
            pods = await kube.core.list_pod_for_all_namespaces()
            for p in pods.items:
                if p.metadata.deletion_timestamp is not None:
                    with contextlib.suppress(Exception):
                        await kube.core.delete_namespaced_pod(
                            p.metadata.name, p.metadata.namespace, grace_period_seconds=0
                        )
            await asyncio.sleep(0.1)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_kubectl_cordon_uncordon_and_drain(kube: Kube) -> None:
    node = kube.unique("node")
    await kube.core.create_node({"metadata": {"name": node}})
    try:
        for i in range(2):
            body = {
                **POD,
                "metadata": {"name": f"d{i}", "labels": {"app": "d"}},
                "spec": {**POD["spec"], "nodeName": node},
            }
            await kube.core.create_namespaced_pod(kube.namespace, body)
        assert "cordoned" in await kubectl(kube, "cordon", node)
        assert (await kube.core.read_node(node)).spec.unschedulable is True
        nodes = await kubectl(kube, "get", "node", node)
        assert "SchedulingDisabled" in nodes
        assert "uncordoned" in await kubectl(kube, "uncordon", node)
        assert not (await kube.core.read_node(node)).spec.unschedulable
        async with fake_kubelet(kube):
            out = await kubectl(
                kube, "drain", node, "--force", "--ignore-daemonsets", "--timeout=30s"
            )
        assert "drained" in out
        remaining = await kube.core.list_namespaced_pod(
            kube.namespace, field_selector=f"spec.nodeName={node}"
        )
        assert remaining.items == []
        assert (await kube.core.read_node(node)).spec.unschedulable is True
    finally:
        await kube.core.delete_node(node)


async def test_kubectl_get_watch_streams_changes(kube: Kube) -> None:
    assert KUBECTL is not None
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={kube.kubeconfig}",
        f"--namespace={kube.namespace}",
        "get",
        "configmaps",
        "-w",
        "--request-timeout=0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECACHEDIR": str(kube.kubeconfig.parent / "cache")},
    )
    assert proc.stdout is not None
    try:
        await asyncio.sleep(1.0)
        await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": "watched"}}
        )
        seen = ""
        async with asyncio.timeout(10):
            while "watched" not in seen:
                line = await proc.stdout.readline()
                if not line:
                    break
                seen += line.decode()
        assert "watched" in seen
    finally:
        proc.kill()
        await proc.wait()
