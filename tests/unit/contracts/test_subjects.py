"""Subjects and KV keys: built by functions, reversible, and always valid NATS subjects."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts import subjects
from nodeflow_contracts.topology import subject_matches

names = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s)


@given(names)
def test_token_roundtrip_and_is_one_subject_token(value: str) -> None:
    encoded = subjects.token(value)
    assert subjects.untoken(encoded) == value
    assert "." not in encoded and "*" not in encoded and ">" not in encoded
    assert not any(ch.isspace() for ch in encoded)


def test_k8s_object_event_subject_escapes_dotted_node_names() -> None:
    subject = subjects.k8s_object_event("Node", None, "gpu-1.example.com")
    assert subject == "k8s.v1.node._.gpu-1%2Eexample%2Ecom"
    assert subject_matches(subjects.k8s_kind_events("Node"), subject)


def test_namespaced_event_subject_names_namespace_and_name() -> None:
    assert subjects.k8s_object_event("Pod", "slurm", "gpu-012-002") == (
        "k8s.v1.pod.slurm.gpu-012-002"
    )


def test_object_key_splits_at_namespace_even_with_dotted_names() -> None:
    key = subjects.object_key(None, "node.a.b")
    assert key == "_.node.a.b"
    assert subjects.split_object_key(key) == (None, "node.a.b")
    assert subjects.split_object_key(subjects.object_key("ns", "p")) == ("ns", "p")


def test_object_key_rejects_characters_kv_cannot_hold() -> None:
    with pytest.raises(ValueError, match="cannot be a KV key"):
        subjects.object_key("ns", "bad name")


def test_dead_letter_subject_wraps_the_original() -> None:
    original = subjects.k8s_command("slurm-syncer", "patch")
    assert subjects.dead_letter(original) == "dlq.cmd.k8s.v1.slurm-syncer.patch"
    assert subjects.original_of_dead_letter(subjects.dead_letter(original)) == original


@pytest.mark.parametrize(
    ("kind", "bucket"),
    [
        ("Node", "k8s_nodes"),
        ("PodDisruptionBudget", "k8s_poddisruptionbudgets"),
        ("ClusterNetworkTopology", "k8s_clusternetworktopologies"),
        ("NodeMaintenance", "k8s_nodemaintenances"),
    ],
)
def test_bucket_per_kind(kind: str, bucket: str) -> None:
    assert subjects.k8s_bucket(kind) == bucket


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("k8s.v1.>", "k8s.v1.pod.ns.name", True),
        ("k8s.v1.>", "k8s.v1", False),
        ("slurm.v1.*.poll", "slurm.v1.sim.poll", True),
        ("slurm.v1.*.poll", "slurm.v1.sim.node.a", False),
        ("a.b", "a.b.c", False),
    ],
)
def test_subject_matching_follows_nats_wildcards(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches
