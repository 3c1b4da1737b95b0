"""`kubectl nodeflow dlq list|show|replay` against a real nats-server: the dead letters a real
PullConsumer writes, read, shown and replayed by the command as an operator runs it (a
process, `--nats URL`)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.js.errors import NotFoundError

from nodeflow_bus import Bus, ConsumerOptions, Delivery, PullConsumer, dead_letter, ensure_topology
from nodeflow_cli import dlq
from nodeflow_cli.main import replay_one
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.waiting import eventually
from tests.integration.bus.conftest import DLQ_STREAM, WORK_STREAM, Job, work_consumer

FAST = ConsumerOptions(concurrency=2, fetch_timeout=0.2, stop_timeout=2.0)
# The payload the first version of the consumer cannot decode: "number" is a string.
POISON = b'{"target": "x", "number": "7"}'


class LenientJob(msgspec.Struct, frozen=True, kw_only=True):
    """The fix: the next version of the consumer also takes a number written as a string."""

    target: str
    number: int | str


async def kubectl_nodeflow(url: str, *args: str) -> tuple[int, str]:
    """The plugin as kubectl runs it; its exit code and stdout+stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
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


@pytest.fixture
async def work_bus(bus: Bus) -> Bus:
    await ensure_topology(
        bus.js, streams=[WORK_STREAM, DLQ_STREAM], kv_buckets=[], consumers=[work_consumer()]
    )
    return bus


@pytest.fixture
async def poisoned(work_bus: Bus) -> AsyncIterator[int]:
    """A message the consumer could not decode, dead-lettered by it: its DEAD_LETTERS
    sequence. The consumer is stopped again (the fix is not deployed yet)."""

    async def handler(job: Job, delivery: Delivery) -> None:
        raise AssertionError(f"decoded {job}")

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    try:
        await work_bus.publish("work.bad", POISON, headers={"Trace-Id": "t-1"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while (info := await work_bus.js.stream_info(dlq.STREAM)).state.messages < 1:
            assert loop.time() < deadline, "the consumer never dead-lettered the poison"
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()
    yield info.state.last_seq


async def work_stream_last_seq(bus: Bus) -> int:
    return (await bus.js.stream_info(WORK_STREAM.name)).state.last_seq


async def fixed_consumer(
    bus: Bus, handled: list[tuple[str, LenientJob, str]]
) -> PullConsumer[LenientJob]:
    async def handler(job: LenientJob, delivery: Delivery) -> None:
        handled.append((delivery.subject, job, (delivery.headers or {}).get("Trace-Id", "")))

    consumer = PullConsumer(bus, work_consumer(), LenientJob, handler, FAST)
    await consumer.start()
    return consumer


async def test_dlq_list_shows_each_dead_letter_with_its_error_header(
    nats_server: NatsServerProcess, poisoned: int
) -> None:
    code, listed = await kubectl_nodeflow(nats_server.url, "dlq", "list")
    assert code == 0, listed
    header, line, total = listed.splitlines()
    assert header.split() == ["SEQ", "TIME", "SUBJECT", "KIND", "ERROR", "PAYLOAD"]
    assert line.split()[0] == str(poisoned)
    assert line.split()[2:4] == ["work.bad", "decode"]
    assert "field $.number: Expected `int`, got `str`" in line  # the error header
    assert line.endswith(POISON.decode())  # the payload's start
    assert total == "1 dead letters"
    # `dead-letters`, the first name, is the same listing.
    assert await kubectl_nodeflow(nats_server.url, "dead-letters") == (0, listed)
    code, other = await kubectl_nodeflow(nats_server.url, "dlq", "list", "--subject", "work.good")
    assert (code, other.splitlines()[-1]) == (0, "0 dead letters")


async def test_dlq_list_limit_shows_the_newest(
    nats_server: NatsServerProcess, work_bus: Bus, poisoned: int
) -> None:
    newer = await work_bus.publish("dlq.work.y", b"y", headers={dead_letter.SUBJECT: "work.y"})
    code, listed = await kubectl_nodeflow(nats_server.url, "dlq", "list", "--limit", "1")
    assert code == 0, listed
    header, line, total = listed.splitlines()
    assert header.startswith("SEQ") and line.split()[0] == str(newer.seq) and newer.seq > poisoned
    assert total == "2 dead letters (the newest 1 shown)"


async def test_dlq_show_prints_every_header_and_the_payload_as_json(
    nats_server: NatsServerProcess, poisoned: int
) -> None:
    code, shown = await kubectl_nodeflow(nats_server.url, "dlq", "show", str(poisoned))
    assert code == 0, shown
    assert f"dead letter {poisoned} of DEAD_LETTERS" in shown
    assert "original subject: work.bad" in shown
    assert f"  {dead_letter.ERROR_KIND}: decode" in shown
    assert f"  {dead_letter.CONSUMER}: workers" in shown
    assert "  Trace-Id: t-1" in shown
    assert 'payload (30 bytes, JSON):\n{\n  "target": "x",\n  "number": "7"\n}' in shown
    code, missing = await kubectl_nodeflow(nats_server.url, "dlq", "show", str(poisoned + 1))
    assert code == 1 and f"no dead letter {poisoned + 1}" in missing


async def test_dlq_replay_after_a_fix_delivers_to_the_original_subject_and_removes_it(
    nats_server: NatsServerProcess, work_bus: Bus, poisoned: int
) -> None:
    handled: list[tuple[str, LenientJob, str]] = []
    consumer = await fixed_consumer(work_bus, handled)
    try:
        code, report = await kubectl_nodeflow(nats_server.url, "dlq", "replay", str(poisoned))
        assert code == 0, report
        assert f"{poisoned} dlq.work.bad -> work.bad: replayed as TEST_WORK " in report
        assert "dead letter removed" in report
        await eventually(lambda: len(handled) == 1)
    finally:
        await consumer.stop()
    # The original payload and headers, on the original subject.
    assert handled == [("work.bad", LenientJob(target="x", number="7"), "t-1")]
    with pytest.raises(NotFoundError):
        await work_bus.js.get_msg(dlq.STREAM, seq=poisoned)
    code, listed = await kubectl_nodeflow(nats_server.url, "dlq", "list")
    assert listed.splitlines()[-1] == "0 dead letters"


async def test_dlq_replay_twice_does_not_deliver_twice(
    nats_server: NatsServerProcess, work_bus: Bus, poisoned: int
) -> None:
    before = await work_stream_last_seq(work_bus)
    code, report = await kubectl_nodeflow(nats_server.url, "dlq", "replay", str(poisoned))
    assert code == 0, report
    code, again = await kubectl_nodeflow(nats_server.url, "dlq", "replay", str(poisoned))
    assert code == 1 and "no such dead letter" in again
    assert await work_stream_last_seq(work_bus) == before + 1


async def test_dlq_replay_interrupted_before_the_removal_is_not_delivered_twice_when_rerun(
    work_bus: Bus, poisoned: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publish is acknowledged, then removing the dead letter fails (a fault): the dead
    letter stays, and replaying it again is dropped as a duplicate, then removed."""
    before = await work_stream_last_seq(work_bus)
    real_delete = work_bus.js.delete_msg

    async def failing_delete(stream_name: str, seq: int) -> bool:
        raise TimeoutError("connection lost")

    monkeypatch.setattr(work_bus.js, "delete_msg", failing_delete)
    done, report = await replay_one(work_bus, poisoned, dry_run=False)
    assert not done and "was not removed" in report
    assert (await work_bus.js.get_msg(dlq.STREAM, seq=poisoned)).seq == poisoned

    monkeypatch.setattr(work_bus.js, "delete_msg", real_delete)
    done, report = await replay_one(work_bus, poisoned, dry_run=False)
    assert done and "not delivered again; dead letter removed" in report, report
    assert await work_stream_last_seq(work_bus) == before + 1
    with pytest.raises(NotFoundError):
        await work_bus.js.get_msg(dlq.STREAM, seq=poisoned)


async def test_dlq_replay_refuses_a_dead_letter_without_its_original_subject_header(
    nats_server: NatsServerProcess, work_bus: Bus
) -> None:
    unnamed = await work_bus.publish("dlq.work.bad", POISON)
    looping = await work_bus.publish(
        "dlq.work.bad", POISON, headers={dead_letter.SUBJECT: "dlq.work.bad"}
    )
    before = await work_stream_last_seq(work_bus)
    code, report = await kubectl_nodeflow(
        nats_server.url, "dlq", "replay", str(unnamed.seq), str(looping.seq)
    )
    assert code == 1, report
    assert f"{unnamed.seq} dlq.work.bad: refused: no {dead_letter.SUBJECT} header" in report
    assert f"{looping.seq} dlq.work.bad: refused: its original subject dlq.work.bad is" in report
    assert await work_stream_last_seq(work_bus) == before
    assert (await work_bus.js.stream_info(dlq.STREAM)).state.messages == 2


async def test_dlq_replay_all_dry_run_publishes_nothing_and_keeps_the_dead_letters(
    nats_server: NatsServerProcess, work_bus: Bus, poisoned: int
) -> None:
    before = await work_stream_last_seq(work_bus)
    code, report = await kubectl_nodeflow(
        nats_server.url, "dlq", "replay", "--all", "--subject", "work.>", "--dry-run"
    )
    assert code == 0, report
    assert f"{poisoned} dlq.work.bad -> work.bad: would be replayed" in report
    assert await work_stream_last_seq(work_bus) == before
    assert (await work_bus.js.get_msg(dlq.STREAM, seq=poisoned)).seq == poisoned


async def test_dlq_replay_keeps_the_dead_letter_when_the_publish_is_not_acknowledged(
    nats_server: NatsServerProcess, work_bus: Bus
) -> None:
    """No stream stores the original subject any more: nothing acknowledges the publish, so
    the dead letter is not removed."""
    orphan = await work_bus.publish("dlq.gone.x", POISON, headers={dead_letter.SUBJECT: "gone.x"})
    code, report = await kubectl_nodeflow(nats_server.url, "dlq", "replay", str(orphan.seq))
    assert code == 1, report
    assert f"{orphan.seq} dlq.gone.x -> gone.x: not replayed: publish to gone.x" in report
    assert "nodeflow-admin" in report  # the user a replay needs
    assert (await work_bus.js.get_msg(dlq.STREAM, seq=orphan.seq)).seq == orphan.seq
