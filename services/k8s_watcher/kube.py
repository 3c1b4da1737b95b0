"""The Kubernetes API adapter: kubernetes-asyncio's ApiClient (kubeconfig or in-cluster auth,
TLS), a client-side rate limit, API health for readiness, and line-by-line watch streams.

Every call goes through `ApiClient.call_api` with `_preload_content=False`, so the same code
talks to a real kube-apiserver and to the emulator, and responses are decoded with msgspec.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import structlog
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from yarl import URL

from k8s_watcher.ratelimit import TokenBucket
from nodeflow_bus import Backoff
from nodeflow_bus.tasks import cancel_and_wait

log = structlog.get_logger("k8s_watcher.kube")

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

_decoder = msgspec.json.Decoder()


class ApiUnavailable(Exception):
    """No HTTP answer: connection refused or reset, DNS, TLS, timeout."""


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """The API server's message (a Status object's `message`), verbatim."""
        if isinstance(self.body, dict) and self.body.get("kind") == "Status":
            return str(self.body.get("message") or self.body.get("reason") or "")
        if isinstance(self.body, str):
            return self.body
        return ""

    @property
    def reason(self) -> str:
        if isinstance(self.body, dict) and self.body.get("kind") == "Status":
            return str(self.body.get("reason") or "")
        return ""


class ApiStatusError(Exception):
    """An HTTP error answer where a success was needed (list, watch)."""

    def __init__(self, response: ApiResponse) -> None:
        self.response = response
        super().__init__(f"HTTP {response.status}: {response.message}")


class WatchExpired(Exception):
    """410 Gone: the requested resourceVersion is no longer available; relist."""


def decode_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", "replace")


class ApiHealth:
    """Whether the API server answers, for readiness and for commands to wait on.

    Unknown until the first answer. Any HTTP answer below 500 means reachable; a connection
    failure or a 5xx marks it unavailable until the next good answer.
    """

    def __init__(self) -> None:
        self._available = asyncio.Event()
        self._reason = "no answer from the Kubernetes API yet"
        self.failures = 0

    @property
    def available(self) -> bool:
        return self._available.is_set()

    def record_success(self) -> None:
        if not self._available.is_set():
            log.info("kube.available")
        self._available.set()
        self.failures = 0

    def record_failure(self, reason: str) -> None:
        self.failures += 1
        if self._available.is_set():
            log.warning("kube.unavailable", reason=reason)
        self._reason = reason
        self._available.clear()

    def not_ready_reason(self) -> str | None:
        return None if self._available.is_set() else f"Kubernetes API: {self._reason}"

    async def wait_available(self) -> None:
        await self._available.wait()


async def load_api_client(kubeconfig: str, context: str = "") -> k8s_client.ApiClient:
    """An ApiClient from a kubeconfig path, or in-cluster config when there is none."""
    configuration = k8s_client.Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await k8s_config.load_kube_config(
            config_file=kubeconfig or None,
            context=context or None,
            client_configuration=configuration,
        )
    # Watches hold a connection each; commands and list pages need their own.
    configuration.connection_pool_maxsize = 256
    if not configuration.proxy and configuration.host:
        proxy = env_proxy_for(configuration.host)
        if proxy is not None:
            configuration.proxy, authorization = proxy
            if authorization:
                configuration.proxy_headers = {"Proxy-Authorization": authorization}
    api = k8s_client.ApiClient(configuration)
    # kubernetes-asyncio opens its aiohttp session with trust_env=True, which makes aiohttp
    # look up the proxy environment and ~/.netrc in a worker thread on *every* request: a
    # thread hop and a file read per API call, a third of k8s-watcher's CPU when it applies
    # hundreds of commands a second. The proxy environment was resolved once above (as
    # client-go does); netrc never applies to the Kubernetes API (bearer token, client cert).
    session: aiohttp.ClientSession = api.rest_client.pool_manager
    session._trust_env = False
    return api


def env_proxy_for(host: str) -> tuple[str, str] | None:
    """The HTTP(S)_PROXY that applies to the API server URL (NO_PROXY honoured), if any, and
    its Proxy-Authorization value ("" without credentials)."""
    try:
        proxy, auth = get_env_proxy_for_url(URL(host))
    except LookupError:
        return None
    return str(proxy), auth.encode() if auth is not None else ""


class KubeClient:
    """Requests to the API server, and its health: every answer updates `health`, and a probe
    (GET /version, authenticated like every call) keeps it current when no other call is made.

    `probe_interval`: while the API answers, the longest it may go without an answer before
    the probe asks; None probes only while it is unavailable. A replica that only applies
    commands (a standby of the mirror) makes no call between commands: without the probe its
    readiness would stay "no answer yet" and a rollout or a node drain would wait for it forever.
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        limiter: TokenBucket,
        health: ApiHealth | None = None,
        request_timeout: float = 30.0,
        probe_backoff: Backoff | None = None,
        probe_interval: float | None = None,
    ) -> None:
        if probe_interval is not None and probe_interval <= 0:
            raise ValueError("probe_interval must be positive")
        self.api = api
        self.limiter = limiter
        self.health = health or ApiHealth()
        self.request_timeout = request_timeout
        self.probe_interval = probe_interval
        self._probe_backoff = probe_backoff or Backoff(initial=0.2, maximum=5.0)
        self._probe: asyncio.Task[None] | None = None
        self._last_answer: float | None = None
        # Set on a failure, so that a probe waiting out `probe_interval` starts its backoff.
        self._unavailable = asyncio.Event()
        self._closed = False
        if probe_interval is not None:
            self._start_probe()

    async def close(self) -> None:
        self._closed = True
        if self._probe is not None:
            await cancel_and_wait(self._probe)
        await self.api.close()

    # --- requests ----------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, Any]],
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout | float,
    ) -> aiohttp.ClientResponse:
        await self.limiter.acquire()
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
                path,
                method,
                query_params=list(query),
                header_params={"Content-Type": content_type, "Accept": JSON},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            raise ApiUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self._answered(response.status, f"{method} {path}")
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str = JSON,
    ) -> ApiResponse:
        response = await self._send(method, path, query, body, content_type, self.request_timeout)
        try:
            raw = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            raise ApiUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        finally:
            response.release()
        return ApiResponse(response.status, decode_body(raw))

    async def watch(
        self, path: str, query: Sequence[tuple[str, Any]], *, read_timeout: float
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Open a watch and yield its events in batches: each batch is every complete line
        that had arrived when it was read, so a burst is handled (and published) together.

        Raises ApiStatusError if the watch is refused, ApiUnavailable if the connection fails.
        """
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.request_timeout, sock_read=read_timeout
        )
        response = await self._send("GET", path, [("watch", "true"), *query], None, JSON, timeout)
        try:
            if response.status != 200:
                raw = await response.read()
                raise ApiStatusError(ApiResponse(response.status, decode_body(raw)))
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buffer = buffer.split(b"\n")
                batch = [_decoder.decode(line) for line in lines if line.strip()]
                if batch:
                    yield batch
            if buffer.strip():
                yield [_decoder.decode(buffer)]
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiUnavailable(f"watch {path}: {type(exc).__name__}: {exc}") from exc
        finally:
            response.close()

    # --- availability --------------------------------------------------------------------

    def _answered(self, status: int, request: str) -> None:
        """Any HTTP answer below 500 means the API server is there (ApiHealth)."""
        self._last_answer = time.monotonic()
        if status >= 500:
            self._failed(f"HTTP {status} on {request}")
        else:
            self.health.record_success()

    def _failed(self, reason: str) -> None:
        self.health.record_failure(reason)
        self._unavailable.set()
        self._start_probe()

    def _start_probe(self) -> None:
        if (self._probe is None or self._probe.done()) and not self._closed:
            self._probe = asyncio.create_task(self._probe_loop(), name="kube api probe")

    async def _probe_loop(self) -> None:
        """Ask /version while the API server is unavailable (or has never answered), at once
        then with backoff, so that waiting commands resume once it is back even when no watch
        is retrying at that moment; and, with `probe_interval`, whenever that long has passed
        without an answer to any call (the mirror's lists and watches count, so a busy replica
        is not probed), so a replica that makes no call of its own still knows."""
        attempt = 0
        while not self._closed:
            if self.health.available:
                if self.probe_interval is None:
                    return
                attempt = 0
                last = self._last_answer if self._last_answer is not None else 0.0
                wait = last + self.probe_interval - time.monotonic()
                if wait > 0:
                    self._unavailable.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._unavailable.wait(), wait)
                    continue  # another call may have answered or failed meanwhile
            elif attempt:
                await asyncio.sleep(self._probe_backoff.delay(attempt))
                if self.health.available:
                    continue
            attempt += 1
            await self._probe_once(attempt)

    async def _probe_once(self, attempt: int) -> None:
        started = time.monotonic()
        try:
            await self.limiter.acquire()
            response = await self.api.call_api(
                "/version",
                "GET",
                header_params={"Accept": JSON},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
            response.release()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("kube.probe_failed", attempt=attempt, error=repr(exc))
            self.health.record_failure(f"{type(exc).__name__}: {exc}")
            return
        if response.status < 500 and not self.health.available:
            log.info("kube.probe_ok", seconds=round(time.monotonic() - started, 3))
        self._last_answer = time.monotonic()
        if response.status >= 500:
            self.health.record_failure(f"HTTP {response.status} on GET /version")
        else:
            self.health.record_success()
