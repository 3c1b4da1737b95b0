"""The one HTTP server of a service: /metrics, /healthz and /readyz."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

# A readiness check returns None when ready, else why not.
ReadinessCheck = Callable[[], str | None]


@dataclass
class Health:
    """What /healthz and /readyz report.

    Liveness is about the process (is the event loop serving?), readiness about whether the
    service can do its work now (NATS connected, views loaded, not shutting down).
    """

    checks: dict[str, ReadinessCheck] = field(default_factory=dict)
    shutting_down: bool = False

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        self.checks[name] = check

    def not_ready_reasons(self) -> dict[str, str]:
        reasons = {name: why for name, check in self.checks.items() if (why := check())}
        if self.shutting_down:
            reasons["shutdown"] = "shutting down"
        return reasons


def build_app(
    service: str, health: Health, registry: CollectorRegistry = REGISTRY
) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"service": service, "status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        reasons = health.not_ready_reasons()
        if reasons:
            return web.json_response(
                {"service": service, "status": "not-ready", "reasons": reasons}, status=503
            )
        return web.json_response({"service": service, "status": "ready"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_http(
    app: web.Application, host: str, port: int, listen_fd: int = -1
) -> web.AppRunner:
    """Serve `app` on host:port, or on the listening socket `listen_fd` when one was
    inherited (then host and port only name it in logs)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site: web.BaseSite
    if listen_fd >= 0:
        site = web.SockSite(runner, socket.socket(fileno=listen_fd))
    else:
        site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
