"""SLURM_<CLUSTER>_API_VERSION: per cluster with the cluster-less fallback; a version we do not
speak is bad configuration, refused before anything runs."""

from __future__ import annotations

import pytest

from nodeflow_runtime.config import ConfigError
from slurm_syncer.settings import PER_CLUSTER_SETTINGS, cluster_settings


def test_slurm_api_version_per_cluster_with_fallback() -> None:
    env = {
        "SLURM_EAST_URL": "http://slurm-east:6820",
        "SLURM_EAST_API_VERSION": "v0.0.41",
        "SLURM_WEST_URL": "http://slurm-west:6820",
        "SLURM_NORTH_URL": "http://slurm-north:6820",
        "SLURM_NORTH_API_VERSION": " v0.0.44 ",
        "SLURM_API_VERSION": "v0.0.42",
        "SLURM_TOKEN": "t",
    }
    settings = cluster_settings(("east", "west", "north"), env)
    assert settings["east"].api_version == "v0.0.41"
    assert settings["west"].api_version == "v0.0.42"
    assert settings["north"].api_version == "v0.0.44"
    assert "API_VERSION" in PER_CLUSTER_SETTINGS


def test_without_slurm_api_version_the_version_is_negotiated() -> None:
    env = {"SLURM_URL": "http://slurm:6820", "SLURM_TOKEN": "t"}
    assert cluster_settings(("a",), env)["a"].api_version is None


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.46", "0.0.42", "latest"])
def test_a_slurm_api_version_we_do_not_speak_is_refused(version: str) -> None:
    env = {"SLURM_URL": "http://slurm:6820", "SLURM_TOKEN": "t", "SLURM_A_API_VERSION": version}
    with pytest.raises(ConfigError) as refused:
        cluster_settings(("a",), env)
    text = str(refused.value)
    assert "SLURM_A_API_VERSION" in text
    assert "v0.0.41, v0.0.42, v0.0.43, v0.0.44, v0.0.45" in text
