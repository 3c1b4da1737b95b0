"""What the real-control-plane tests share: kubectl and a kubernetes-asyncio client on the
kubeconfig that `tools/kube/real_kube.sh start` wrote (NODEFLOW_KUBE_KUBECONFIG), and waiting
for a condition with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from tests.realkube.conftest import KUBECONFIG_ENV

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "kubectl"
# Generous: a step is a scheduling cycle, a KWOK stage, a watch event or a graceful deletion
# on a machine shared with other test runs.
STEP_TIMEOUT = 90.0


def admin_kubeconfig() -> Path:
    return Path(os.environ[KUBECONFIG_ENV])


async def kubectl(
    *args: str, kubeconfig: Path | None = None, stdin: str | None = None, check: bool = True
) -> tuple[int, str, str]:
    """kubectl on the real API server (as its admin unless `kubeconfig` says otherwise): its
    exit code, stdout and stderr; with `check` a non-zero exit fails the test."""
    chosen = kubeconfig or admin_kubeconfig()
    process = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={chosen}",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "KUBECACHEDIR": str(chosen.parent / "kubectl-cache")},
    )
    out, err = await asyncio.wait_for(
        process.communicate(stdin.encode() if stdin is not None else None), STEP_TIMEOUT * 2
    )
    code = process.returncode if process.returncode is not None else -1
    if check and code != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({code}): {err.decode()}")
    return code, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def api_client(kubeconfig: Path | None = None) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(kubeconfig or admin_kubeconfig()), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        yield api


async def until(
    check: Callable[[], Awaitable[Any]], what: str, timeout: float = STEP_TIMEOUT
) -> Any:
    """The first truthy value of `check()`, polled every 0.2 s; fails the test after
    `timeout` s naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.2)
