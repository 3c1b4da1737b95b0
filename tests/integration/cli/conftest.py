"""Fixtures of the CLI tests that run under the generated NATS accounts, as deployed (a
module overriding `nats_users` with `generate_users()`, see tests/fixtures/nats.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nodeflow_bus import Bus, Secret, ensure_topology
from nodeflow_contracts.topology import ADMIN_USER, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess, user_credentials
from tests.fixtures.nats import TEST_BUS_OPTIONS


@pytest.fixture
async def admin_bus(
    nats_server: NatsServerProcess, nats_users: dict[str, Secret]
) -> AsyncIterator[Bus]:
    """The operators' connection (its user from the module's `nats_users`), with the
    streams and buckets declared."""
    connected = await Bus.connect(
        nats_server.url,
        credentials=user_credentials(nats_users, ADMIN_USER),
        options=TEST_BUS_OPTIONS,
    )
    await ensure_topology(connected.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=[])
    try:
        yield connected
    finally:
        await connected.close()
