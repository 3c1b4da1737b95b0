from __future__ import annotations

from pathlib import Path

import pytest

from nodeflow_bus import Secret
from nodeflow_runtime.natsd import ServerAuth, render_config


def test_config_binds_loopback_and_enables_jetstream() -> None:
    text = render_config(port=4222, store_dir=Path("/s"), monitor_port=8222, auth=None)
    assert 'listen: "127.0.0.1:4222"' in text
    assert 'store_dir: "/s"' in text
    assert 'http: "127.0.0.1:8222"' in text
    assert "authorization" not in text


def test_config_auth_and_masked_repr() -> None:
    auth = ServerAuth(user="u", password=Secret('p"w'))
    text = render_config(port=1, store_dir=Path("/s"), monitor_port=None, auth=auth)
    assert 'password: "p\\"w"' in text and "http" not in text
    assert 'p"w' not in repr(auth)
    with pytest.raises(ValueError):
        ServerAuth()


def test_cluster_node_config_routes_to_every_node_on_loopback() -> None:
    from nodeflow_runtime.natsd_cluster import CLUSTER_NAME, render_cluster_node_config

    text = render_cluster_node_config(
        server_name="node-1",
        port=4223,
        route_port=6223,
        route_ports=[6222, 6223, 6224],
        store_dir=Path("/tmp/node-1"),
    )
    assert 'server_name: "node-1"' in text
    assert 'listen: "127.0.0.1:4223"' in text
    assert f'name: "{CLUSTER_NAME}"' in text
    assert 'listen: "127.0.0.1:6223"' in text
    for port in (6222, 6223, 6224):
        assert f'"nats-route://127.0.0.1:{port}"' in text
