"""The replicas setting: every stream and KV bucket of the topology stored on N servers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_bus.declare import kv_settings, stream_settings
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS, replicated
from nodeflow_runtime.config import ServiceConfig, load_config


@given(st.integers(min_value=1, max_value=5))
def test_replicas_setting_applies_to_every_stream_and_bucket(replicas: int) -> None:
    streams = replicated(STREAMS, replicas)
    buckets = replicated(KV_BUCKETS, replicas)
    assert [s.name for s in streams] == [s.name for s in STREAMS]
    assert {stream_settings(s)["num_replicas"] for s in streams} == {replicas}
    assert {kv_settings(b)["num_replicas"] for b in buckets} == {replicas}
    # Nothing else changes.
    assert [s.subjects for s in streams] == [s.subjects for s in STREAMS]


def test_replicas_setting_defaults_to_one_server_and_reads_nats_replicas() -> None:
    assert load_config(ServiceConfig, {}).nats_replicas == 1
    assert load_config(ServiceConfig, {"NATS_REPLICAS": "3"}).nats_replicas == 3
    with pytest.raises(ValueError, match="NATS_REPLICAS"):
        load_config(ServiceConfig, {"NATS_REPLICAS": "0"})
    with pytest.raises(ValueError, match="at least 1"):
        replicated(STREAMS, 0)
