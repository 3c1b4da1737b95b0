"""`make run`: the whole local stack as processes, and `make stop`.

Starts nats-server with JetStream (file store under .run/nats), the cluster simulator, and the
six services; waits until each answers ready on /readyz; writes .run/env; prints each
service's health and metrics URL. NATS authorizes one user per service (fresh passwords at
each start, in .run/credentials/, mode 0600) with the allow lists of
nodeflow_contracts.permissions, and the operators' `nodeflow-admin`; nobody anonymous. Each
service is told only its own user and password file.

With `--kube real` (`make run KUBE=real`) Kubernetes is a real control plane instead of the
simulator's API emulator: tools/kube/real_kube.sh builds (or reuses) etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK, starts them on loopback with the simulator's
nodes as KWOK nodes and our CRDs installed, and the simulator runs only its Slurm emulator,
registering the Slurm nodes of the NodeSet pods there (`clustersim --follow-kubeconfig`).
The control plane is stopped last, with the stack, and by `make stop`.

Then it supervises them as a Deployment would: a service that exits is started again with
exponential backoff (a line on stderr says so), with the environment it was first started
with, and so is nats-server, on the same port, store and users; the simulator keeps running
through both, so the cluster it holds is kept. Only the simulator's own death stops the stack
(a new simulator would be a different cluster). On Ctrl-C or SIGTERM it stops the services
first (so they drain in-flight messages while NATS is still up), then the simulator, then NATS,
and leaves no process behind.
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
from typing import Any

import aiohttp

from nodeflow_bus.backoff import Backoff
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
SIMULATOR = "clustersim"
KUBE_BACKENDS = ("sim", "real")
REAL_KUBE_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "kube" / "real_kube.sh"
NAMESPACE_MANIFEST = Path(__file__).resolve().parents[2] / "k8s" / "base" / "namespace.yaml"
# The namespace the services keep their own objects in, as the emulator starts with it.
INSTALL_NAMESPACE = "nodeflow-system"
# Restarts as Kubernetes spaces a crash-looping container's: 1 s, 2 s, 4 s, ... up to 30 s;
# a process that ran for STABLE_RUN_SECONDS before it died starts the sequence again.
RESTART_BACKOFF = Backoff(initial=1.0, factor=2.0, maximum=30.0)
STABLE_RUN_SECONDS = 60.0
NATS_POLL_SECONDS = 0.2


def crash_count(previous: int, ran_for: float) -> int:
    """How many crashes in a row, counting the one that just ended a run of `ran_for` s."""
    return 1 if ran_for >= STABLE_RUN_SECONDS else previous + 1


def restart_delay(crashes: int) -> float:
    """How long to wait before starting again a process that crashed `crashes` times in a row."""
    return RESTART_BACKOFF.delay(crashes)


def simulator_argv(
    args: argparse.Namespace,
    run_dir: Path,
    real_kubeconfig: Path | None,
    nats: NatsServerProcess | None = None,
    admin_password_file: Path | None = None,
) -> list[str]:
    """How the launcher starts the cluster simulator (its Slurm release: --slurm-version,
    else the simulator's default, the newest). Its API emulator shows `nats` as an install's
    Service `nats` with the operators' Secret (`admin_password_file`), so `kubectl nodeflow`
    reaches it by its own port-forward as in a cluster."""
    argv = [
        sys.executable,
        "-m",
        "clustersim",
        "--nodes",
        str(args.nodes),
        "--run-dir",
        str(run_dir),
    ]
    if args.topology:
        argv += ["--topology", args.topology]
    if real_kubeconfig is not None:
        argv += ["--follow-kubeconfig", str(real_kubeconfig)]
    if getattr(args, "slurm_version", None):
        argv += ["--slurm-version", args.slurm_version]
    if real_kubeconfig is None and nats is not None and admin_password_file is not None:
        argv += ["--nats-url", nats.url, "--nats-admin-password-file", str(admin_password_file)]
        if nats.monitor_url:
            argv += ["--nats-monitor-url", nats.monitor_url]
    return argv


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log_file: Path
    url: str | None = None  # base URL that answers /readyz
    # What it was started with, to start it again the same way.
    argv: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    # The HTTP socket the launcher bound for it and passes down at each start
    # (HTTP_LISTEN_FD): the port stays the service's while it restarts.
    listener: socket.socket | None = None
    started_at: float = 0.0
    crashes: int = 0


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listening_socket(preferred: int, *, fallback: bool = True) -> socket.socket:
    """A socket listening on 127.0.0.1: on `preferred` when free (stable URLs for people),
    else on any free port (without `fallback`: OSError). Bound here and inherited by the
    service, so that no process can take the port between its pick and the service's bind (a
    test's client connection took one from the ephemeral range once)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As aiohttp binds: connections of an earlier run in TIME_WAIT do not keep the port.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            listener.bind(("127.0.0.1", preferred))
        except OSError:
            if not fallback:
                raise
            listener.bind(("127.0.0.1", 0))
        listener.listen(socket.SOMAXCONN)
    except BaseException:
        listener.close()
        raise
    return listener


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
        self.nats_crashes = 0
        # Set once stopping begins: the supervisors then restart nothing.
        self.stopping = asyncio.Event()
        self.password_files: dict[str, Path] = {}
        self.real_kubeconfig: Path | None = None

    async def start_child(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        listener: socket.socket | None = None,
    ) -> Child:
        log_file = self.logs / f"{name}.log"
        process = await spawn(argv, env, log_file, listener)
        child = Child(
            name=name,
            process=process,
            log_file=log_file,
            argv=tuple(argv),
            env=env,
            listener=listener,
            started_at=time.monotonic(),
        )
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

        if self.args.kube == "real":
            self.real_kubeconfig = await start_real_kube(self.run_dir, self.args)
            await self.start_simulator()
        elif not self.args.no_sim:
            await self.start_simulator()

        shared_env = {
            **os.environ,
            **read_env_file(self.env_file),
            "LOG_LEVEL": self.args.log_level,
        }
        for index, (service, module) in enumerate(SERVICES):
            listener = listening_socket(FIRST_SERVICE_PORT + index)
            port = listener.getsockname()[1]
            env = {
                **service_environment(shared_env, service, self.password_files),
                "HTTP_HOST": "127.0.0.1",
                "HTTP_PORT": str(port),
                "HTTP_LISTEN_FD": str(listener.fileno()),
            }
            argv = [sys.executable, "-m", module]
            child = await self.start_child(service, argv, env, listener)
            child.url = f"http://127.0.0.1:{port}"
        services = [c for c in self.children if c.name in dict(SERVICES)]
        await asyncio.gather(*(self.wait_ready(child, "/readyz") for child in services))
        update_env_file(self.env_file, {env_key(c.name): str(c.url) for c in services})
        print(f"{'service':<22} {'health':<38} metrics")
        for child in services:
            print(f"{child.name:<22} {child.url}/readyz{'':<6} {child.url}/metrics")
        print(f"environment written to {self.env_file}; Ctrl-C stops everything")

    async def start_simulator(self) -> None:
        argv = simulator_argv(
            self.args,
            self.run_dir,
            self.real_kubeconfig,
            self.nats,
            self.password_files.get(ADMIN_USER),
        )
        child = await self.start_child("clustersim", argv, dict(os.environ))
        # Each mode writes its env file once it is up: the emulator with its API's URL, the
        # Slurm bridge (real Kubernetes) with the Slurm URLs after its first list of pods.
        ready_key = "SLURM_URL" if self.real_kubeconfig is not None else "KUBE_API_URL"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while ready_key not in read_env_file(self.env_file):
            if child.process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the cluster simulator did not start:\n{tail(child.log_file)}")
            await asyncio.sleep(0.2)
        env = read_env_file(self.env_file)
        if self.real_kubeconfig is not None:
            print(
                f"Slurm emulator    {env['SLURM_URL']}  (following the NodeSet pods of "
                f"{env['KUBE_API_URL']})"
            )
            print(f"real Kubernetes   {env['KUBE_API_URL']}  (kubeconfig {self.real_kubeconfig})")
            return
        child.url = env["KUBE_API_URL"].rstrip("/")
        await self.wait_ready(child, "/_sim/readyz")
        print(f"cluster simulator {child.url}  (kubeconfig {self.run_dir / 'kubeconfig'})")

    async def watch_children(self) -> str:
        """Keep the services and NATS running; return the name of a child whose death cannot
        be repaired by starting it again (the simulator)."""
        supervisors: set[asyncio.Task[None]] = {
            asyncio.create_task(self.keep_running(child))
            for child in self.children
            if child.name != SIMULATOR
        }
        if self.nats is not None:
            supervisors.add(asyncio.create_task(self.keep_nats_running(self.nats)))
        simulator_exits = {
            asyncio.create_task(child.process.wait()): child.name
            for child in self.children
            if child.name == SIMULATOR
        }
        pending: set[asyncio.Task[Any]] = {*supervisors, *simulator_exits}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task in simulator_exits:
                        return simulator_exits[task]
                    task.result()  # a supervisor that failed: let the stack stop on it
            # Every supervisor returned: the stack is stopping.
            return ""
        finally:
            for task in [*supervisors, *simulator_exits]:
                task.cancel()
            await asyncio.gather(*supervisors, *simulator_exits, return_exceptions=True)

    async def pause(self, seconds: float) -> bool:
        """Sleep, cut short by a stop; True if the stack is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    async def keep_running(self, child: Child) -> None:
        """Start `child` again each time it exits, with backoff, until the stack stops."""
        while True:
            code = await child.process.wait()
            if self.stopping.is_set():
                return
            child.crashes = crash_count(child.crashes, time.monotonic() - child.started_at)
            delay = restart_delay(child.crashes)
            report(
                f"{child.name} exited with code {code}; restarting in {delay:.0f} s "
                f"(crash {child.crashes} in a row; log {child.log_file})"
            )
            if await self.pause(delay):
                return
            child.process = await spawn(
                list(child.argv), child.env or {}, child.log_file, child.listener
            )
            child.started_at = time.monotonic()
            if self.stopping.is_set():
                # The stop began while it was starting and may have missed it.
                await stop_process(child)
                return
            self.record_children()
            report(f"{child.name} restarted (pid {child.process.pid})")
            if child.url is not None:
                try:
                    await self.wait_ready(child, "/readyz")
                except RuntimeError as exc:
                    # It died again or hangs: the next turn of the loop deals with it.
                    report(f"{child.name} not ready after its restart: {exc}")
                else:
                    report(f"{child.name} ready again")

    async def keep_nats_running(self, nats: NatsServerProcess) -> None:
        """Start nats-server again on the same port and store each time it dies."""
        started_at = time.monotonic()
        while True:
            while nats.running:
                if await self.pause(NATS_POLL_SECONDS):
                    return
            if self.stopping.is_set():
                return
            self.nats_crashes = crash_count(self.nats_crashes, time.monotonic() - started_at)
            delay = restart_delay(self.nats_crashes)
            report(
                f"nats-server exited; restarting it on {nats.url} with its store in "
                f"{nats.store_dir} in {delay:.0f} s (crash {self.nats_crashes} in a row)"
            )
            if await self.pause(delay):
                return
            started_at = time.monotonic()
            try:
                await nats.start()
            except Exception as exc:  # its port taken, its store unreadable: try again
                report(f"nats-server did not start again: {exc}")
                continue
            self.record_children()
            report(f"nats-server restarted (pid {nats.pid}); the services reconnect by themselves")

    async def stop(self) -> None:
        """Services first, then the simulator, then NATS; SIGKILL whatever overstays."""
        self.stopping.set()
        services = [c for c in self.children if c.name != "clustersim"]
        simulator = [c for c in self.children if c.name == "clustersim"]
        for group in (services, simulator):
            await asyncio.gather(*(stop_process(child) for child in group))
        for child in self.children:
            if child.listener is not None:
                child.listener.close()
        if self.nats is not None:
            await self.nats.stop()
        if self.args.kube == "real":
            await stop_real_kube(self.run_dir)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "children.json").unlink()


async def spawn(
    argv: list[str], env: dict[str, str], log_file: Path, listener: socket.socket | None
) -> asyncio.subprocess.Process:
    """Start a child with its output appended to `log_file`, in a session of its own (Ctrl-C
    reaches only the launcher, which stops children in order), inheriting `listener`."""
    with log_file.open("ab") as handle:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
            pass_fds=(listener.fileno(),) if listener is not None else (),
        )


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


def real_kube_environment(run_dir: Path, args: argparse.Namespace) -> dict[str, str]:
    """real_kube.sh's settings: its state under the run dir, the simulator's nodes, and
    every part of the control plane (whatever the caller's environment says: `make
    test-real-kube` exports the settings of a bare control plane for the conformance suite)."""
    return {
        **os.environ,
        "KUBE_STATE": str(run_dir / "real-kube"),
        "KUBE_NODES": str(args.nodes),
        "KUBE_TOPOLOGY": args.topology,
        "KUBE_SCHEDULER": "1",
        "KUBE_CRDS": "1",
        "KUBE_POD_STAGES": "1",
        "PYTHON": sys.executable,
    }


def exported(lines: str) -> dict[str, str]:
    """The `export KEY=value` lines a script printed."""
    values = {}
    for line in lines.splitlines():
        key, sep, value = line.removeprefix("export ").partition("=")
        if line.startswith("export ") and sep:
            values[key] = value
    return values


async def start_real_kube(run_dir: Path, args: argparse.Namespace) -> Path:
    """Build (or reuse) and start the real control plane; its admin kubeconfig. Its progress
    (and on a first build, how long each binary took) goes to the terminal."""
    report("starting the real control plane (tools/kube/real_kube.sh; the first build takes long)")
    process = await asyncio.create_subprocess_exec(
        str(REAL_KUBE_SCRIPT),
        "start",
        env=real_kube_environment(run_dir, args),
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"tools/kube/real_kube.sh start failed (exit {process.returncode})")
    kubeconfig = Path(exported(out.decode())["NODEFLOW_KUBE_KUBECONFIG"])
    # The services' own namespace, which the emulator starts with: the deploy manifest's, so it
    # carries the same Pod Security labels as on a real install.
    namespace = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={kubeconfig}",
        "apply",
        "-f",
        str(NAMESPACE_MANIFEST),
        stdout=asyncio.subprocess.DEVNULL,
    )
    if await namespace.wait() != 0:
        raise RuntimeError(f"could not create the namespace {INSTALL_NAMESPACE}")
    return kubeconfig


async def stop_real_kube(run_dir: Path) -> None:
    state = run_dir / "real-kube"
    if not state.exists():
        return
    process = await asyncio.create_subprocess_exec(
        str(REAL_KUBE_SCRIPT), "stop", env={**os.environ, "KUBE_STATE": str(state)}
    )
    await process.wait()


def report(line: str) -> None:
    """A line for the person running the stack (the services log JSON to their own files)."""
    print(f"[launcher] {line}", file=sys.stderr, flush=True)


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
                    f"{watching.result()} exited, and the cluster it held with it; "
                    "stopping the stack",
                    file=sys.stderr,
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
    # A real control plane (`--kube real`) whose launcher died: its components run in
    # sessions of their own, with their pids in its state directory.
    if (run_dir / "real-kube").exists():
        asyncio.run(stop_real_kube(run_dir))
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
    parser.add_argument("--topology", default="", help="default: grows with --nodes")
    parser.add_argument("--nats-port", type=int, default=DEFAULT_NATS_PORT)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-sim", action="store_true", help="use KUBECONFIG/SLURM_* from env")
    parser.add_argument(
        "--kube",
        choices=KUBE_BACKENDS,
        default="sim",
        help="sim: the simulator's API emulator; real: kube-apiserver and friends on loopback "
        "(tools/kube/real_kube.sh, needs Go), with the simulator's Slurm emulator",
    )
    parser.add_argument(
        "--slurm-version",
        help="the Slurm release the simulator emulates (clustersim --slurm-version: 24.11 or "
        "26.05); default: the simulator's, the newest",
    )
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
