"""`.run/env`: one `KEY=value` a line, shared by the launcher, the simulator and the user."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip()
    return values


def update_env_file(path: Path, updates: Mapping[str, str]) -> None:
    """Set `updates` in the file, keeping every other key; written atomically."""
    values = read_env_file(path)
    values.update(updates)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    os.replace(temporary, path)
