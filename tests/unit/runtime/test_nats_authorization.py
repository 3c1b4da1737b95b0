"""One table of who may do what on the bus (nodeflow_contracts.permissions), and the same
per-service identities everywhere: `make run`'s generated config, k8s/nats and docker-compose."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_bus.credentials import Secret
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import (
    ADMIN_USER,
    SERVICES,
    nats_publish_allow,
    password_variable,
    render_accounts,
)
from nodeflow_contracts.topology import subject_matches
from nodeflow_runtime.envfile import read_env_file
from nodeflow_runtime.launcher import service_environment, write_compose_env
from nodeflow_runtime.natsd import nats_server_binary, render_config

ROOT = Path(__file__).resolve().parents[3]
USERS = (*SERVICES, ADMIN_USER)


def k8s_nats_config() -> str:
    configmap = yaml.safe_load((ROOT / "k8s/nats/configmap.yaml").read_text())
    text: str = configmap["data"]["nats.conf"]
    return text


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def compose_nats_config() -> str:
    """The config as nats-server reads it (compose turns `$$` into `$`)."""
    content: str = compose()["configs"]["nats-config"]["content"]
    return content.replace("$$", "$")


def deployed_accounts() -> str:
    return render_accounts(password_variable)


def test_k8s_nats_config_is_the_permissions_table() -> None:
    text = k8s_nats_config()
    assert deployed_accounts() in text, (
        "k8s/nats/configmap.yaml differs from nodeflow_contracts.permissions: paste the output "
        "of `python -m nodeflow_contracts.permissions 4` as its accounts block"
    )
    assert text.count("permissions:") == len(SERVICES)


def test_docker_compose_nats_config_is_the_permissions_table() -> None:
    text = compose_nats_config()
    assert deployed_accounts() in text, (
        "docker-compose.yml differs from nodeflow_contracts.permissions: paste the output of "
        "`python -m nodeflow_contracts.permissions 6` with every `$` doubled"
    )
    assert text.count("permissions:") == len(SERVICES)


def test_nats_permissions_are_allow_lists_only() -> None:
    for text in (k8s_nats_config(), compose_nats_config(), deployed_accounts()):
        assert "deny" not in text
        assert "no_auth_user" not in text


def test_each_service_may_publish_commands_only_under_its_own_prefix() -> None:
    for service in SERVICES:
        allowed = nats_publish_allow(service)
        for sender in (*SERVICES, ADMIN_USER):
            subject = subjects.k8s_command(sender, "delete")
            may = any(subject_matches(pattern, subject) for pattern in allowed)
            assert not may or sender == service, (service, subject)
        assert not any(subject_matches(p, "cmd.k8s.v1.delete") for p in allowed)


@given(
    service=st.sampled_from(SERVICES),
    sender=st.one_of(st.sampled_from([*SERVICES, ADMIN_USER]), st.text(min_size=1, max_size=30)),
    op=st.text(min_size=1, max_size=20),
)
def test_nats_lets_a_service_publish_a_command_only_in_its_own_name(
    service: str, sender: str, op: str
) -> None:
    subject = subjects.k8s_command(sender, op)
    may = any(subject_matches(pattern, subject) for pattern in nats_publish_allow(service))
    if may:
        assert sender == service
        assert subjects.parse_k8s_command(subject) == (service, op)


def test_no_service_may_call_the_jetstream_api_beyond_its_streams() -> None:
    for service in SERVICES:
        allowed = nats_publish_allow(service)
        for dangerous in (
            "$JS.API.STREAM.DELETE.K8S_COMMANDS",
            "$JS.API.STREAM.PURGE.K8S_COMMANDS",
            "$JS.API.STREAM.MSG.DELETE.K8S_COMMANDS",
            "$JS.API.STREAM.CREATE.STEAL_COMMANDS",
        ):
            assert not any(subject_matches(p, dangerous) for p in allowed), (service, dangerous)
        reads_commands = any(
            subject_matches(p, "$JS.API.CONSUMER.CREATE.K8S_COMMANDS") for p in allowed
        )
        # Only the executor may take commands off the work queue.
        assert reads_commands == (service == "k8s-watcher"), service


def test_docker_compose_nats_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(compose_nats_config().replace("store_dir: /data", f"store_dir: {tmp_path}"))
    env = {"PATH": os.environ.get("PATH", "")}
    env.update({password_variable(user)[1:]: f"pw-{user}" for user in USERS})
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_docker_compose_gives_each_service_only_its_own_password() -> None:
    loaded = compose()
    nats_env = loaded["services"]["nats"]["environment"]
    assert set(nats_env) == {password_variable(user)[1:] for user in USERS}
    assert set(loaded["secrets"]) == {f"nats-{service}" for service in SERVICES}
    for service in SERVICES:
        definition = loaded["services"][service]
        assert definition["environment"]["NATS_USER"] == service
        assert definition["environment"]["NATS_PASSWORD_FILE"] == "/run/secrets/nats-password"
        assert definition["secrets"] == [{"source": f"nats-{service}", "target": "nats-password"}]
        secret = loaded["secrets"][f"nats-{service}"]
        assert secret == {"environment": password_variable(service)[1:]}
    # The monitor port is published on the host's loopback only.
    assert all(port.startswith("127.0.0.1:") for port in loaded["services"]["nats"]["ports"])


def test_launcher_gives_each_service_only_its_own_credentials(tmp_path: Path) -> None:
    files = {user: tmp_path / f"{user}.password" for user in USERS}
    inherited = {
        "PATH": "/bin",
        "NATS_USER": ADMIN_USER,
        "NATS_PASSWORD_FILE": str(files[ADMIN_USER]),
        "NATS_TOKEN": "operator-token",
        "NATS_CREDS_FILE": "/home/op/admin.creds",
    }
    env = service_environment(inherited, "slurm-syncer", files)
    assert env["NATS_USER"] == "slurm-syncer"
    assert env["NATS_PASSWORD_FILE"] == str(files["slurm-syncer"])
    assert "NATS_TOKEN" not in env and "NATS_CREDS_FILE" not in env
    assert env["PATH"] == "/bin"


def test_launcher_nats_config_authorizes_every_service_and_the_admin(tmp_path: Path) -> None:
    users = {user: Secret(f"secret-{user}") for user in USERS}
    text = render_config(port=4222, store_dir=tmp_path, monitor_port=8222, auth=None, users=users)
    assert render_accounts(lambda user: f'"secret-{user}"') in text
    assert 'http: "127.0.0.1:8222"' in text and 'listen: "127.0.0.1:4222"' in text


def test_compose_env_file_is_private_and_names_every_user(tmp_path: Path) -> None:
    path = tmp_path / "compose.env"
    assert write_compose_env(path) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    values = read_env_file(path)
    assert set(values) == {password_variable(user)[1:] for user in USERS}
    assert len(set(values.values())) == len(USERS)
