"""Typed configuration from the environment, with clear errors naming the bad variable."""

from __future__ import annotations

import os
from typing import Literal

import pytest

from nodeflow_runtime.config import ConfigError, ServiceConfig, load_config, redacted


class ExampleConfig(ServiceConfig, kw_only=True):
    poll_interval_seconds: float = 5.0
    clusters: tuple[str, ...] = ()
    dry_run: bool = False
    mode: Literal["fast", "safe"] = "safe"
    slurm_token: str = ""


def test_defaults_apply_when_nothing_is_set() -> None:
    config = load_config(ExampleConfig, {})
    assert config.http_port == 8080
    assert config.nats_url == ("nats://127.0.0.1:4222",)
    assert config.instance_id


def test_values_are_converted_from_strings() -> None:
    config = load_config(
        ExampleConfig,
        {
            "HTTP_PORT": "9000",
            "POLL_INTERVAL_SECONDS": "0.5",
            "CLUSTERS": "a, b",
            "DRY_RUN": "yes",
            "MODE": "fast",
            "NATS_URL": "nats://a:4222,nats://b:4222",
        },
    )
    assert config.http_port == 9000
    assert config.poll_interval_seconds == 0.5
    assert config.clusters == ("a", "b")
    assert config.dry_run is True
    assert config.mode == "fast"
    assert config.nats_url == ("nats://a:4222", "nats://b:4222")


def test_bad_configuration_names_every_bad_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(ExampleConfig, {"HTTP_PORT": "eighty", "DRY_RUN": "maybe", "MODE": "x"})
    message = str(caught.value)
    assert "HTTP_PORT='eighty'" in message
    assert "DRY_RUN='maybe'" in message
    assert "MODE='x'" in message


def test_secret_values_never_appear_in_errors_or_logs() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(ExampleConfig, {"SLURM_TOKEN": "s3cret", "HTTP_PORT": "x"})
    assert "s3cret" not in str(caught.value)
    shown = redacted(load_config(ExampleConfig, {"SLURM_TOKEN": "s3cret"}))
    assert shown["slurm_token"] == "<hidden>"
    assert "s3cret" not in repr(shown)


def test_choices_ignore_case() -> None:
    assert load_config(ExampleConfig, {"LOG_LEVEL": "INFO", "MODE": "Fast"}).log_level == "info"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HTTP_PORT", "-5"),
        ("HTTP_PORT", "70000"),
        ("SHUTDOWN_DEADLINE_SECONDS", "-1"),
        ("NATS_URL", " , "),
    ],
)
def test_out_of_range_values_are_refused(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        load_config(ExampleConfig, {variable: value})


def test_instance_id_names_the_host_and_is_unique_per_process() -> None:
    first = load_config(ExampleConfig, {"HOSTNAME": "pod-7"}).instance_id
    second = load_config(ExampleConfig, {"HOSTNAME": "pod-7"}).instance_id
    assert first.startswith(f"pod-7-{os.getpid()}-")
    # Two replicas on one host (or a restart that reuses a pid) never share an identity.
    assert first != second
    assert load_config(ExampleConfig, {}).instance_id != load_config(ExampleConfig, {}).instance_id


def test_instance_id_variable_overrides_the_default() -> None:
    assert load_config(ExampleConfig, {"HOSTNAME": "pod-7", "INSTANCE_ID": "x"}).instance_id == "x"


def test_credentials_in_urls_are_never_logged() -> None:
    config = load_config(ExampleConfig, {"NATS_URL": "nats://svc:hunter2@nats:4222,nats://b:4222"})
    shown = redacted(config)
    assert shown["nats_url"] == ("nats://nats:4222", "nats://b:4222")
    assert "hunter2" not in repr(shown)
