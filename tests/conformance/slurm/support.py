"""A thin slurmrestd client of one API version, and polling helpers, for the conformance suite.

Nothing here knows whether the server is the emulator or a real Slurm (24.11 or 26.05).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from nodeflow_contracts.slurm_api import SlurmApiVersion
from slurm_syncer.client import first_answer, is_doubled_answer

BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "UNKNOWN", "ERROR", "FUTURE", "INVALID"}
BUSY_BASES = {"ALLOCATED", "MIXED"}
UNUSABLE_FLAGS = {"DRAIN", "NOT_RESPONDING", "COMPLETING", "FAIL", "MAINTENANCE", "RESERVED"}
Json = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    status: int
    body: Json | None
    text: str

    @property
    def errors(self) -> list[Json]:
        return list((self.body or {}).get("errors") or [])

    def ok(self) -> Json:
        """The body of a successful reply: 2xx and an empty `errors` list."""
        assert 200 <= self.status < 300, f"HTTP {self.status}: {self.text[:500]}"
        assert self.body is not None, f"no JSON body: {self.text[:200]}"
        assert self.errors == [], f"errors in HTTP {self.status}: {self.errors}"
        return self.body

    def refused(self) -> bool:
        """slurmrestd says no either with an error status or with errors in a 200 body."""
        return self.status >= 400 or bool(self.errors)


@dataclass
class SlurmTarget:
    """Where the suite runs: a URL, the API version under test, the Slurm release expected
    ("24.11"; None: whatever the server says), an admin user and token, and its nodes."""

    url: str
    api: SlurmApiVersion
    release: str | None
    user: str
    token: str
    nodes: list[str]
    non_admin: tuple[str, str] | None = None
    jwt_key: bytes | None = None
    is_emulator: bool = False
    session: aiohttp.ClientSession = field(init=False, repr=False)

    def headers(self, user: str | None = None, token: str | None = None) -> dict[str, str]:
        return {
            "X-SLURM-USER-NAME": user or self.user,
            "X-SLURM-USER-TOKEN": token or self.token,
        }

    async def request(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        url = self.url + self.api.prefix + path
        sent = self.headers() if headers is None else headers
        try:
            async with self.session.request(method, url, json=body, headers=sent) as response:
                text = await response.text()
                parsed: Json | None = None
                if "json" in (response.content_type or "") and text:
                    parsed = json.loads(text)
                return Reply(response.status, parsed, text)
        except aiohttp.ClientResponseError as exc:
            if not is_doubled_answer(exc):
                raise
        # Slurm 26.05.5 answers an error twice on one connection: read the first answer, as
        # slurm-syncer's client does.
        status, data = await first_answer(
            method, url, sent, body, ssl.create_default_context(), timeout=30.0
        )
        text = data.decode("utf-8", "replace")
        try:
            decoded = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            decoded = None
        return Reply(status, decoded if isinstance(decoded, dict) else None, text)

    async def openapi(self) -> Json:
        """slurmrestd's `/openapi/v3` document (outside any version's prefix)."""
        async with self.session.get(self.url + "/openapi/v3", headers=self.headers()) as reply:
            assert reply.status == 200, f"/openapi/v3: HTTP {reply.status}"
            document: Json = await reply.json(content_type=None)
            return document

    async def node(self, name: str) -> Json:
        body = (await self.request("GET", f"/node/{name}")).ok()
        nodes = body["nodes"]
        assert len(nodes) == 1 and nodes[0]["name"] == name, nodes
        return dict(nodes[0])

    async def update_node(self, name: str, **fields: Any) -> Reply:
        return await self.request("POST", f"/node/{name}", fields)

    async def submit(self, name: str, script: str, **job: Any) -> int:
        desc = {
            "name": name,
            "script": script,
            "time_limit": {"set": True, "infinite": False, "number": 1},
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            **job,
        }
        body = (await self.request("POST", "/job/submit", {"job": desc})).ok()
        return int(body["job_id"])

    async def job(self, job_id: int) -> Json | None:
        """The job as /jobs lists it (None once Slurm forgot it)."""
        body = (await self.request("GET", "/jobs")).ok()
        for job in body["jobs"]:
            if job["job_id"] == job_id:
                return dict(job)
        return None

    async def cancel(self, job_id: int) -> Reply:
        return await self.request("DELETE", f"/job/{job_id}")


async def wait_for(
    probe: Callable[[], Awaitable[Any]],
    what: str,
    timeout: float = 45.0,
    interval: float = 0.25,
) -> Any:
    """Poll `probe` until it returns something truthy, or fail saying what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


def base(state: list[str]) -> str:
    return state[0]


def flags(state: list[str]) -> set[str]:
    return set(state[1:])


def is_free(node: Json) -> bool:
    state = node["state"]
    return base(state) == "IDLE" and not (flags(state) & UNUSABLE_FLAGS)


async def free_node(target: SlurmTarget) -> str:
    """A node that is IDLE with no drain or trouble flag, waiting for one to free up."""

    async def probe() -> str | None:
        for name in target.nodes:
            if is_free(await target.node(name)):
                return name
        return None

    name: str = await wait_for(probe, "an idle, undrained node")
    return name


def our_reason(label: str) -> str:
    return f"nodeflow: conformance {label} {uuid.uuid4().hex[:8]}"


async def restore(target: SlurmTarget, name: str) -> None:
    """Best effort: leave the node undrained whatever the test did to it."""
    node = await target.node(name)
    if "DRAIN" in flags(node["state"]):
        await target.update_node(name, state=["UNDRAIN"])


SLEEP_SCRIPT = "#!/bin/bash\nsleep {seconds}\n"


def require(condition: object, why: str) -> None:
    """Skip a test the target cannot support (a failure under CI=true: tests/conftest.py)."""
    if condition:
        return
    pytest.skip(why)
