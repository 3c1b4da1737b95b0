"""`make run`'s nats-server as the simulator shows it (clustersim.localnats): the launcher hands
it to the simulator, whose API emulator then holds what `kubectl nodeflow`'s own port-forward
looks up in a cluster (k8s/nats' Service and pod, the chart's admin Secret), read here with
the CLI's own lookups; the pod is on no node and no scheduler takes it."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import pytest

from clustersim.__main__ import build_parser, config_from_args
from clustersim.cluster.scheduling import needs_scheduling, pod_occupies_node
from clustersim.kube.portforward import forwarded_addresses
from clustersim.kube.store import Store
from clustersim.localnats import LocalNats, install_local_nats
from nodeflow_cli import portforward
from nodeflow_cli.main import ADMIN_SECRET, ADMIN_SECRET_KEY, NATS_CLIENT_PORT, NATS_SERVICE
from nodeflow_runtime.launcher import simulator_argv
from nodeflow_runtime.natsd import NatsServerProcess

NAMESPACE = "nodeflow-system"


def local_nats(tmp_path: Path) -> LocalNats:
    password_file = tmp_path / "nodeflow-admin.password"
    password_file.write_text("s3cret\n")
    return LocalNats(
        client_url="nats://127.0.0.1:41234",
        admin_password_file=password_file,
        monitor_url="http://127.0.0.1:41235",
    )


def test_rule_the_launcher_hands_its_nats_server_and_admin_password_to_the_simulator(
    tmp_path: Path,
) -> None:
    nats = NatsServerProcess(
        tmp_path / "nats", port=41234, monitor_port=41235, binary=Path("nats-server")
    )
    password_file = tmp_path / "nodeflow-admin.password"
    args = argparse.Namespace(nodes=4, topology="", slurm_version=None)
    argv = simulator_argv(args, tmp_path, None, nats, password_file)
    config = config_from_args(build_parser().parse_args(argv[3:]))
    assert config.local_nats == LocalNats(
        client_url="nats://127.0.0.1:41234",
        admin_password_file=password_file,
        monitor_url="http://127.0.0.1:41235",
    )
    # On a real control plane the simulator emulates Slurm only: no NATS objects to show.
    real = simulator_argv(args, tmp_path, tmp_path / "kubeconfig", nats, password_file)
    assert "--nats-url" not in real


def test_a_nats_url_without_the_admin_password_is_refused() -> None:
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--nats-url", "nats://127.0.0.1:4222"]))


def test_rule_the_clis_lookup_finds_the_host_nats_behind_the_service_as_in_a_cluster(
    tmp_path: Path,
) -> None:
    store = Store()
    store.create("namespaces", {"metadata": {"name": NAMESPACE}})
    install_local_nats(store, local_nats(tmp_path), NAMESPACE)

    service = store.get("services", NATS_SERVICE, NAMESPACE)
    selector = portforward.selector_query(service)
    assert selector == "app.kubernetes.io/name=nats"
    pods = store.list("pods", NAMESPACE, label_selector=selector).items
    pod = portforward.ready_pod(pods)
    assert pod is not None and pod["metadata"]["name"] == "nats-0"
    port = portforward.target_port(service, pod, NATS_CLIENT_PORT)
    assert port == 4222
    # Where the emulator's pods/portforward then connects: the host's nats-server.
    stored = store.get("pods", "nats-0", NAMESPACE)
    assert forwarded_addresses(stored) == {
        4222: ("127.0.0.1", 41234),
        8222: ("127.0.0.1", 41235),
    }

    secret = store.get("secrets", ADMIN_SECRET, NAMESPACE)
    assert base64.b64decode(secret["data"][ADMIN_SECRET_KEY]).decode() == "s3cret"
    assert base64.b64decode(secret["data"]["user"]).decode() == "nodeflow-admin"


def test_rule_the_nats_pod_is_on_no_node_and_no_scheduler_binds_it(tmp_path: Path) -> None:
    """A drain, a budget or a placement counts the pods on a node: never this one."""
    store = Store()
    store.create("namespaces", {"metadata": {"name": NAMESPACE}})
    pod = install_local_nats(store, local_nats(tmp_path), NAMESPACE)
    assert not pod["spec"].get("nodeName")
    assert not needs_scheduling(pod) and not pod_occupies_node(pod)
    assert "nodeflow.dev/nodeset" not in pod["metadata"]["labels"]
