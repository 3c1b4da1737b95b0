"""SLURM_<CLUSTER>_CA_FILE: per cluster with the cluster-less fallback, https only."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeflow_runtime.config import ConfigError
from slurm_syncer.settings import PER_CLUSTER_SETTINGS, cluster_settings


def test_slurm_ca_file_per_cluster_with_fallback() -> None:
    env = {
        "SLURM_EAST_URL": "https://slurm-east:6820",
        "SLURM_EAST_CA_FILE": "/etc/slurm-east/ca.crt",
        "SLURM_WEST_URL": "https://slurm-west:6820",
        "SLURM_CA_FILE": "/etc/slurm/ca.crt",
        "SLURM_TOKEN": "t",
    }
    settings = cluster_settings(("east", "west"), env)
    assert settings["east"].ca_file == Path("/etc/slurm-east/ca.crt")
    assert settings["west"].ca_file == Path("/etc/slurm/ca.crt")
    assert "CA_FILE" in PER_CLUSTER_SETTINGS


def test_slurm_https_without_ca_file_uses_the_system_store() -> None:
    env = {"SLURM_URL": "https://slurm:6820", "SLURM_TOKEN": "t"}
    assert cluster_settings(("a",), env)["a"].ca_file is None


def test_slurm_ca_file_with_a_plain_http_url_is_refused() -> None:
    env = {"SLURM_URL": "http://slurm:6820", "SLURM_A_CA_FILE": "/ca.crt", "SLURM_TOKEN": "t"}
    with pytest.raises(ConfigError, match="needs an https:// URL"):
        cluster_settings(("a",), env)
