"""`.run/env`: updates replace their keys and keep every other line's key."""

from __future__ import annotations

from pathlib import Path

from nodeflow_runtime.envfile import read_env_file, update_env_file


def test_update_replaces_keys_and_keeps_others(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text("# comment\nNATS_URL=nats://x\nKUBECONFIG=/old\n")
    update_env_file(path, {"KUBECONFIG": "/new", "SLURM_URL": "http://s"})
    assert read_env_file(path) == {
        "NATS_URL": "nats://x",
        "KUBECONFIG": "/new",
        "SLURM_URL": "http://s",
    }


def test_update_creates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "env"
    update_env_file(path, {"A": "1"})
    assert path.read_text() == "A=1\n"
