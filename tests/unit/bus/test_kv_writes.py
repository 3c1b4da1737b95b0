"""KV writes for batch publishes: the put and delete-marker messages nodeflow_bus builds."""

from __future__ import annotations

from nodeflow_bus.connection import encode_payload, is_kv_subject
from nodeflow_bus.kv_view import is_delete
from nodeflow_bus.kv_writes import kv_delete, kv_put
from nodeflow_contracts import codec
from nodeflow_contracts.slurm import SlurmClusterStatus


def test_rule_a_kv_put_is_a_publish_to_the_keys_subject_with_the_encoded_value() -> None:
    status = SlurmClusterStatus(
        cluster="a",
        reachable=True,
        last_poll_at=10.0,
        last_success_at=10.0,
        poll_interval_seconds=5.0,
    )
    message = kv_put("slurm_clusters", "a", status)
    assert message.subject == "$KV.slurm_clusters.a" and is_kv_subject(message.subject)
    assert not is_delete(dict(message.headers or {}))
    decoded = codec.decode(SlurmClusterStatus, encode_payload(message.message), subject="kv")
    assert decoded == status


def test_rule_a_kv_delete_is_an_empty_message_that_kv_readers_take_as_a_delete() -> None:
    message = kv_delete("slurm_nodes", "a.gpu-001")
    assert message.subject == "$KV.slurm_nodes.a.gpu-001"
    assert encode_payload(message.message) == b""
    assert is_delete(dict(message.headers or {}))
    assert not is_delete(dict(kv_put("slurm_nodes", "a.gpu-001", b"x").headers or {}))
