"""The plugin as an operator runs it: `kubectl-nodeflow` (python -m nodeflow_cli) as a process
against a kubeconfig, without the test's own NATS_* or KUBE* environment."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path


async def run_plugin(
    kubeconfig: Path, *args: str, stdin: str = "", env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """The plugin's exit code, stdout and stderr; `env`: variables the operator set."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "KUBE"))}
    environment |= env or {}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_cli",
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
    )
    output, errors = await process.communicate(stdin.encode())
    assert process.returncode is not None
    return process.returncode, output.decode(), errors.decode()
