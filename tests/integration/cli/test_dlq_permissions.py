"""`kubectl nodeflow dlq replay` under the generated NATS accounts (nodeflow_contracts.
permissions): the operators' user replays, a service's user may read the dead letters but not
replay them, and is told which user it needs."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from nodeflow_bus import Bus, dead_letter
from nodeflow_bus.credentials import Secret
from nodeflow_cli import dlq
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_runtime.natsd import NatsServerProcess, generate_users

# A service whose user reads DEAD_LETTERS (it counts them) but may not publish commands.
READER = "metrics-exporter"


@pytest.fixture
def nats_users() -> dict[str, Secret]:
    """Per-user authorization on the shared `nats_server`, as deployed."""
    return generate_users()


async def kubectl_nodeflow_as(
    user: str, users: dict[str, Secret], url: str, *args: str
) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    env |= {"NATS_USER": user, "NATS_PASSWORD": users[user].reveal()}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_cli",
        "--nats",
        url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def test_dlq_replay_needs_the_operators_user_a_service_user_is_told_so(
    nats_server: NatsServerProcess, nats_users: dict[str, Secret], admin_bus: Bus
) -> None:
    command = subjects.k8s_command(ADMIN_USER, "patch")
    letter = await admin_bus.publish(
        subjects.dead_letter(command), b"{not json", headers={dead_letter.SUBJECT: command}
    )
    url = nats_server.url

    code, listed = await kubectl_nodeflow_as(READER, nats_users, url, "dlq", "list")
    assert code == 0 and f"  {command}  " in listed, listed
    code, refused = await kubectl_nodeflow_as(
        READER, nats_users, url, "dlq", "replay", str(letter.seq)
    )
    assert code == 1, refused
    assert f"{letter.seq} dlq.{command} -> {command}: not replayed: publish to {command}" in refused
    assert f"the operators' NATS user ({ADMIN_USER})" in refused
    assert (await admin_bus.js.get_msg(dlq.STREAM, seq=letter.seq)).seq == letter.seq

    code, replayed = await kubectl_nodeflow_as(
        ADMIN_USER, nats_users, url, "dlq", "replay", str(letter.seq)
    )
    assert code == 0, replayed
    assert f"{command}: replayed as " in replayed and "dead letter removed" in replayed
