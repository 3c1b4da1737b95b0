"""Reading NodeSet pods from raw objects; per-cluster settings; tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jwt
import pytest

from nodeflow_runtime.config import ConfigError, load_config
from slurm_syncer.auth import SigningKeyTokens, StaticToken, mint, needs_new_token, token_source
from slurm_syncer.pods import cluster_of, pod_facts
from slurm_syncer.settings import SlurmSyncerConfig, cluster_settings, env_suffix

NODESETS = {"slurm.gpu": {"spec": {"slurmCluster": "east"}}}


def pod(**meta: Any) -> dict[str, Any]:
    metadata = {
        "name": "gpu-1",
        "namespace": "slurm",
        "uid": "u",
        "resourceVersion": "7",
        "labels": {"nodeflow.dev/nodeset": "gpu"},
        **meta,
    }
    return {"metadata": metadata, "spec": {"nodeName": "node-1"}, "status": {}}


def test_the_cluster_comes_from_the_nodeset_else_the_pod_label() -> None:
    assert cluster_of(pod(), NODESETS) == "east"
    labelled = pod(labels={"nodeflow.dev/nodeset": "other", "nodeflow.dev/slurm-cluster": "w"})
    assert cluster_of(labelled, NODESETS) == "w"
    assert cluster_of(pod(labels={"nodeflow.dev/nodeset": "other"}), NODESETS) is None


def test_pod_facts_of_a_nodeset_pod() -> None:
    nodes = {
        "_.node-1": {
            "metadata": {"annotations": {"nodeflow.dev/node-cordon-reason": " swap "}},
            "spec": {"unschedulable": True},
        }
    }
    raw = pod(annotations={"nodeflow.dev/pod-cordon": "True"}, deletionTimestamp="2026")
    raw["status"]["conditions"] = [
        {"type": "SlurmDelete", "status": "True", "reason": "RollingDeleteScheduled"}
    ]
    facts = pod_facts(raw, nodes, NODESETS)
    assert facts is not None
    assert (facts.key, facts.cluster, facts.node_name) == ("slurm.gpu-1", "east", "node-1")
    assert facts.node_unschedulable and facts.node_cordon_reason == "swap"
    assert facts.pod_cordoned and facts.terminating
    assert facts.delete_reason == "RollingDeleteScheduled"


def test_pod_facts_defaults_and_non_nodeset_pods() -> None:
    facts = pod_facts(pod(), {}, NODESETS)
    assert facts is not None
    assert not facts.node_unschedulable and facts.node_cordon_reason is None
    assert not facts.pod_cordoned and facts.delete_reason is None and not facts.terminating
    assert pod_facts(pod(labels={}), {}, NODESETS) is None
    false_delete = pod()
    false_delete["status"]["conditions"] = [{"type": "SlurmDelete", "status": "False"}]
    assert pod_facts(false_delete, {}, NODESETS).delete_reason is None  # type: ignore[union-attr]


def test_cluster_settings_use_the_simulator_names_with_fallbacks(tmp_path: Path) -> None:
    env = {
        "SLURM_EAST_URL": "http://127.0.0.1:1/",
        "SLURM_URL": "http://127.0.0.1:2",
        "SLURM_JWT_KEY_FILE": str(tmp_path / "key"),
        "SLURM_WEST_2_TOKEN": "s3cr3t",
        "SLURM_WEST_2_USER": "root",
    }
    settings = cluster_settings(("east", "west-2"), env)
    assert settings["east"].url == "http://127.0.0.1:1" and settings["east"].user == "slurm"
    assert settings["west-2"].url == "http://127.0.0.1:2" and settings["west-2"].user == "root"
    assert settings["west-2"].token == "s3cr3t" and "s3cr3t" not in repr(settings["west-2"])
    assert env_suffix("west-2") == "WEST_2"
    with pytest.raises(ConfigError, match="SLURM_NORTH_URL"):
        cluster_settings(("north",), {"SLURM_TOKEN": "t"})
    with pytest.raises(ConfigError, match="SLURM_NORTH_JWT_KEY_FILE"):
        cluster_settings(("north",), {"SLURM_URL": "http://x"})


def test_config_validation() -> None:
    config = load_config(SlurmSyncerConfig, {"SLURM_CLUSTERS": "a,b"})
    assert config.slurm_clusters == ("a", "b") and config.slurm_poll_interval_seconds == 5.0
    with pytest.raises(ConfigError):
        load_config(SlurmSyncerConfig, {"SLURM_POLL_INTERVAL_SECONDS": "0"})
    with pytest.raises(ConfigError):
        load_config(SlurmSyncerConfig, {"SLURM_CLUSTERS": "a,a"})


def test_minted_tokens_carry_sun_iat_exp() -> None:
    token = mint(b"k" * 32, "slurm", 1000.5, 60)
    claims = jwt.decode(token, b"k" * 32, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {"sun": "slurm", "iat": 1000, "exp": 1060}
    assert needs_new_token(None, 0, 10)
    assert not needs_new_token(1060, 1049, 10) and needs_new_token(1060, 1050, 10)


def test_signing_key_tokens_are_reused_then_refreshed(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"s" * 32)
    now = [1000.0]
    tokens = SigningKeyTokens("slurm", key, lifespan=100, margin=20, clock=lambda: now[0])
    first = tokens.token()
    now[0] = 1079.0
    assert tokens.token() == first and tokens.minted == 1
    now[0] = 1080.0
    assert tokens.token() != first and tokens.minted == 2
    tokens.invalidate()
    tokens.token()
    assert tokens.minted == 3
    with pytest.raises(ValueError):
        SigningKeyTokens("slurm", key, lifespan=10, margin=10)


def test_static_tokens_from_a_value_or_a_rotated_file(tmp_path: Path) -> None:
    assert StaticToken("u", value="abc").token() == "abc"
    path = tmp_path / "token"
    path.write_text("SLURM_JWT=one\n")
    static = StaticToken("u", path=path)
    assert static.token() == "one"
    path.write_text("two")
    assert static.token() == "one"  # cached until refused
    static.invalidate()
    assert static.token() == "two"
    with pytest.raises(ValueError):
        StaticToken("u")


def test_token_source_prefers_the_signing_key(tmp_path: Path) -> None:
    settings = cluster_settings(
        ("a",), {"SLURM_URL": "http://x", "SLURM_TOKEN": "t", "SLURM_JWT_KEY_FILE": "/k"}
    )["a"]
    assert isinstance(token_source(settings, lifespan=60, margin=5), SigningKeyTokens)
    static = cluster_settings(("a",), {"SLURM_URL": "http://x", "SLURM_TOKEN": "t"})["a"]
    assert isinstance(token_source(static, lifespan=60, margin=5), StaticToken)


def test_rule_drain_reason_prefix_defaults_to_the_references_and_must_say_something() -> None:
    assert load_config(SlurmSyncerConfig, {}).drain_reason_prefix == "slurm-operator:"
    config = load_config(SlurmSyncerConfig, {"DRAIN_REASON_PREFIX": "acme-ops:"})
    assert config.drain_reason_prefix == "acme-ops:"
    with pytest.raises(ConfigError):
        load_config(SlurmSyncerConfig, {"DRAIN_REASON_PREFIX": "  "})


def test_pod_facts_tell_a_mark_from_the_node_from_one_a_person_set() -> None:
    nodes: dict[str, Any] = {"_.node-1": {"metadata": {}, "spec": {}}}
    from_node = pod(
        annotations={
            "nodeflow.dev/pod-cordon": "true",
            "nodeflow.dev/pod-cordon-source": "node",
        }
    )
    facts = pod_facts(from_node, nodes, NODESETS)
    assert facts is not None and facts.pod_cordon_from_node and facts.node_known
    by_person = pod_facts(pod(annotations={"nodeflow.dev/pod-cordon": "true"}), {}, NODESETS)
    assert by_person is not None and by_person.pod_cordoned
    assert not by_person.pod_cordon_from_node and not by_person.node_known
