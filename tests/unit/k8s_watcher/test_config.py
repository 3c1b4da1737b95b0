"""k8s-watcher configuration from the environment."""

from __future__ import annotations

import pytest

from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.kinds import watched_kind_infos
from nodeflow_contracts.topology import WATCHED_KINDS
from nodeflow_runtime.config import ConfigError, load_config


def test_defaults_fit_a_4000_node_cluster() -> None:
    config = load_config(K8sWatcherConfig, {})
    assert config.kube_qps >= 50 and config.kube_burst >= 2 * config.kube_qps
    assert config.watched_namespaces == () and config.watched_kinds == ()


def test_environment_sets_kubeconfig_namespaces_selectors_and_limits() -> None:
    config = load_config(
        K8sWatcherConfig,
        {
            "KUBECONFIG": "/etc/kube/config",
            "WATCHED_NAMESPACES": "slurm,gpu-jobs",
            "WATCHED_KINDS": "Pod,Node",
            "LABEL_SELECTORS": "Pod=app=slurmd;tier!=test,Node=pool=a100",
            "KUBE_QPS": "50",
            "KUBE_BURST": "80",
            "COMMAND_CONCURRENCY": "8",
        },
    )
    assert config.kubeconfig == "/etc/kube/config"
    assert config.watched_namespaces == ("slurm", "gpu-jobs")
    assert config.label_selector("Pod") == "app=slurmd,tier!=test"
    assert config.label_selector("Node") == "pool=a100"
    assert config.label_selector("Job") == ""
    assert (config.kube_qps, config.kube_burst, config.command_concurrency) == (50.0, 80, 8)


@pytest.mark.parametrize(
    "environ",
    [
        {"KUBE_QPS": "0"},
        {"WATCHED_KINDS": "Secret"},
        {"WATCHED_KINDS": "Pod", "LABEL_SELECTORS": "Node=a=b"},
        {"COMMAND_CONCURRENCY": "0"},
        {"KUBE_PROBE_INTERVAL_SECONDS": "0"},
    ],
)
def test_bad_settings_fail_at_start(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_config(K8sWatcherConfig, environ)


def test_rule_controller_revisions_are_mirrored_only_when_labelled_with_a_nodeset() -> None:
    """Every DaemonSet's and StatefulSet's history is a ControllerRevision: by default only the
    NodeSets' (nodeset-controller's revision history) are mirrored; LABEL_SELECTORS may say
    otherwise, and no other kind gets a selector it was not given."""
    config = load_config(K8sWatcherConfig, {})
    assert config.label_selector("ControllerRevision") == "nodeflow.dev/nodeset"
    assert config.label_selector("Pod") == ""
    chosen = load_config(
        K8sWatcherConfig, {"LABEL_SELECTORS": "ControllerRevision=nodeflow.dev/nodeset=gpu"}
    )
    assert chosen.label_selector("ControllerRevision") == "nodeflow.dev/nodeset=gpu"


def test_rule_config_maps_are_mirrored_only_when_the_skyhook_controller_wrote_them() -> None:
    """ConfigMaps are mirrored (the Skyhook controller deletes those it no longer wants), but
    only its own: both flavors' package configMaps and node metadata carry one label, the
    kind's default selector; LABEL_SELECTORS may still say otherwise."""
    config = load_config(K8sWatcherConfig, {})
    assert "ConfigMap" in {info.kind for info in watched_kind_infos()}
    assert config.label_selector("ConfigMap") == "app.kubernetes.io/managed-by=nodeflow-skyhook"
    chosen = load_config(K8sWatcherConfig, {"LABEL_SELECTORS": "ConfigMap=a=b"})
    assert chosen.label_selector("ConfigMap") == "a=b"


def test_rule_config_maps_are_mirrored_from_the_skyhook_namespace_only() -> None:
    """One informer in SKYHOOK_NAMESPACE, whatever WATCHED_NAMESPACES says, so k8s-watcher
    needs no cluster-wide grant on ConfigMaps; the other namespaced kinds follow
    WATCHED_NAMESPACES and cluster-scoped kinds are watched cluster-wide."""
    kinds = {info.kind: info for info in WATCHED_KINDS}
    default = load_config(K8sWatcherConfig, {})
    assert default.mirrored_namespaces(kinds["ConfigMap"]) == ("skyhook",)
    assert default.mirrored_namespaces(kinds["Pod"]) == ()
    scoped = load_config(
        K8sWatcherConfig, {"SKYHOOK_NAMESPACE": "infra", "WATCHED_NAMESPACES": "slurm,infra"}
    )
    assert scoped.mirrored_namespaces(kinds["ConfigMap"]) == ("infra",)
    assert scoped.mirrored_namespaces(kinds["Pod"]) == ("slurm", "infra")
    assert scoped.mirrored_namespaces(kinds["Node"]) == ()
    with pytest.raises(ConfigError, match="SKYHOOK_NAMESPACE"):
        load_config(K8sWatcherConfig, {"SKYHOOK_NAMESPACE": ""})
