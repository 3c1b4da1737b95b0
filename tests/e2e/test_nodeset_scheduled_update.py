"""Rule 7d (updateStrategy ScheduledUpdate) on the whole stack as `make run` starts it, driven
with kubectl (issue 32 item 2): slurm-syncer holds the NodeSet's window with a Slurm MAINT
reservation in the simulator's slurmrestd (Slurm 26.05, v0.0.45); before the window a template
change replaces no pod; once the window is open the pods are replaced as their nodes empty; the
reservation exists only while the NodeSet asks for that window."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.nodeset import reservation_name
from nodeflow_contracts.pod_protocol import REVISION_LABEL
from tests.e2e import processes
from tests.e2e.chaos_support import NODESETS, NS, Stack, condition, launched_stack, wait_until
from tests.e2e.test_nodeset_eviction_protection import kubectl
from tests.e2e.test_nodeset_update_strategies import (
    NEW_IMAGE,
    OLD_IMAGE,
    TOPOLOGY,
    container,
    image_of,
    live_pods,
    marked,
)
from tests.e2e.test_nodeset_update_strategies import nodeset as on_delete_nodeset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAME = "ondelete"  # the pod helpers of test_nodeset_update_strategies select this NodeSet


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduled(start: int) -> dict[str, Any]:
    return {
        "type": "ScheduledUpdate",
        "scheduledUpdate": {"startTime": stamp(start), "duration": "30m"},
        "rollingUpdate": {"maxUnavailable": 1},
    }


async def patch(stack: Stack, spec: dict[str, Any]) -> None:
    code, output = await kubectl(
        stack,
        "patch",
        f"nodesets.nodeflow.dev/{NAME}",
        f"--namespace={NS}",
        "--type=merge",
        "--patch=" + json.dumps({"spec": spec}),
    )
    assert code == 0, output


async def reservations(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = await stack.slurm.call("GET", "/reservations")
    return {entry["name"]: entry for entry in listed["reservations"]}


async def window_condition(stack: Stack) -> dict[str, Any]:
    obj = await stack.kube.call("GET", f"{NODESETS}/{NAME}")
    return condition(obj, "ScheduledUpdate") or {}


async def test_rule_scheduled_update_replaces_pods_inside_its_window_under_a_reservation(
    tmp_path: Path,
) -> None:
    async with launched_stack(tmp_path / "run", 2, TOPOLOGY) as stack:
        later = int(time.time()) + 86400
        obj = on_delete_nodeset()
        obj["spec"]["updateStrategy"] = scheduled(later)
        await stack.kube.create(NODESETS, obj)

        async def both_idle() -> bool:
            pods = await live_pods(stack)
            if len(pods) != 2:
                return False
            states = await stack.slurm.nodes()
            return all("IDLE" in states.get(name, []) for name in pods)

        await wait_until(both_idle, 90, "both NodeSet pods registered idle in Slurm")
        before = await live_pods(stack)
        tomorrow = reservation_name(NS, NAME, later)

        async def reserved_ahead() -> bool:
            entry = (await reservations(stack)).get(tomorrow)
            return entry is not None and "MAINT" in entry["flags"]

        await wait_until(reserved_ahead, 60, f"reservation {tomorrow} created ahead")
        pending = await window_condition(stack)
        assert pending.get("reason") == "WindowPending", pending

        # Before the window: a template change replaces nothing.
        await patch(stack, {"template": {"spec": {"containers": [container(NEW_IMAGE)]}}})
        generation = int(
            (await stack.kube.call("GET", f"{NODESETS}/{NAME}"))["metadata"]["generation"]
        )

        async def observed() -> bool:
            current = await stack.kube.call("GET", f"{NODESETS}/{NAME}")
            return (current.get("status") or {}).get("observedGeneration") == generation

        await wait_until(observed, 30, "the controller planned with the new template")
        after = await live_pods(stack)
        assert {n: p["metadata"]["uid"] for n, p in after.items()} == {
            n: p["metadata"]["uid"] for n, p in before.items()
        }, "a pod was replaced before its window"
        assert not any(marked(p) for p in after.values())

        # The window opens now: a new reservation (the old one goes), the pods replaced.
        now = int(time.time())
        await patch(stack, {"updateStrategy": scheduled(now)})
        today = reservation_name(NS, NAME, now)

        async def replaced() -> bool:
            pods = await live_pods(stack)
            return len(pods) == 2 and all(
                image_of(p) == NEW_IMAGE and p["metadata"]["uid"] != before[n]["metadata"]["uid"]
                for n, p in pods.items()
                if n in before
            )

        await wait_until(replaced, 150, "both pods replaced inside the window")
        listed = await reservations(stack)
        assert today in listed and tomorrow not in listed, sorted(listed)
        opened = await window_condition(stack)
        assert opened.get("status") == "True" and opened.get("reason") == "WindowOpen", opened
        pods = await live_pods(stack)
        assert {p["metadata"]["labels"][REVISION_LABEL] for p in pods.values()} != {
            p["metadata"]["labels"][REVISION_LABEL] for p in before.values()
        }
        assert all(image_of(p) != OLD_IMAGE for p in pods.values())

        # Another strategy: the NodeSet no longer asks for the window, its reservation goes.
        await patch(stack, {"updateStrategy": {"type": "RollingUpdate", "scheduledUpdate": None}})

        async def released() -> bool:
            return today not in await reservations(stack)

        await wait_until(released, 60, f"reservation {today} deleted")
