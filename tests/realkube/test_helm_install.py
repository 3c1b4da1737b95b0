"""`helm install --wait` and `helm upgrade --wait` of charts/nodeflow on the real control plane,
with the default values and with ci/production-values.yaml, following docs/helm.md: the default
values in one pass (`--create-namespace`, the NATS credentials generated), the production ones
after the documented pre-step (namespace, its Pod Security label and the Secrets the values
name), the CRDs applied server-side before the upgrade. KWOK makes the pods Ready (no image
runs); the NATS volumes are static PersistentVolumes of a class without a provisioner.

With the production release in place, the services run as processes against the same API
server (as `make run KUBE=real`), k8s-watcher authenticated as the release's ServiceAccount
with the release's RBAC and COMMAND_NAMESPACES, and every file of k8s/examples/ is applied as
is: each takes effect (the NodeSet's pods created, the NodeMaintenance Ready, the gang bound,
the Skyhook and ClusterNetworkTopology given a status by the services). `helm uninstall`
leaves the CRDs and the custom resources.

The release's RBAC names are the kustomize deploy's (ClusterRole and binding
`nodeflow-k8s-watcher`, the Role and binding `nodeflow-k8s-watcher-skyhook` in `skyhook`):
k8s/rbac's copies, which other tests apply with kubectl, are removed first (those tests
apply them again), and the two releases run one after the other."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.chaos_support import Recorder, Stack, condition, recording
from tests.realkube.stack import real_stack, remove_nodeset
from tests.realkube.support import REPO, STEP_TIMEOUT, admin_kubeconfig, kubectl, until
from tests.realkube.watcher_identity import watcher_kubeconfig
from tests.unit.test_helm_chart import CHART, PRODUCTION_VALUES, RELEASE, helm, values_args

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(1200)]

EXAMPLES = REPO / "k8s" / "examples"
STORAGE_CLASS = "nodeflow-helm-static"
OPERATOR_NAMESPACE = "nodeflow-system"  # k8s/examples/maintenanceoperatorconfig.yaml's
EXAMPLE_NODE = "gpu-003"  # k8s/examples/nodemaintenance.yaml's
# The Prometheus operator's CRDs are not on this control plane (the unit tests render those).
NO_PROMETHEUS = {
    "monitoring.serviceMonitor.enabled": False,
    "monitoring.prometheusRules.enabled": False,
}
# k8s/rbac's objects of fixed names the chart makes too: the ClusterRole and its binding, and
# the Role on ConfigMaps (and its binding) in the Skyhook namespace.
FIXED_NAMES = (
    ("clusterrole/nodeflow-k8s-watcher",),
    ("clusterrolebinding/nodeflow-k8s-watcher",),
    ("role/nodeflow-k8s-watcher-skyhook", "-n", "skyhook"),
    ("rolebinding/nodeflow-k8s-watcher-skyhook", "-n", "skyhook"),
)
THIRD_PARTY_CRDS = (
    "nodemaintenances.maintenance.nvidia.com",
    "skyhooks.skyhook.nvidia.com",
    "podgroups.scheduling.sigs.k8s.io",
    "clusternetworktopologies.scheduling.koordinator.sh",
)


async def run_helm(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        helm(),
        f"--kubeconfig={admin_kubeconfig()}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    out, err = await asyncio.wait_for(process.communicate(), 600)
    assert process.returncode == 0, f"helm {' '.join(args[:2])}: {err.decode()}"
    return out.decode()


async def get_json(*args: str) -> Any:
    _, out, _ = await kubectl("get", *args, "-o", "json")
    return json.loads(out)


async def apply(manifest: Any) -> None:
    await kubectl("apply", "-f", "-", stdin=json.dumps(manifest))


@contextlib.asynccontextmanager
async def static_volumes(namespace: str, count: int, size: str) -> AsyncIterator[None]:
    """`count` PersistentVolumes of a class without a provisioner for the NATS claims of the
    release in `namespace`; deleted at the end (the claims go with the namespace)."""
    await apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Retain",
        }
    )
    names = [f"{namespace}-nats-{index}" for index in range(count)]
    for name in names:
        await apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "hostPath": {"path": f"/var/tmp/{name}"},
                },
            }
        )
    try:
        yield
    finally:
        await kubectl("delete", "pv", *names, "--wait=false", "--ignore-not-found", check=False)


async def free_fixed_names() -> None:
    """Remove k8s/rbac's ClusterRole, Role and bindings unless a Helm release owns them."""
    for name in FIXED_NAMES:
        code, out, _ = await kubectl("get", *name, "-o", "json", check=False)
        if code != 0:
            continue
        labels = json.loads(out)["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "Helm":
            await kubectl("delete", *name)


async def delete_namespace(namespace: str) -> None:
    await kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


async def ready_workloads(namespace: str) -> dict[str, int]:
    """Ready replicas of each Deployment and StatefulSet, as `helm --wait` left them."""
    found = await get_json("deployments,statefulsets", "-n", namespace)
    return {
        f"{item['kind']}/{item['metadata']['name']}": item["status"].get("readyReplicas", 0)
        for item in found["items"]
    }


def container_env(deployment: Any) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


async def assert_crds_and_custom_resources_survive_uninstall(namespace: str) -> None:
    """A NodeSet created while the release ran (no service running: no finalizer) and every
    CRD are still there after `helm uninstall`."""
    name = f"kept-{secrets.token_hex(3)}"
    await apply(
        {
            "apiVersion": "nodeflow.dev/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "replicas": 0,
                "slurmCluster": "sim",
                "template": {"spec": {"containers": [{"name": "slurmd", "image": "slurmd"}]}},
            },
        }
    )
    try:
        await run_helm("uninstall", RELEASE, "-n", namespace, "--wait")
        await get_json("nodeset", name, "-n", "default")
        for crd in ("nodesets.nodeflow.dev", "nodeslices.nodeflow.dev", *THIRD_PARTY_CRDS):
            await get_json("crd", crd)
    finally:
        await kubectl("delete", "nodeset", name, "-n", "default", "--ignore-not-found")


async def test_default_values_install_and_upgrade_in_one_pass() -> None:
    namespace = f"nodeflow-helm-defaults-{secrets.token_hex(2)}"
    await free_fixed_names()
    storage = {"nats.storage.storageClassName": STORAGE_CLASS}
    try:
        async with static_volumes(namespace, 3, "20Gi"):
            # One pass: Helm creates the namespace, the chart the NATS users' Secrets.
            await run_helm(
                "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
                "--wait", "--timeout=5m", *values_args((), storage),
            )  # fmt: skip
            ready = await ready_workloads(namespace)
            assert ready == {
                "Deployment/k8s-watcher": 2,
                "Deployment/slurm-syncer": 2,
                "Deployment/nodeset-controller": 2,
                "Deployment/maintenance-scheduler": 2,
                "Deployment/topology-placer": 2,
                "Deployment/metrics-exporter": 1,
                "StatefulSet/nats": 3,
            }
            generated = await get_json("secret", "nodeflow-admin-nats", "-n", namespace)
            password = generated["data"]["password"]
            # An upgrade with a setting for one service: its pods roll, the passwords stay.
            await run_helm(
                "upgrade", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout=5m",
                *values_args((), storage | {"services.k8s-watcher.env": {"KUBE_QPS": 100}}),
            )  # fmt: skip
            watcher = await get_json("deployment", "k8s-watcher", "-n", namespace)
            assert container_env(watcher)["KUBE_QPS"] == "100"
            assert watcher["status"]["updatedReplicas"] == watcher["status"]["readyReplicas"] == 2
            again = await get_json("secret", "nodeflow-admin-nats", "-n", namespace)
            assert again["data"]["password"] == password
            history = json.loads(await run_helm("history", RELEASE, "-n", namespace, "-o", "json"))
            assert [h["status"] for h in history] == ["superseded", "deployed"]
            await assert_crds_and_custom_resources_survive_uninstall(namespace)
            # The namespace is not the release's: it stays.
            await get_json("namespace", namespace)
    finally:
        await run_helm_quietly("uninstall", RELEASE, "-n", namespace)
        await delete_namespace(namespace)


async def run_helm_quietly(*args: str) -> None:
    with contextlib.suppress(AssertionError):
        await run_helm(*args)


async def production_pre_step(namespace: str, tmp_path: Path) -> None:
    """docs/helm.md, "Install", with Secrets of yours: the namespace, its label, the Secrets."""
    await kubectl("create", "namespace", namespace)
    await kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(secrets.token_bytes(32))
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    values = yaml.safe_load(PRODUCTION_VALUES.read_text())
    (cluster,) = values["slurm"]["clusters"]
    await kubectl(
        "-n", namespace, "create", "secret", "generic", cluster["jwtKeySecret"],
        f"--from-file=jwt_hs256.key={key}",
    )  # fmt: skip
    await kubectl(
        "-n", namespace, "create", "secret", "generic", cluster["caSecret"],
        f"--from-file=ca.crt={ca}",
    )  # fmt: skip
    await kubectl(
        "-n", namespace, "create", "secret", "generic", values["nats"]["tls"]["secretName"],
        f"--from-file=ca.crt={ca}", f"--from-file=tls.crt={ca}", f"--from-file=tls.key={key}",
    )  # fmt: skip


def gang_bound(recorder: Recorder) -> bool:
    members = recorder.gang_members("train")
    return len(members) == 4 and all((p.get("spec") or {}).get("nodeName") for p in members)


async def status_of(kind: str, name: str, namespace: str | None = None) -> Any:
    scope = ["-n", namespace] if namespace else []
    code, out, _ = await kubectl("get", kind, name, *scope, "-o", "json", check=False)
    return (json.loads(out).get("status") or None) if code == 0 else None


async def examples_take_effect(recorder: Recorder) -> None:
    """Each file of k8s/examples/ applied as is, and its effect seen before the next: the
    Skyhook and the NodeWright last (the Skyhook's reboot interrupt drains a node at a time,
    which would race the others)."""

    async def nodeset_pods_created() -> bool:
        return len(recorder.live_pods("gpu")) == 4

    async def maintenance_ready() -> bool:
        got = await status_of(
            "nodemaintenances.maintenance.nvidia.com", "gpu-003-firmware", "default"
        )
        return (condition({"status": got or {}}, "Ready") or {}).get("status") == "True"

    async def cordoned() -> bool:
        return bool(recorder.nodes[EXAMPLE_NODE]["spec"].get("unschedulable"))

    async def bound() -> bool:
        return gang_bound(recorder)

    async def operator_config_seen() -> bool:
        return recorder.operator_config is not None

    async def topology_status() -> Any:
        return await status_of("clusternetworktopologies.scheduling.koordinator.sh", "default")

    async def skyhook_status() -> Any:
        return ((await status_of("skyhooks.skyhook.nvidia.com", "gpu-init")) or {}).get("status")

    async def nodewright_status() -> Any:
        found = await status_of("nodewrights.nodewright.nvidia.com", "nodewright-sample")
        return (found or {}).get("status")

    steps: list[tuple[str, list[tuple[Callable[[], Awaitable[Any]], str]]]] = [
        ("maintenanceoperatorconfig.yaml", [(operator_config_seen, "the config watched")]),
        ("clusternetworktopology.yaml", [(topology_status, "the topology given a status")]),
        ("nodeset.yaml", [(nodeset_pods_created, "the NodeSet gpu's four pods created")]),
        (
            "nodemaintenance.yaml",
            [(maintenance_ready, "gpu-003-firmware Ready"), (cordoned, "gpu-003 cordoned")],
        ),
        ("gang.yaml", [(bound, "the gang train bound, all four")]),
        ("skyhook.yaml", [(skyhook_status, "Skyhook gpu-init given a status")]),
        ("nodewright.yaml", [(nodewright_status, "NodeWright nodewright-sample given a status")]),
    ]
    assert {name for name, _ in steps} == {p.name for p in EXAMPLES.glob("*.yaml")}
    for name, checks in steps:
        await kubectl("apply", "-f", str(EXAMPLES / name))
        for check, what in checks:
            await until(check, f"{name}: {what}", STEP_TIMEOUT * 2)


async def remove_examples(recorder: Recorder, stack: Stack) -> None:
    """Everything k8s/examples/ made, gone while the services run (finalizers, safe
    deletion of the NodeSet's pods)."""
    # The Skyhook and the NodeWright first: their rollouts stop taking nodes.
    for name in ("skyhook.yaml", "nodewright.yaml", "gang.yaml", "nodemaintenance.yaml"):
        await kubectl(
            "delete", "-f", str(EXAMPLES / name), "--ignore-not-found", "--timeout=180s",
            check=False,
        )  # fmt: skip
    await remove_nodeset(stack, recorder, "gpu")
    await kubectl(
        "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=180s", check=False
    )

    async def gone() -> bool:
        return (
            not recorder.maintenances
            and not recorder.gang_members("train")
            and not recorder.nodes[EXAMPLE_NODE]["spec"].get("unschedulable")
        )

    await until(gone, "every example object gone", STEP_TIMEOUT * 2)


async def test_production_values_after_the_pre_step_and_the_examples_take_effect(
    tmp_path: Path,
) -> None:
    namespace = f"nodeflow-helm-{secrets.token_hex(2)}"
    await free_fixed_names()
    settings: dict[str, Any] = NO_PROMETHEUS | {"nats.storage.storageClassName": STORAGE_CLASS}
    try:
        async with static_volumes(namespace, 3, "20Gi"):
            await production_pre_step(namespace, tmp_path)
            await run_helm(
                "install", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout=5m",
                *values_args((PRODUCTION_VALUES,), settings),
            )  # fmt: skip
            assert set((await ready_workloads(namespace)).values()) >= {2, 3}
            # The control plane is off the GPU nodes (production values' node affinity).
            pods = await get_json("pods", "-n", namespace)
            gpu_nodes = {
                n["metadata"]["name"]
                for n in (await get_json("nodes"))["items"]
                if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"
            }
            placed = {p["spec"].get("nodeName") for p in pods["items"]}
            assert gpu_nodes and placed and not placed & gpu_nodes, placed
            for pod in pods["items"]:
                assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
            # The third-party CRDs were there already (their operators' here): left alone.
            for crd in THIRD_PARTY_CRDS:
                annotations = (await get_json("crd", crd))["metadata"].get("annotations") or {}
                assert "meta.helm.sh/release-name" not in annotations, crd
            # docs/helm.md, "Upgrades": the CRDs server-side, then the upgrade.
            await kubectl(
                "apply", "--server-side", "--force-conflicts", "--field-manager=nodeflow",
                "-f", str(CHART / "crds"),
            )  # fmt: skip
            upgraded = settings | {
                "operator.config.operator.nodeSet.forceScalingDeleteUnknownConditionTimeout": "1h"
            }
            await run_helm(
                "upgrade", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout=5m",
                *values_args((PRODUCTION_VALUES,), upgraded),
            )  # fmt: skip
            controller = await get_json("deployment", "nodeset-controller", "-n", namespace)
            env = container_env(controller)
            assert env["FORCE_SCALING_DELETE_UNKNOWN_CONDITION_TIMEOUT"] == "3600"
            watcher = await get_json("deployment", "k8s-watcher", "-n", namespace)
            await run_examples_as_the_release(namespace, container_env(watcher), tmp_path)
            await assert_crds_and_custom_resources_survive_uninstall(namespace)
    finally:
        await run_helm_quietly("uninstall", RELEASE, "-n", namespace)
        await delete_namespace(namespace)


async def run_examples_as_the_release(
    namespace: str, watcher_env: dict[str, str], tmp_path: Path
) -> None:
    """The services as processes, k8s-watcher as the release's ServiceAccount and with its
    COMMAND_NAMESPACES; then every file of k8s/examples/, as is."""
    as_release = await watcher_kubeconfig(tmp_path, namespace)
    env = {k: v for k, v in watcher_env.items() if k == "COMMAND_NAMESPACES"}
    await kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    async with (
        example_node(),
        real_stack(tmp_path, as_watcher=as_release, env=env) as stack,
        recording(stack) as recorder,
    ):
        try:
            await examples_take_effect(recorder)
        finally:
            await remove_examples(recorder, stack)
        assert not recorder.violations, recorder.violations


@contextlib.asynccontextmanager
async def example_node() -> AsyncIterator[None]:
    """The node k8s/examples/nodemaintenance.yaml names, gpu-003, as one more KWOK GPU node
    shaped as the others (tools/kube names its nodes node-000, node-001, ...)."""
    nodes = (await get_json("nodes", "-l", "nvidia.com/gpu.present=true"))["items"]
    model = min(nodes, key=lambda n: n["metadata"]["name"])
    labels = dict(model["metadata"]["labels"]) | {"kubernetes.io/hostname": EXAMPLE_NODE}
    await apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": EXAMPLE_NODE,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {"taints": model["spec"].get("taints") or []},
        }
    )
    await kubectl("wait", "--for=condition=Ready", "--timeout=120s", f"node/{EXAMPLE_NODE}")
    try:
        yield
    finally:
        await kubectl("delete", "node", EXAMPLE_NODE, "--ignore-not-found", check=False)
