"""Two replicas of a leased controller as real processes on one host, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import msgspec

from nodeflow_bus import Bus
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.waiting import eventually
from tests.integration.bus.lease_replica import ACTIONS_STREAM, MARK, Action

TTL = 3.0
REPO = Path(__file__).resolve().parents[3]


class Replica:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.holder = ""
        self.transitions: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def start_reading(self) -> None:
        reader = self._reader = asyncio.create_task(self._read())
        await eventually(lambda: bool(self.holder) or reader.done(), timeout=30)
        assert self.holder, "the replica exited before naming itself"

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while raw := await self.process.stdout.readline():
            line = raw.decode().strip()
            if not line.startswith(MARK):
                continue
            said = line.removeprefix(MARK)
            if said.startswith("holder "):
                self.holder = said.removeprefix("holder ")
            else:
                self.transitions.append(said)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


async def start_replica(url: str) -> Replica:
    # The same host name for both, and no INSTANCE_ID: the identity is the runtime's default.
    env = {key: value for key, value in os.environ.items() if key != "INSTANCE_ID"}
    env.update({"HOSTNAME": "gpu-host-1", "LOG_LEVEL": "warning", "PYTHONUNBUFFERED": "1"})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.bus.lease_replica",
        url,
        str(TTL),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    replica = Replica(process)
    await replica.start_reading()
    return replica


async def actions(bus: Bus) -> list[Action]:
    info = await bus.js.stream_info(ACTIONS_STREAM.name)
    found: list[Action] = []
    for sequence in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await bus.js.get_msg(ACTIONS_STREAM.name, sequence)
        found.append(msgspec.json.decode(raw.data or b"", type=Action))
    return found


def runs(holders: list[str]) -> list[str]:
    """Consecutive duplicates collapsed: ["a", "a", "b"] -> ["a", "b"]."""
    return [
        holder for index, holder in enumerate(holders) if index == 0 or holders[index - 1] != holder
    ]


async def test_two_replicas_on_one_host_exactly_one_acts_and_a_killed_leader_is_replaced(
    nats_server: NatsServerProcess, bus: Bus
) -> None:
    replicas = [await start_replica(nats_server.url) for _ in range(2)]
    try:
        assert replicas[0].holder != replicas[1].holder
        assert all(replica.holder.startswith("gpu-host-1-") for replica in replicas)
        await eventually(lambda: any("gained" in r.transitions for r in replicas), timeout=TTL * 6)
        # Let the leader act across several renewals while the other keeps campaigning.
        state: list[Action] = []

        async def acted_at_least(count: int) -> bool:
            state[:] = await actions(bus)
            return len(state) >= count

        for _ in range(600):
            if await acted_at_least(40):
                break
            await asyncio.sleep(TTL / 10)
        assert len({action.holder for action in state}) == 1, runs([a.holder for a in state])
        leader = next(r for r in replicas if r.holder == state[0].holder)
        survivor = next(r for r in replicas if r is not leader)
        assert "gained" not in survivor.transitions

        await leader.kill()
        for _ in range(600):
            state[:] = await actions(bus)
            if state[-1].holder == survivor.holder and state[-1].number >= 5:
                break
            await asyncio.sleep(TTL / 10)
        holders = [action.holder for action in state]
        # One hand-over, never both at once: the survivor acts only after the leader's last act.
        assert runs(holders) == [leader.holder, survivor.holder]
        survivor_numbers = [a.number for a in state if a.holder == survivor.holder]
        assert survivor_numbers == list(range(1, len(survivor_numbers) + 1))
        assert survivor.transitions == ["gained"]
    finally:
        for replica in replicas:
            await replica.kill()
