"""The port-forward's pure parts: the channel frames, and which pod and port behind the
Service `nats` it forwards to (nodeflow_cli.portforward)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_cli import portforward
from nodeflow_kube import portforward as frames


def pod(name: str, *, ready: bool = True, phase: str = "Running", deleting: bool = False) -> Any:
    metadata: dict[str, Any] = {"name": name}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-28T12:00:00Z"
    return {
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "nats", "ports": [{"name": "client", "containerPort": 4333}]}]
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def service(target: Any, port_name: str = "client") -> Any:
    return {
        "metadata": {"name": "nats"},
        "spec": {
            "selector": {"app.kubernetes.io/name": "nats", "app.kubernetes.io/part-of": "x"},
            "ports": [{"name": port_name, "port": 4222, "targetPort": target}],
        },
    }


@given(channel=st.integers(0, 255), payload=st.binary())
def test_rule_a_frame_is_its_channel_byte_then_the_payload(channel: int, payload: bytes) -> None:
    assert frames.split_frame(frames.frame(channel, payload)) == (channel, payload)


def test_rule_port_i_has_data_channel_2i_and_error_channel_2i_plus_1() -> None:
    assert [frames.data_channel(i) for i in range(3)] == [0, 2, 4]
    assert [frames.error_channel(i) for i in range(3)] == [1, 3, 5]
    assert frames.port_prefix(4222) == bytes([0x7E, 0x10])  # little-endian
    with pytest.raises(ValueError):
        frames.split_frame(b"")


def test_rule_the_forward_goes_to_a_ready_running_pod_not_terminating() -> None:
    candidates = [
        pod("nats-0", ready=False),
        pod("nats-1", deleting=True),
        pod("nats-2", phase="Pending"),
        pod("nats-4"),
        pod("nats-3"),
    ]
    chosen = portforward.ready_pod(candidates)
    assert chosen is not None and chosen["metadata"]["name"] == "nats-3"
    assert portforward.ready_pod(candidates[:3]) is None


def test_rule_the_target_port_is_a_number_or_the_pods_named_container_port() -> None:
    assert portforward.target_port(service(4222), pod("n"), "client") == 4222
    assert portforward.target_port(service("5222"), pod("n"), "client") == 5222
    assert portforward.target_port(service("client"), pod("n"), "client") == 4333
    with pytest.raises(portforward.ForwardError, match="no container port named other"):
        portforward.target_port(service("other"), pod("n"), "client")
    with pytest.raises(portforward.ForwardError, match="no port named client"):
        portforward.target_port(service(4222, port_name="monitor"), pod("n"), "client")


def test_rule_the_services_selector_and_the_websocket_url() -> None:
    assert portforward.selector_query(service(4222)) == (
        "app.kubernetes.io/name=nats,app.kubernetes.io/part-of=x"
    )
    assert portforward.selector_query({"spec": {}}) == ""
    path = portforward.port_forward_path("nodeflow-system", "nats-0", 4222)
    assert path == "/api/v1/namespaces/nodeflow-system/pods/nats-0/portforward?ports=4222"
    assert portforward.websocket_url("https://10.0.0.1:6443/", "/x?y=1") == (
        "wss://10.0.0.1:6443/x?y=1"
    )
    assert portforward.websocket_url("http://127.0.0.1:8001", "/x") == "ws://127.0.0.1:8001/x"
