"""What one stream-info answer says about a stream's health (metrics_exporter.jetstream)."""

from __future__ import annotations

from typing import Any

from nats.js.api import StreamInfo

from metrics_exporter.jetstream import (
    StreamHealth,
    assess_stream,
    probed_streams,
    unhealthy_streams,
)
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS


def stream_info(replicas: int, cluster: dict[str, Any] | None) -> StreamInfo:
    response: dict[str, Any] = {
        "config": {
            "name": "K8S_COMMANDS",
            "subjects": ["k8s.commands.>"],
            "num_replicas": replicas,
        },
        "state": {"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0, "consumer_count": 0},
    }
    if cluster is not None:
        response["cluster"] = cluster
    info: StreamInfo = StreamInfo.from_response(response)
    return info


def test_rule_a_stream_on_a_single_server_has_its_one_replica_current() -> None:
    health = assess_stream("K8S_COMMANDS", stream_info(1, None))
    assert health == StreamHealth("K8S_COMMANDS", True, 1, 1)


def test_rule_replicas_current_counts_the_leader_and_the_followers_caught_up() -> None:
    cluster = {
        "name": "nodeflow",
        "leader": "node-0",
        "replicas": [
            {"name": "node-1", "current": True, "active": 1000},
            {"name": "node-2", "current": True, "active": 1000},
        ],
    }
    assert assess_stream("S", stream_info(3, cluster)) == StreamHealth("S", True, 3, 3)


def test_rule_an_offline_or_lagging_follower_is_not_current() -> None:
    cluster = {
        "name": "nodeflow",
        "leader": "node-0",
        "replicas": [
            {"name": "node-1", "current": True, "offline": True},
            {"name": "node-2", "current": False, "lag": 40},
        ],
    }
    health = assess_stream("S", stream_info(3, cluster))
    assert health == StreamHealth("S", True, 3, 1)
    assert unhealthy_streams([health]) == ["S"]


def test_rule_a_stream_without_a_leader_reads_zero_leader_and_counts_no_leader_replica() -> None:
    cluster = {
        "name": "nodeflow",
        "replicas": [{"name": "node-1", "current": True}, {"name": "node-2", "current": False}],
    }
    health = assess_stream("S", stream_info(3, cluster))
    assert health == StreamHealth("S", False, 3, 1)
    assert unhealthy_streams([health]) == ["S"]


def test_rule_a_stream_that_did_not_answer_has_no_leader_and_no_replica() -> None:
    assert assess_stream("S", None) == StreamHealth("S", False, 0, 0)
    assert unhealthy_streams([assess_stream("S", None)]) == ["S"]


def test_a_healthy_stream_is_not_listed_as_unhealthy() -> None:
    assert unhealthy_streams([StreamHealth("S", True, 3, 3), StreamHealth("T", True, 1, 1)]) == []


def test_rule_every_declared_stream_and_kv_bucket_is_probed() -> None:
    probed = set(probed_streams())
    assert {stream.name for stream in STREAMS} <= probed
    assert {f"KV_{bucket.bucket}" for bucket in KV_BUCKETS} <= probed
    assert len(probed) == len(STREAMS) + len(KV_BUCKETS)
