"""The package pod contract, against upstream's pod written out by reading its source.

The expected pods below were written field by field from NVIDIA/nodewright
operator/internal/controller/skyhook_controller.go (`createPodFromPackage`,
`createInterruptPodForPackage`, `getAgentConfigEnvVars`, `getPackageImage`, `getAgentImage`,
`generateSafeName`, `setPodResources`, `UpsertNodeLabelsAnnotationsPackages`,
`UpsertConfigmaps`), operator/internal/controller/skyhook_metadata.go (`NewSkyhookMetadata`),
operator/internal/wrapper/skyhook.go (`ResourceID`, `NodeOrder`) and
operator/api/v1alpha1/skyhook_types.go (`Interrupt.ToArgs`), not computed with our code.
`as_job_pod` then applies what upstream's Jobs design (nodewright #299/#307) changes when
the pod goes into a Job, and nothing else.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from maintenance_scheduler.skyhook.api import parse_skyhook
from maintenance_scheduler.skyhook.jobs import build_job
from nodeflow_contracts import k8s

# The fixture: a Skyhook with one package using every field the pod contract reads.
SKYHOOK = parse_skyhook(
    {
        "metadata": {"name": "gpu-init", "uid": "uid-1234", "generation": 7},
        "spec": {
            "additionalTolerations": [{"key": "gpu", "operator": "Exists"}],
            "packages": {
                "gpu-driver": {
                    "version": "1.2.3",
                    "image": "nvcr.io/acme/gpu-driver",
                    "env": [
                        {"name": "MODE", "value": "fast"},
                        {
                            "name": "NODE_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                        },
                    ],
                    "configMap": {"settings.conf": "a=1"},
                    # int-or-string, as upstream's CRD (resource.Quantity).
                    "resources": {
                        "cpuRequest": 1,
                        "cpuLimit": "2",
                        "memoryRequest": "256Mi",
                        "memoryLimit": "1Gi",
                    },
                    "gracefulShutdown": "1m30s",
                    "interrupt": {"type": "reboot"},
                }
            },
        },
    }
)
PACKAGE = SKYHOOK.packages[0]
NODE = "node.a-1"
# upstream copyDir: <CopyDirRoot>/<skyhook>/<pkg>-<version>-<skyhook uid>-<generation>
COPY_DIR = "/var/lib/skyhook/gpu-init/gpu-driver-1.2.3-uid-1234-7"
# upstream generateSafeName(63, "metadata", node): "metadata-node-a-1" plus '-' and the first
# 8 hex digits of sha256("metadata-node-a-1").
METADATA_VOLUME = "metadata-node-a-1-84cf3110"
# generateSafeName(253, skyhook, node, "metadata"): the ConfigMap upstream creates.
METADATA_CONFIG_MAP = "gpu-init-node-a-1-metadata-a0f36db5"
AGENT = "nvcr.io/nvidia/skyhook/agent:v6.4.1"
MOUNTS = [
    {"name": "root-mount", "mountPath": "/root", "mountPropagation": "HostToContainer"},
    {"name": METADATA_VOLUME, "mountPath": "/skyhook-package/node-metadata"},
    {"name": "gpu-driver", "mountPath": "/skyhook-package/configmaps"},
]
# upstream setPodResources: every init container gets the package's resources.
RESOURCES = {
    "limits": {"cpu": "2", "memory": "1Gi"},
    "requests": {"cpu": "1", "memory": "256Mi"},
}
# upstream: package env first, then getAgentConfigEnvVars.
AGENT_ENV = [
    {"name": "SKYHOOK_LOG_DIR", "value": "/var/log/skyhook/gpu-init"},
    {"name": "SKYHOOK_ROOT_DIR", "value": "/var/lib/skyhook/gpu-init"},
    {"name": "COPY_RESOLV", "value": "false"},
    # ResourceID() is <name>-<uid>-<generation>; then _<pkg>_<version>.
    {"name": "SKYHOOK_RESOURCE_ID", "value": "gpu-init-uid-1234-7_gpu-driver_1.2.3"},
    {"name": "SKYHOOK_NODE_ORDER", "value": "0"},
]
PACKAGE_ENV = [
    {"name": "MODE", "value": "fast"},
    {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
]
TOLERATIONS = [
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
    {
        "key": "skyhook.nvidia.com",
        "operator": "Equal",
        "value": "runtime-required",
        "effect": "NoSchedule",
    },
    {"key": "gpu", "operator": "Exists"},
]
PAUSE = {
    "name": "pause",
    "image": "registry.k8s.io/pause:3.10",
    "resources": {
        "limits": {"cpu": "100m", "memory": "20Mi"},
        "requests": {"cpu": "100m", "memory": "20Mi"},
    },
}

# createPodFromPackage(opts, package, skyhook, "node.a-1", "apply"), its spec.
UPSTREAM_APPLY_POD: dict[str, Any] = {
    "nodeName": NODE,
    "restartPolicy": "OnFailure",
    "initContainers": [
        {
            "name": "gpu-driver-init",
            "image": "nvcr.io/acme/gpu-driver:1.2.3",  # getPackageImage: image:version
            "imagePullPolicy": "Always",
            "command": ["/bin/sh"],
            "args": [
                "-c",
                "mkdir -p /root/${SKYHOOK_DIR} && cp -r /skyhook-package/* /root/${SKYHOOK_DIR}",
            ],
            "env": [{"name": "SKYHOOK_DIR", "value": COPY_DIR}],
            "securityContext": {"privileged": True},
            "volumeMounts": MOUNTS,
            "resources": RESOURCES,
        },
        {
            "name": "gpu-driver-apply",
            "image": AGENT,
            "imagePullPolicy": "Always",
            "args": ["apply", "/root", COPY_DIR],
            "env": PACKAGE_ENV + AGENT_ENV,
            "securityContext": {"privileged": True},
            "volumeMounts": MOUNTS,
            "resources": RESOURCES,
        },
        {
            "name": "gpu-driver-applycheck",
            "image": AGENT,
            "imagePullPolicy": "Always",
            "args": ["apply-check", "/root", COPY_DIR],
            "env": PACKAGE_ENV + AGENT_ENV,
            "securityContext": {"privileged": True},
            "volumeMounts": MOUNTS,
            "resources": RESOURCES,
        },
    ],
    "containers": [PAUSE],
    "volumes": [
        {"name": "root-mount", "hostPath": {"path": "/"}},
        {"name": METADATA_VOLUME, "configMap": {"name": METADATA_CONFIG_MAP}},
        # the package ConfigMap: strings.ToLower(<skyhook>-<pkg>-<version>)
        {"name": "gpu-driver", "configMap": {"name": "gpu-init-gpu-driver-1.2.3"}},
    ],
    "hostPID": True,
    "hostNetwork": True,
    "tolerations": TOLERATIONS,
    # gracefulShutdown 1m30s: int64(Duration.Seconds())
    "terminationGracePeriodSeconds": 90,
}

# createInterruptPodForPackage(opts, {type: reboot}, argEncode, package, skyhook, node,
# "interrupt"), its spec.
UPSTREAM_INTERRUPT_POD: dict[str, Any] = {
    "nodeName": NODE,
    "restartPolicy": "OnFailure",
    "initContainers": [
        {
            "name": "interrupt",
            "image": AGENT,
            # Interrupt.ToArgs: {"type":"node_restart"} as base64.
            "args": ["interrupt", "/root", COPY_DIR, "eyJ0eXBlIjoibm9kZV9yZXN0YXJ0In0="],
            "env": AGENT_ENV,
            "securityContext": {"privileged": True},
            "volumeMounts": [MOUNTS[0]],
            "resources": {
                "limits": {"cpu": "500m", "memory": "64Mi"},
                "requests": {"cpu": "500m", "memory": "64Mi"},
            },
        }
    ],
    "containers": [PAUSE],
    "hostPID": True,
    "hostNetwork": True,
    "tolerations": TOLERATIONS,
    "volumes": [
        {"name": "root-mount", "hostPath": {"path": "/"}},
        # generateSafeName(63, skyhook, node, "metadata"); upstream names the ConfigMap
        # "gpu-init-node-a-1-metadata" here, one it never creates (we differ on purpose: the
        # one it does create).
        {"name": "gpu-init-node-a-1-metadata-a0f36db5", "configMap": {"name": METADATA_CONFIG_MAP}},
    ],
}


def as_job_pod(upstream: dict[str, Any], restart_policy: str) -> dict[str, Any]:
    """What upstream's Jobs design changes in the pod: `pause` becomes `done` (the agent
    image, exit 0, so the pod succeeds), the Job's restartPolicy, and NoExecute tolerations
    for a NotReady or unreachable node without tolerationSeconds."""
    pod = copy.deepcopy(upstream)
    done = {
        "name": "done",
        "image": AGENT,
        "command": ["/bin/sh", "-c", "exit 0"],
        "resources": PAUSE["resources"],
    }
    pod["containers"] = [done]
    pod["restartPolicy"] = restart_policy
    pod["tolerations"] = [
        *pod["tolerations"],
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]
    return pod


def job_pod(stage: str) -> dict[str, Any]:
    job = build_job(
        SKYHOOK, PACKAGE, stage, NODE, namespace="skyhook", default_stage_timeout_seconds=3600
    )
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def assert_same_fields(ours: dict[str, Any], expected: dict[str, Any]) -> None:
    """Field by field, so a difference names the field."""
    assert sorted(ours) == sorted(expected)
    for key, value in expected.items():
        if key in ("initContainers", "containers"):
            assert [c["name"] for c in ours[key]] == [c["name"] for c in value], key
            for mine, theirs in zip(ours[key], value, strict=True):
                for field in sorted(set(mine) | set(theirs)):
                    assert mine.get(field) == theirs.get(field), f"{mine['name']}.{field}"
        else:
            assert ours[key] == value, key


def test_rule_a_stage_job_pod_is_upstreams_package_pod() -> None:
    assert_same_fields(job_pod("apply"), as_job_pod(UPSTREAM_APPLY_POD, "Never"))


def test_rule_the_pod_carries_upstreams_package_annotation() -> None:
    job = build_job(
        SKYHOOK, PACKAGE, "apply", NODE, namespace="skyhook", default_stage_timeout_seconds=0
    )
    # upstream SetPackages: PackageSkyhook marshalled, the image without its tag.
    expected = (
        '{"name":"gpu-driver","version":"1.2.3","skyhook":"gpu-init","stage":"apply",'
        '"image":"nvcr.io/acme/gpu-driver"}'
    )
    pod_annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert pod_annotations["skyhook.nvidia.com/package"] == expected
    assert job["metadata"]["annotations"]["skyhook.nvidia.com/package"] == expected


def test_rule_an_interrupt_job_pod_is_upstreams_interrupt_pod() -> None:
    assert_same_fields(job_pod("interrupt"), as_job_pod(UPSTREAM_INTERRUPT_POD, "OnFailure"))


def test_rule_every_stage_runs_the_agent_with_its_stage_and_check_on_the_copy_dir() -> None:
    for stage in ("apply", "config", "upgrade", "uninstall", "post-interrupt"):
        init = job_pod(stage)["initContainers"]
        assert [c["name"] for c in init] == [
            "gpu-driver-init",
            f"gpu-driver-{stage}",
            f"gpu-driver-{stage}check",
        ]
        assert init[1]["args"] == [stage, "/root", COPY_DIR]
        assert init[2]["args"] == [f"{stage}-check", "/root", COPY_DIR]


def test_rule_container_sha_pulls_by_digest_and_agent_image_override_replaces_the_agent() -> None:
    digest = "sha256:" + "ab" * 32
    skyhook = parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "u", "generation": 1},
            "spec": {
                "packages": {
                    "tuning": {
                        "version": "0.1.0",
                        "image": "ghcr.io/x/tuning",
                        "containerSHA": digest,
                        "agentImageOverride": "ghcr.io/x/agent:7.0.0",
                    }
                }
            },
        }
    )
    package = skyhook.packages[0]
    job = build_job(skyhook, package, "apply", "n1", namespace="s", default_stage_timeout_seconds=0)
    pod = job["spec"]["template"]["spec"]
    copier, agent, check = pod["initContainers"]
    assert copier["image"] == f"ghcr.io/x/tuning@{digest}"  # getPackageImage
    assert agent["image"] == check["image"] == "ghcr.io/x/agent:7.0.0"  # getAgentImage
    # Without a configMap there is no package ConfigMap volume (upstream mounts it only then).
    assert [v["name"] for v in pod["volumes"]] == ["root-mount", "metadata-n1-36bacaba"]
    assert "resources" not in agent and "terminationGracePeriodSeconds" not in pod


def test_rule_the_pod_settings_are_the_controllers() -> None:
    from maintenance_scheduler.skyhook.pod import PodOptions

    options = PodOptions(
        agent_image="registry.local/agent:6.5.0",
        copy_dir_root="/opt/skyhook",
        agent_log_root="/logs",
        image_pull_secret="pull-me",
        runtime_required_taint="example.com/rt:NoExecute",
    )
    job = build_job(
        SKYHOOK,
        PACKAGE,
        "config",
        NODE,
        namespace="skyhook",
        default_stage_timeout_seconds=0,
        options=options,
        node_order=4,
    )
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "pull-me"}]
    assert {"key": "example.com/rt", "operator": "Equal", "value": "", "effect": "NoExecute"} in (
        pod["tolerations"]
    )
    agent = pod["initContainers"][1]
    assert agent["image"] == "registry.local/agent:6.5.0"
    assert agent["args"] == ["config", "/root", "/opt/skyhook/gpu-init/gpu-driver-1.2.3-uid-1234-7"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["SKYHOOK_LOG_DIR"] == "/logs/gpu-init"
    assert env["SKYHOOK_ROOT_DIR"] == "/opt/skyhook/gpu-init"
    assert env["SKYHOOK_NODE_ORDER"] == "4"


def test_rule_node_order_is_the_place_in_node_priority_plus_the_offset() -> None:
    from maintenance_scheduler.skyhook.pod import node_orders

    priorities = {
        "c": "2026-01-01T00:00:05Z",
        "a": "2026-01-01T00:00:05Z",
        "b": "2026-01-01T00:00:01Z",
    }
    # upstream NodeOrder: by time, then name; plus nodeOrderOffset.
    assert node_orders(priorities, 3) == {"b": 3, "a": 4, "c": 5}
    assert node_orders({}, 3) == {}


def test_rule_the_config_maps_are_upstreams_node_metadata_and_package_config() -> None:
    from maintenance_scheduler.skyhook.pod import (
        PodOptions,
        node_metadata_config_map,
        package_config_map,
    )

    owner = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "name": "gpu-init",
        "uid": "uid-1234",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    metadata = node_metadata_config_map(
        PodOptions(),
        SKYHOOK,
        NODE,
        {"zone": "b", "arch": "amd64"},
        {"note": "x"},
        namespace="skyhook",
    )
    # UpsertNodeLabelsAnnotationsPackages; packages.json is NewSkyhookMetadata marshalled
    # (struct fields in order, map keys sorted, omitempty fields left out).
    assert metadata == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": METADATA_CONFIG_MAP,
            "namespace": "skyhook",
            "labels": {
                "skyhook.nvidia.com/skyhook-node-meta": "gpu-init",
                "skyhook.nvidia.com/name": "gpu-init",
                # Ours: the label k8s-watcher mirrors the controller's ConfigMaps by.
                "app.kubernetes.io/managed-by": "nodeflow-skyhook",
            },
            "annotations": {
                "skyhook.nvidia.com/name": "gpu-init",
                "skyhook.nvidia.com/Node.name": NODE,
            },
            "ownerReferences": [owner],
        },
        "data": {
            "annotations.json": '{"note":"x"}',
            "labels.json": '{"arch":"amd64","zone":"b"}',
            "packages.json": '{"agentVersion":"v6.4.1","packages":{"gpu-driver":{"name":'
            '"gpu-driver","version":"1.2.3","image":"nvcr.io/acme/gpu-driver",'
            '"interrupt":{"type":"reboot"}}}}',
        },
    }
    # UpsertConfigmaps.
    assert package_config_map(SKYHOOK, PACKAGE, namespace="skyhook") == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpu-init-gpu-driver-1.2.3",
            "namespace": "skyhook",
            "labels": {
                "skyhook.nvidia.com/name": "gpu-init",
                "app.kubernetes.io/managed-by": "nodeflow-skyhook",
            },
            "annotations": {
                "skyhook.nvidia.com/name": "gpu-init",
                "skyhook.nvidia.com/Package.Name": "gpu-driver",
                "skyhook.nvidia.com/Package.Version": "1.2.3",
            },
            "ownerReferences": [owner],
        },
        "data": {"settings.conf": "a=1"},
    }


def test_rule_each_job_is_preceded_by_the_config_maps_its_pod_mounts() -> None:
    from maintenance_scheduler.skyhook.commands import commands_for
    from maintenance_scheduler.skyhook.plan import (
        CreateJob,
        WriteNodeMetadata,
        WritePackageConfig,
    )
    from maintenance_scheduler.skyhook.pod import PodOptions, node_metadata_config_map
    from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import Cluster, make_skyhook

    packages = {
        "drv": {"version": "1.0.0", "image": "img", "configMap": {"k": "v"}},
        "plain": {"version": "1.0.0", "image": "img"},
    }
    cluster = Cluster.of(make_skyhook(packages), count=2)
    cluster.round()  # the finalizer
    actions = cluster.round().actions
    creates = [i for i, a in enumerate(actions) if isinstance(a, CreateJob)]
    assert len(creates) == 4  # two packages on two nodes
    for index in creates:
        create = actions[index]
        assert isinstance(create, CreateJob)
        before = actions[index - 1]
        if create.package.name == "drv":
            assert isinstance(before, WritePackageConfig) and before.package == create.package
            before = actions[index - 2]
        else:
            assert not isinstance(before, WritePackageConfig)
        assert isinstance(before, WriteNodeMetadata) and before.node.name == create.node
        # SKYHOOK_NODE_ORDER: both nodes picked in this round, so by name.
        assert create.node_order == int(create.node[-1])
    write = actions[creates[0] - 2]
    assert isinstance(write, WriteNodeMetadata)
    create_cm, patch_cm = commands_for(
        write,
        1.0,
        namespace="skyhook",
        default_stage_timeout_seconds=0,
        drain_timeout_seconds=0,
    )
    body = node_metadata_config_map(
        PodOptions(),
        write.skyhook,
        write.node.name,
        write.node.labels,
        write.node.annotations,
        namespace="skyhook",
    )
    assert create_cm.op == "create" and create_cm.operation.object == body  # type: ignore[union-attr]
    assert patch_cm.op == "patch"
    assert patch_cm.operation.patch == [  # type: ignore[union-attr]
        # Only the Skyhook's own ConfigMap is rewritten (the label is tested, not changed).
        {"op": "test", "path": "/metadata/labels/skyhook.nvidia.com~1name", "value": "gpu-init"},
        {"op": "add", "path": "/data", "value": body["data"]},
        # One written before k8s-watcher mirrored the controller's ConfigMaps is labelled so.
        {
            "op": "add",
            "path": "/metadata/labels/app.kubernetes.io~1managed-by",
            "value": "nodeflow-skyhook",
        },
    ]
    assert create_cm.target.kind == patch_cm.target.kind == "ConfigMap"


def test_rule_package_env_keeps_value_from_and_plain_env_keeps_its_config_hash() -> None:
    from maintenance_scheduler.skyhook.stages import config_hash

    assert PACKAGE.env[1].value_from  # kept, not dropped as an empty value
    # A plain env entry hashes as before the valueFrom support ([name, value] pairs), so an
    # upgraded controller re-runs no config stage.
    plain = parse_skyhook(
        {
            "metadata": {"name": "s"},
            "spec": {
                "packages": {
                    "p": {
                        "version": "1.0.0",
                        "image": "i",
                        "env": [{"name": "A", "value": "1"}],
                    }
                }
            },
        }
    ).packages[0]
    assert config_hash(plain) == "c72f691107f1e54d"


def test_rule_k8s_watcher_lets_the_skyhook_controller_write_only_its_config_maps() -> None:
    from k8s_watcher.policy import Allowed, Refused, authorize
    from maintenance_scheduler.skyhook.commands import commands_for
    from maintenance_scheduler.skyhook.plan import NodeView, WriteNodeMetadata, WritePackageConfig

    node = NodeView(NODE, "node-uid", "1", {"zone": "b"}, {}, created=0.0)
    for action in (WriteNodeMetadata(SKYHOOK, node), WritePackageConfig(SKYHOOK, PACKAGE)):
        create, patch = commands_for(
            action,
            1.0,
            namespace="skyhook",
            default_stage_timeout_seconds=0,
            drain_timeout_seconds=0,
        )
        assert isinstance(authorize(create, create.subject), Allowed)
        allowed = authorize(patch, patch.subject)
        # k8s-watcher patches only a ConfigMap that carries the Skyhook label.
        assert isinstance(allowed, Allowed) and allowed.required_label == "skyhook.nvidia.com/name"
    create, _ = commands_for(
        WritePackageConfig(SKYHOOK, PACKAGE),
        1.0,
        namespace="skyhook",
        default_stage_timeout_seconds=0,
        drain_timeout_seconds=0,
    )
    body = copy.deepcopy(create.operation.object)  # type: ignore[union-attr]
    body["metadata"]["labels"] = {}
    unlabelled = msgspec.structs.replace(create, operation=k8s.CreateObject(object=body))
    assert isinstance(authorize(unlabelled, unlabelled.subject), Refused)


def test_rule_the_skyhook_crd_takes_resources_as_int_or_string_as_upstreams() -> None:
    from pathlib import Path

    import yaml

    from clustersim.kube.schema import validate

    root = Path(__file__).resolve().parents[4]
    for path in (
        root / "k8s/crds/skyhooks.skyhook.nvidia.com.yaml",
        root / "charts/nodeflow/files/third-party-crds/skyhooks.skyhook.nvidia.com.yaml",
    ):
        crd = yaml.safe_load(path.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        resources: dict[str, Any] = {
            "cpuRequest": 1,
            "cpuLimit": "1500m",
            "memoryRequest": "1Gi",
            "memoryLimit": 2147483648,
        }
        package = {"version": "1.0.0", "image": "i", "resources": resources}
        skyhook = {"spec": {"packages": {"p": package}}}
        assert validate(skyhook, schema) == [], path
        resources["cpuLimit"] = "lots"
        assert validate(skyhook, schema), path


def test_rule_the_agent_image_setting_needs_a_tag_as_upstreams() -> None:
    import msgspec

    from maintenance_scheduler.config import MaintenanceSchedulerConfig

    config = MaintenanceSchedulerConfig()
    assert config.skyhook_agent_image == AGENT  # upstream's chart: nvcr.io/nvidia/skyhook/agent
    for bad in ({"skyhook_agent_image": "ghcr.io/x/agent"}, {"skyhook_copy_dir_root": "rel"}):
        try:
            msgspec.convert(bad, MaintenanceSchedulerConfig)
        except msgspec.ValidationError:
            continue
        raise AssertionError(f"{bad} accepted")
