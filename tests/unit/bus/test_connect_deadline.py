"""The first connection's deadline holds even when nats-py does not let itself be cancelled
(on Python 3.11 a cancellation landing as one of its inner timeouts fires becomes a
TimeoutError that its reconnect loop catches and retries): Bus.connect gives up, closing the
client, instead of waiting for ever. The swallowed cancellation is a fault that cannot be
made on demand with a real server, so a connect coroutine that swallows it stands in."""

from __future__ import annotations

import asyncio

import pytest

from nodeflow_bus import connection


class Client:
    """What the deadline needs of nats-py's client: that it can be closed."""

    def __init__(self) -> None:
        self.is_closed = False

    async def close(self) -> None:
        self.is_closed = True


async def stubborn_connect(client: Client, cancellations: list[int]) -> None:
    """Retries for ever, as nats-py's loop does, until its client is closed."""
    while not client.is_closed:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cancellations.append(1)


async def test_rule_a_connect_that_ignores_its_cancellation_is_given_up_by_closing_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "CONNECT_CANCEL_GRACE_SECONDS", 0.05)
    client = Client()
    cancellations: list[int] = []
    task = asyncio.ensure_future(stubborn_connect(client, cancellations))
    assert not await connection._finished_within(task, client, 0.05)
    assert cancellations == [1] and client.is_closed and task.done()


async def test_rule_a_connect_that_finishes_in_time_is_kept_and_its_error_raised() -> None:
    async def connected() -> None:
        await asyncio.sleep(0)

    async def refused() -> None:
        raise OSError("connection refused, no retry")

    assert await connection._finished_within(connected(), Client(), 1.0)
    with pytest.raises(OSError, match="no retry"):
        await connection._finished_within(refused(), Client(), 1.0)
