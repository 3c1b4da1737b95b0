"""`make run`: the whole local stack as processes, and `make stop`.

Starts nats-server with JetStream (file store under .run/nats), the cluster simulator, and the
six services; waits until each answers ready on /readyz; writes .run/env; prints each
service's health and metrics URL. NATS authorizes one user per service (fresh passwords at
each start, in .run/credentials/, mode 0600) with the allow lists of
nodeflow_contracts.permissions, and the operators' `nodeflow-admin`; nobody anonymous. Each
service is told only its own user and password file.

On Ctrl-C or SIGTERM it stops the services first (so they drain in-flight messages while NATS
is still up), then the simulator, then NATS, and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from nodeflow_contracts.permissions import ADMIN_USER, password_variable
from nodeflow_runtime.envfile import read_env_file, update_env_file
from nodeflow_runtime.natsd import (
    NatsServerProcess,
    generate_users,
    write_password_files,
    write_secret_file,
)

SERVICES: tuple[tuple[str, str], ...] = (
    ("k8s-watcher", "k8s_watcher"),
    ("slurm-syncer", "slurm_syncer"),
    ("nodeset-controller", "nodeset_controller"),
    ("maintenance-scheduler", "maintenance_scheduler"),
    ("topology-placer", "topology_placer"),
    ("metrics-exporter", "metrics_exporter"),
)
FIRST_SERVICE_PORT = 18081
DEFAULT_NATS_PORT = 4222
READY_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 30.0


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log_file: Path
    url: str | None = None  # base URL that answers /readyz


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    """The preferred port when free (stable URLs for people), else any free port."""
    if port_is_free(preferred):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# Any NATS credential a process inherits from the operator's shell: a service must connect
# with its own user only (Credentials.from_env would prefer a creds file or token).
INHERITED_NATS_CREDENTIALS = (
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_PASSWORD_FILE",
    "NATS_TOKEN",
    "NATS_TOKEN_FILE",
    "NATS_NKEY_SEED_FILE",
    "NATS_CREDS_FILE",
)


def service_environment(
    base: dict[str, str], service: str, password_files: dict[str, Path]
) -> dict[str, str]:
    """`base` without any inherited NATS credential, plus the service's own user and the
    file that holds its password."""
    env = {k: v for k, v in base.items() if k not in INHERITED_NATS_CREDENTIALS}
    env["NATS_USER"] = service
    env["NATS_PASSWORD_FILE"] = str(password_files[service])
    return env


def env_key(service: str) -> str:
    return service.upper().replace("-", "_") + "_URL"


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so count from its closing ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def same_process(pid: int, started: int | None) -> bool:
    return started is not None and process_start_time(pid) == started


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Stack:
    def __init__(self, run_dir: Path, args: argparse.Namespace) -> None:
        self.run_dir = run_dir
        self.args = args
        self.logs = run_dir / "logs"
        self.env_file = run_dir / "env"
        self.children: list[Child] = []
        self.nats: NatsServerProcess | None = None
        self.password_files: dict[str, Path] = {}

    async def start_child(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        log_file = self.logs / f"{name}.log"
        handle = log_file.open("ab")
        # A session of its own: Ctrl-C reaches only the launcher, which stops children in order.
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=handle, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
        )
        handle.close()
        child = Child(name=name, process=process, log_file=log_file)
        self.children.append(child)
        self.record_children()
        return child

    def record_children(self) -> None:
        """children.json: each child's pid and process start time, so that `make stop` can
        kill leftovers without ever hitting an unrelated process that reused a pid."""
        pids = {child.name: child.process.pid for child in self.children}
        if self.nats and self.nats.pid:
            pids["nats-server"] = self.nats.pid
        record = {
            name: {"pid": pid, "started": process_start_time(pid)} for name, pid in pids.items()
        }
        (self.run_dir / "children.json").write_text(json.dumps(record))

    async def wait_ready(self, child: Child, path: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = "no answer yet"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if child.process.returncode is not None:
                    raise RuntimeError(
                        f"{child.name} exited with code {child.process.returncode}; "
                        f"see {child.log_file}:\n{tail(child.log_file)}"
                    )
                try:
                    async with session.get(
                        f"{child.url}{path}", timeout=aiohttp.ClientTimeout(total=2)
                    ) as response:
                        if response.status == 200:
                            return
                        last = f"HTTP {response.status}: {await response.text()}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = repr(exc)
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{child.name} not ready after {READY_TIMEOUT_SECONDS:.0f}s: {last}")

    async def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        # Endpoints of an earlier run are stale: readiness below waits for fresh ones.
        self.env_file.unlink(missing_ok=True)
        # --nats-port 0: any free port (tests); otherwise the given one when it is free.
        nats_port = pick_port(self.args.nats_port) if self.args.nats_port else None
        users = generate_users()
        self.password_files = write_password_files(self.run_dir / "credentials", users)
        self.nats = NatsServerProcess(
            self.run_dir / "nats",
            port=nats_port,
            monitor_port=pick_port(8222),
            users=users,
            log_file=self.logs / "nats-server.log",
        )
        await self.nats.start()
        self.record_children()
        # Where the operators' credentials are (the file), never the secret itself.
        update_env_file(
            self.env_file,
            {
                "NATS_URL": self.nats.url,
                "NATS_USER": ADMIN_USER,
                "NATS_PASSWORD_FILE": str(self.password_files[ADMIN_USER]),
            },
        )
        if self.nats.monitor_url:
            update_env_file(self.env_file, {"NATS_MONITOR_URL": self.nats.monitor_url})
        print(f"nats-server       {self.nats.url}  (JetStream store {self.run_dir / 'nats'})")
        print(
            f"NATS credentials  {self.run_dir / 'credentials'} (one user per service; "
            f"operators: {ADMIN_USER})"
        )

        if not self.args.no_sim:
            await self.start_simulator()

        shared_env = {
            **os.environ,
            **read_env_file(self.env_file),
            "LOG_LEVEL": self.args.log_level,
        }
        port = FIRST_SERVICE_PORT
        for service, module in SERVICES:
            port = pick_port(port)
            env = {
                **service_environment(shared_env, service, self.password_files),
                "HTTP_HOST": "127.0.0.1",
                "HTTP_PORT": str(port),
            }
            child = await self.start_child(service, [sys.executable, "-m", module], env)
            child.url = f"http://127.0.0.1:{port}"
            port += 1
        services = [c for c in self.children if c.name in dict(SERVICES)]
        await asyncio.gather(*(self.wait_ready(child, "/readyz") for child in services))
        update_env_file(self.env_file, {env_key(c.name): str(c.url) for c in services})
        print(f"{'service':<22} {'health':<38} metrics")
        for child in services:
            print(f"{child.name:<22} {child.url}/readyz{'':<6} {child.url}/metrics")
        print(f"environment written to {self.env_file}; Ctrl-C stops everything")

    async def start_simulator(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "clustersim",
            "--nodes",
            str(self.args.nodes),
            "--topology",
            self.args.topology,
            "--run-dir",
            str(self.run_dir),
        ]
        child = await self.start_child("clustersim", argv, dict(os.environ))
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while "KUBE_API_URL" not in read_env_file(self.env_file):
            if child.process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the cluster simulator did not start:\n{tail(child.log_file)}")
            await asyncio.sleep(0.2)
        child.url = read_env_file(self.env_file)["KUBE_API_URL"].rstrip("/")
        await self.wait_ready(child, "/_sim/readyz")
        print(f"cluster simulator {child.url}  (kubeconfig {self.run_dir / 'kubeconfig'})")

    async def watch_children(self) -> str:
        waits = {asyncio.create_task(child.process.wait()): child.name for child in self.children}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return next(waits[task] for task in done)

    async def stop(self) -> None:
        """Services first, then the simulator, then NATS; SIGKILL whatever overstays."""
        services = [c for c in self.children if c.name != "clustersim"]
        simulator = [c for c in self.children if c.name == "clustersim"]
        for group in (services, simulator):
            await asyncio.gather(*(stop_process(child) for child in group))
        if self.nats is not None:
            await self.nats.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "children.json").unlink()


async def stop_process(child: Child) -> None:
    process = child.process
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


def tail(path: Path, lines: int = 20) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


async def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    pid_file = run_dir / "launcher.pid"
    if pid_file.exists() and pid_alive(int(pid_file.read_text() or 0)):
        print(f"a stack is already running (pid {pid_file.read_text()}): `make stop`")
        return 1
    pid_file.write_text(str(os.getpid()))
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    stack = Stack(run_dir, args)
    code = 0
    try:
        starting = asyncio.create_task(stack.start())
        stopping = asyncio.create_task(stop_requested.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            watching = asyncio.create_task(stack.watch_children())
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if watching.done():
                print(
                    f"{watching.result()} exited unexpectedly; stopping the stack", file=sys.stderr
                )
                code = 1
            watching.cancel()
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        stopping.cancel()
    except Exception as exc:
        print(f"make run failed: {exc}", file=sys.stderr)
        code = 1
    finally:
        print("stopping…")
        await stack.stop()
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        print("stopped")
    return code


def stop_running_stack(run_dir: Path) -> int:
    """`make stop`: ask the launcher to stop; kill leftovers if the launcher is gone."""
    pid_file = run_dir / "launcher.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text() or 0)
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS + 15
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
    children = run_dir / "children.json"
    if children.exists():
        for child in json.loads(children.read_text()).values():
            # Every child leads its own session, so its group holds it and its helpers.
            if same_process(child["pid"], child["started"]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child["pid"], signal.SIGKILL)
        children.unlink()
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    print("stack stopped")
    return 0


def write_compose_env(path: Path) -> int:
    """`--write-compose-env`: fresh NATS passwords for docker-compose.yml, one
    `NATS_PASSWORD_<USER>=...` line per user, in a file only its owner may read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{password_variable(user)[1:]}={secret.reveal()}"
        for user, secret in generate_users().items()
    ]
    write_secret_file(path, "\n".join(lines))
    print(f"NATS passwords written to {path}: docker compose --env-file {path} up --build")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", default=".run")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--topology", default="spines=2,blocks_per_spine=2,nodes_per_block=4")
    parser.add_argument("--nats-port", type=int, default=DEFAULT_NATS_PORT)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-sim", action="store_true", help="use KUBECONFIG/SLURM_* from env")
    parser.add_argument("--stop", action="store_true", help="stop a stack started elsewhere")
    parser.add_argument(
        "--write-compose-env",
        metavar="PATH",
        help="write fresh NATS passwords for docker-compose.yml into PATH (0600) and exit",
    )
    args = parser.parse_args(argv)
    if args.write_compose_env:
        return write_compose_env(Path(args.write_compose_env))
    if args.stop:
        return stop_running_stack(Path(args.run_dir))
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
