"""`kubectl nodeflow` reaching NATS by itself (issue 35): with no --nats and no NATS_*
environment it finds the Service `nats` of the services' namespace, port-forwards to a Ready
pod behind it over `pods/portforward` (WebSocket, `v4.channel.k8s.io`) and connects as the
operators' user with the admin Secret's password. Against the Kubernetes API emulator, whose
NATS pod is annotated to forward its client port to the test's real nats-server."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from clustersim.kube.portforward import PORT_FORWARD_ANNOTATION
from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from nodeflow_bus import Bus, NatsTls, Secret, dead_letter, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.topology import ADMIN_USER, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess, generate_users
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.fixtures.tls import make_pki, tls_nats_server
from tests.integration.cli.plugin import run_plugin

NAMESPACE = "nodeflow-system"
NATS_LABELS = {"app.kubernetes.io/name": "nats"}


def nats_service() -> dict[str, Any]:
    """The chart's Service (charts/nodeflow/templates/nats.yaml): `client` -> the named port."""
    return {
        "metadata": {"name": "nats", "namespace": NAMESPACE, "labels": NATS_LABELS},
        "spec": {
            "selector": NATS_LABELS,
            "ports": [
                {"name": "client", "port": 4222, "targetPort": "client"},
                {"name": "monitor", "port": 8222, "targetPort": "monitor"},
            ],
        },
    }


def nats_pod(name: str, forwards_to: int | None, *, ready: bool = True) -> dict[str, Any]:
    """A NATS pod as the StatefulSet makes it; `forwards_to`: the host port its client port
    is forwarded to in the emulator (None: nothing behind it)."""
    annotations = (
        {} if forwards_to is None else {PORT_FORWARD_ANNOTATION: f"4222=127.0.0.1:{forwards_to}"}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": NATS_LABELS,
            "annotations": annotations,
        },
        "spec": {
            "containers": [
                {
                    "name": "nats",
                    "image": "nats:2.10",
                    "ports": [
                        {"name": "client", "containerPort": 4222},
                        {"name": "monitor", "containerPort": 8222},
                    ],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def admin_secret(password: Secret) -> dict[str, Any]:
    """The admin Secret the chart generates (nats-credentials.yaml)."""
    return {
        "metadata": {"name": f"{ADMIN_USER}-nats", "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {
            "user": base64.b64encode(ADMIN_USER.encode()).decode(),
            "password": base64.b64encode(password.reveal().encode()).decode(),
        },
    }


@pytest.fixture
def nats_users() -> dict[str, Secret]:
    """The generated accounts, as deployed: the operators' user among them."""
    return generate_users()


def create(store: Store, resource: str, obj: dict[str, Any]) -> None:
    created = store.create(resource, obj, NAMESPACE)
    if resource == "pods":
        # The API server drops a created pod's status (the kubelet writes it): write it.
        created["status"] = obj["status"]
        store.update(resource, created, NAMESPACE, subresource="status")


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[RunningServer]:
    store = Store(bookmark_interval=0.2)
    store.create("namespaces", {"metadata": {"name": NAMESPACE}})
    async with serve(store, kubeconfig_path=tmp_path / "kubeconfig") as server:
        yield server


async def test_rule_without_nats_given_decisions_and_dlq_list_go_through_the_clis_own_port_forward(
    emulator: RunningServer,
    nats_server: NatsServerProcess,
    nats_users: dict[str, Secret],
    admin_bus: Bus,
) -> None:
    assert nats_server.port is not None
    create(emulator.store, "services", nats_service())
    # A pod not Ready and one with nothing behind its port: never chosen over the Ready one.
    create(emulator.store, "pods", nats_pod("nats-0", None, ready=False))
    create(emulator.store, "pods", nats_pod("nats-1", nats_server.port))
    create(emulator.store, "secrets", admin_secret(nats_users[ADMIN_USER]))
    await admin_bus.publish(
        subjects.nodeset_decision("default", "gpu"),
        json.dumps(
            {
                "decided_at": 1_700_000_000.0,
                "namespace": "default",
                "nodeset": "gpu",
                "reason": "ScaleUp",
                "message": "2 pods created",
            }
        ).encode(),
    )
    await admin_bus.publish("dlq.work.bad", b"{}", headers={dead_letter.SUBJECT: "work.bad"})

    code, output, errors = await run_plugin(emulator.kubeconfig_path, "decisions")
    assert code == 0, errors
    (line,) = output.splitlines()
    assert "NodeSet default/gpu" in line and "ScaleUp" in line and "2 pods created" in line

    code, output, errors = await run_plugin(emulator.kubeconfig_path, "dlq", "list")
    assert code == 0, errors
    assert output.splitlines()[-1] == "1 dead letters"
    assert "work.bad" in output.splitlines()[1]
    # The forward closed at exit without a word (Python 3.11 printed a traceback for each
    # connection task close() cancelled).
    assert errors == "", errors


async def test_rule_why_and_doctor_read_nats_through_the_forward_too(
    emulator: RunningServer,
    nats_server: NatsServerProcess,
    nats_users: dict[str, Secret],
    admin_bus: Bus,
) -> None:
    assert nats_server.port is not None
    # Without the Service: why answers from Kubernetes alone and says why.
    create(emulator.store, "pods", nats_pod("nats-0", nats_server.port))
    code, output, errors = await run_plugin(
        emulator.kubeconfig_path, "why", "pod", "nats-0", "-n", NAMESPACE
    )
    assert code == 0, errors
    assert f"no Service nats in namespace {NAMESPACE}" in output
    assert "decisions and Slurm state not read" in output

    create(emulator.store, "services", nats_service())
    create(emulator.store, "secrets", admin_secret(nats_users[ADMIN_USER]))
    code, output, errors = await run_plugin(
        emulator.kubeconfig_path, "why", "pod", "nats-0", "-n", NAMESPACE
    )
    assert code == 0, errors
    assert "not read" not in output, output

    code, output, errors = await run_plugin(emulator.kubeconfig_path, "doctor")
    checks = {line[6:].split("  ", 1)[0]: line[:4].strip() for line in output.splitlines()}
    assert checks["nats"] == "OK", output
    assert checks["nats streams"] == "OK", output


async def test_rule_a_forward_to_a_pod_with_nothing_behind_the_port_names_the_pod_and_port(
    emulator: RunningServer,
) -> None:
    create(emulator.store, "services", nats_service())
    create(emulator.store, "pods", nats_pod("nats-0", None))
    code, output, _ = await run_plugin(emulator.kubeconfig_path, "doctor")
    assert code == 1
    assert (
        f"FAIL  nats  port-forward to pod {NAMESPACE}/nats-0 port 4222 (Service nats) failed: "
        f"error forwarding port 4222 to pod {NAMESPACE}/nats-0: connection refused"
    ) in output, output
    code, output, errors = await run_plugin(emulator.kubeconfig_path, "dlq", "list")
    assert code == 1, output
    assert (
        f"error: port-forward to pod {NAMESPACE}/nats-0 port 4222 (Service nats) failed: "
        f"error forwarding port 4222 to pod {NAMESPACE}/nats-0: connection refused"
    ) in errors, errors


async def test_rule_without_nats_given_and_no_nats_service_the_cli_says_what_to_give(
    emulator: RunningServer,
) -> None:
    code, _, errors = await run_plugin(emulator.kubeconfig_path, "decisions")
    assert code == 1
    assert errors == (
        f"error: NATS not given (--nats URL or NATS_URL) and no Service nats in namespace "
        f"{NAMESPACE} (--system-namespace) to port-forward to\n"
    )


async def test_rule_without_the_admin_secret_the_cli_names_it(
    emulator: RunningServer, nats_server: NatsServerProcess
) -> None:
    assert nats_server.port is not None
    create(emulator.store, "services", nats_service())
    create(emulator.store, "pods", nats_pod("nats-0", nats_server.port))
    code, _, errors = await run_plugin(emulator.kubeconfig_path, "dlq", "list")
    assert code == 1
    assert f"no Secret {NAMESPACE}/{ADMIN_USER}-nats with a key password" in errors, errors


async def test_rule_the_emulator_refuses_a_port_forward_that_is_no_websocket_or_names_no_port(
    emulator: RunningServer,
) -> None:
    create(emulator.store, "pods", nats_pod("nats-0", None))
    base = f"{emulator.url}/api/v1/namespaces/{NAMESPACE}/pods/nats-0/portforward"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}?ports=4222") as plain:
            status = await plain.json()
            assert (plain.status, status["kind"], status["reason"]) == (400, "Status", "BadRequest")
        for query in ("", "?ports=", "?ports=http", "?ports=70000"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"{base}{query}", protocols=("v4.channel.k8s.io",))
            assert refused.value.status == 400, query
        # No subprotocol: the same framing; the port first on both channels, then the error.
        async with session.ws_connect(f"{base}?ports=4222") as ws:
            frames = [message.data async for message in ws]
        assert frames[:2] == [b"\x00\x7e\x10", b"\x01\x7e\x10"]
        assert frames[2].startswith(b"\x01error forwarding port 4222 to pod")


async def test_rule_nats_requiring_tls_behind_the_forward_is_named_and_reached_with_the_ca(
    emulator: RunningServer, tmp_path: Path
) -> None:
    """The chart's nats.tls.enabled: without a CA and a server name the command says which
    to give; with them (NATS_TLS_CA_FILE, NATS_TLS_SERVER_NAME) it reads through the
    forward over TLS."""
    pki = make_pki(tmp_path / "pki")
    tls = NatsTls(ca_file=pki.ca_cert, server_name="localhost")
    async with tls_nats_server(tmp_path / "tls-nats", pki, verify_clients=False) as url:
        port = urlsplit(url).port
        create(emulator.store, "services", nats_service())
        create(emulator.store, "pods", nats_pod("nats-0", port))
        create(emulator.store, "secrets", admin_secret(Secret("unused: no users on this server")))
        code, _, errors = await run_plugin(emulator.kubeconfig_path, "dlq", "list")
        assert code == 1
        assert f"NATS behind pod {NAMESPACE}/nats-0 port 4222 requires TLS" in errors, errors
        assert "set NATS_TLS_CA_FILE" in errors and "NATS_TLS_SERVER_NAME" in errors

        bus = await Bus.connect([url], options=TEST_BUS_OPTIONS, tls=tls)
        try:
            await ensure_topology(bus.js, streams=STREAMS, kv_buckets=[], consumers=[])
            await bus.publish("dlq.work.bad", b"{}", headers={dead_letter.SUBJECT: "work.bad"})
        finally:
            await bus.close()
        code, output, errors = await run_plugin(
            emulator.kubeconfig_path,
            "dlq",
            "list",
            env={"NATS_TLS_CA_FILE": str(pki.ca_cert), "NATS_TLS_SERVER_NAME": "localhost"},
        )
        assert code == 0, errors
        assert output.splitlines()[-1] == "1 dead letters"
