"""NATS client TLS settings: when TLS is used, and the certificate/key pair rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeflow_bus import NatsTls, TlsConfigError
from nodeflow_runtime.config import ConfigError, ServiceConfig, load_config


def test_nats_tls_cert_and_key_are_set_together() -> None:
    with pytest.raises(ConfigError, match="NATS_TLS_CERT_FILE and NATS_TLS_KEY_FILE"):
        load_config(ServiceConfig, {"NATS_TLS_CERT_FILE": "/tls/tls.crt"})
    with pytest.raises(ConfigError, match="NATS_TLS_CERT_FILE and NATS_TLS_KEY_FILE"):
        load_config(ServiceConfig, {"NATS_TLS_KEY_FILE": "/tls/tls.key"})
    with pytest.raises(TlsConfigError):
        NatsTls(cert_file=Path("/tls/tls.crt"))


def test_nats_tls_settings_are_read_from_the_environment() -> None:
    config = load_config(
        ServiceConfig,
        {
            "NATS_URL": "tls://nats:4222",
            "NATS_TLS_CA_FILE": "/tls/ca.crt",
            "NATS_TLS_CERT_FILE": "/tls/tls.crt",
            "NATS_TLS_KEY_FILE": "/tls/tls.key",
            "NATS_TLS_SERVER_NAME": "nats.nodeflow.svc",
        },
    )
    assert config.nats_tls() == NatsTls(
        ca_file=Path("/tls/ca.crt"),
        cert_file=Path("/tls/tls.crt"),
        key_file=Path("/tls/tls.key"),
        server_name="nats.nodeflow.svc",
    )


def test_nats_tls_used_when_a_ca_or_cert_is_given_or_the_url_is_tls() -> None:
    plain = NatsTls()
    assert not plain.required_for(["nats://127.0.0.1:4222"])
    assert plain.connect_options(["nats://127.0.0.1:4222"]) == {}
    assert plain.required_for(["nats://a:4222", "tls://b:4222"])
    assert "tls" in plain.connect_options(["tls://b:4222"])  # the system trust store
    assert NatsTls(ca_file=Path("/ca.crt")).required_for(["nats://a:4222"])
    pair = NatsTls(cert_file=Path("/c.crt"), key_file=Path("/c.key"))
    assert pair.required_for(["nats://a:4222"])


def test_nats_tls_server_name_becomes_the_verified_hostname() -> None:
    options = NatsTls(server_name="nats.example").connect_options(["tls://10.0.0.1:4222"])
    assert options["tls_hostname"] == "nats.example"
    assert options["tls"].check_hostname


def test_nats_tls_missing_ca_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        NatsTls(ca_file=tmp_path / "absent.crt").ssl_context()
