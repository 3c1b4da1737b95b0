"""A PullConsumer refuses settings that would hold a key forever."""

from __future__ import annotations

from typing import Any, cast

import pytest

from nodeflow_bus import Bus, ConsumerOptions, Delivery, PullConsumer
from nodeflow_contracts.topology import ConsumerSpec


async def handler(message: bytes, delivery: Delivery) -> None:
    return None


def test_an_ordering_key_needs_a_delivery_limit() -> None:
    unlimited = ConsumerSpec(
        stream="S", durable="d", filter_subjects=("s.>",), description="d", max_deliver=-1
    )
    options = ConsumerOptions(ordering_key=lambda message: message)
    no_bus = cast(Bus, cast(Any, None))
    with pytest.raises(ValueError, match="delivery limit"):
        PullConsumer(no_bus, unlimited, bytes, handler, options)
    # Without a key, unlimited redelivery is allowed (naks spread it over time).
    PullConsumer(no_bus, unlimited, bytes, handler, ConsumerOptions())
