from __future__ import annotations

import pickle
from importlib.util import find_spec
from pathlib import Path

import pytest

from nodeflow_bus import Credentials, Secret


def test_repr_and_str_hide_every_secret() -> None:
    credentials = Credentials(user="u", password=Secret("pw-123"), token=Secret("tk-456"))
    for text in (repr(credentials), str(credentials), f"{credentials}", repr(credentials.token)):
        assert "pw-123" not in text and "tk-456" not in text
    assert "***" in repr(credentials)
    with pytest.raises(TypeError):
        pickle.dumps(credentials)


def test_from_env_reads_each_kind(tmp_path: Path) -> None:
    seed = tmp_path / "seed.nk"
    creds = tmp_path / "svc.creds"
    assert Credentials.from_env({}).kind == "none"
    assert Credentials.from_env({}).connect_options() == {}
    user = Credentials.from_env({"NATS_USER": "a", "NATS_PASSWORD": "b"})
    assert user.connect_options() == {"user": "a", "password": "b"}
    assert Credentials.from_env({"NATS_TOKEN": "t"}).connect_options() == {"token": "t"}
    nkey = Credentials.from_env({"NATS_NKEY_SEED_FILE": str(seed)})
    both = Credentials.from_env({"NATS_CREDS_FILE": str(creds), "NATS_TOKEN": "t"})
    assert nkey.kind == "nkey" and both.kind == "creds"
    if find_spec("nkeys") is None:
        # nats-py needs the optional nkeys package for these; say so before connecting.
        for credentials in (nkey, both):
            with pytest.raises(RuntimeError, match="needs the 'nkeys' package"):
                credentials.connect_options()
    else:
        assert nkey.connect_options() == {"nkeys_seed": str(seed)}
        assert both.connect_options() == {"user_credentials": str(creds)}


def test_secret_files_are_read_and_trimmed(tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("from-file\n")
    credentials = Credentials.from_env(
        {"APP_USER": "a", "APP_PASSWORD_FILE": str(password_file)}, prefix="APP_"
    )
    assert credentials.password == Secret("from-file")
    assert credentials.connect_options()["password"] == "from-file"
