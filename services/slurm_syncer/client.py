"""An aiohttp client for slurmrestd (data_parser v0.0.41 to v0.0.45): the only code that talks
to Slurm.

Before its first call the client chooses the API version (`negotiate`): the newest one both
slurmrestd and we speak, read from the paths of slurmrestd's `/openapi/v3` document, or, when
that document cannot be read, by asking `/slurm/<version>/ping/` of each of ours, newest first.
SLURM_API_VERSION (`api_version`) names the version instead; slurmrestd must still speak it.
A slurmrestd that speaks none of ours is a `SlurmVersionMismatch` naming both lists. What each
version reads and writes is its record in nodeflow_contracts.slurm_api.

Every answer is checked: the HTTP status, that the body is a JSON object, and its `errors`
list, since slurmrestd can answer 200 with an error inside. Connection failures, timeouts and
5xx answers are retried with backoff; a refused token is replaced once (a fresh mint, or the
token file read again) before the refusal is reported. An `https://` slurmrestd is verified
against the cluster's CA file, or the system trust store without one; a certificate that does
not verify is a connection failure (unreachable), never an answer.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import structlog

from nodeflow_bus import Backoff
from nodeflow_contracts.slurm_api import (
    API_VERSIONS,
    NODE_FIELDS_READ,
    NoCommonApiVersion,
    SlurmApiVersion,
    choose_version,
    versions_in_openapi,
)
from nodeflow_contracts.slurm_api import api_version as known_version
from slurm_syncer import metrics
from slurm_syncer.auth import CredentialsUnusable, TokenSource

log = structlog.get_logger("slurm_syncer.client")

OPENAPI_PATH = "/openapi/v3"
# slurmrestd refuses a missing token with 401; a token slurmctld rejects (expired, bad
# signature) comes back as 511 with error 1007 in `errors` (Slurm 24.11.5).
AUTH_FAILURE_STATUSES = frozenset({401, 403, 511})
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
Json = dict[str, Any]


class _ListedNode(msgspec.Struct):
    """What the syncer reads of a node in a listing (`nodestate.parse_node` judges the
    values, hence Any); the other sixty-odd fields of each entry are skipped while decoding:
    at 10,000 nodes the whole entries were the syncer's peak memory during a poll. Its fields
    are NODE_FIELDS_READ, which every version's node entry has (checked at import)."""

    name: Any = msgspec.UNSET
    state: Any = msgspec.UNSET
    reason: Any = msgspec.UNSET
    reason_set_by_user: Any = msgspec.UNSET
    reason_changed_at: Any = msgspec.UNSET
    cpus: Any = msgspec.UNSET
    alloc_cpus: Any = msgspec.UNSET
    reservation: Any = msgspec.UNSET

    def as_json(self) -> Json:
        return {
            name: value
            for name in self.__struct_fields__
            if (value := getattr(self, name)) is not msgspec.UNSET
        }


class _NodeListing(msgspec.Struct):
    """A `GET /nodes` answer as far as the syncer reads it. An entry that is not an object
    is kept as it is (parse_node reports it malformed)."""

    nodes: list[_ListedNode | list[Any] | str | int | float | bool | None] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    errors: Any = msgspec.UNSET
    warnings: Any = msgspec.UNSET


_NODE_LISTING = msgspec.json.Decoder(_NodeListing)
if _ListedNode.__struct_fields__ != NODE_FIELDS_READ:
    raise ImportError("_ListedNode must decode exactly slurm_api.NODE_FIELDS_READ")


def decode_body(data: bytes, *, node_listing: bool = False) -> Any:
    """The JSON of an answer, None when it is empty or not JSON. With `node_listing`, of each
    node only the fields the syncer reads; an answer that is not shaped like a listing (an
    error page, a body that is not an object) is decoded whole, for the checks to judge."""
    if not data.strip():
        return None
    if node_listing:
        try:
            listing = _NODE_LISTING.decode(data)
        except msgspec.DecodeError:
            pass
        else:
            body: Json = {
                name: value
                for name in ("errors", "warnings")
                if (value := getattr(listing, name)) is not msgspec.UNSET
            }
            if not isinstance(listing.nodes, msgspec.UnsetType):
                body["nodes"] = [
                    item.as_json() if isinstance(item, _ListedNode) else item
                    for item in listing.nodes
                ]
            return body
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


class SlurmError(Exception):
    """A Slurm call that did not succeed."""

    kind = "error"

    def __init__(self, cluster: str, message: str) -> None:
        self.cluster = cluster
        super().__init__(f"slurm cluster {cluster}: {message}")


class SlurmUnreachable(SlurmError):
    """No usable answer: connection refused, timeout, or slurmrestd/slurmctld unavailable."""

    kind = "unreachable"


class SlurmApiError(SlurmError):
    """slurmrestd answered with an error (in `errors`, or an HTTP error status)."""

    kind = "api"

    def __init__(self, cluster: str, status: int, errors: list[Any], what: str) -> None:
        self.status = status
        self.errors = errors
        super().__init__(cluster, f"{what}: HTTP {status}: {describe_errors(errors)}")


class SlurmAuthError(SlurmApiError):
    kind = "auth"


class SlurmMalformedResponse(SlurmError):
    """An answer that is not the JSON object slurmrestd sends."""

    kind = "malformed"


class SlurmVersionMismatch(SlurmError):
    """slurmrestd speaks none of the API versions we speak (or not SLURM_API_VERSION)."""

    kind = "version"

    def __init__(self, cluster: str, mismatch: NoCommonApiVersion) -> None:
        self.mismatch = mismatch
        super().__init__(cluster, str(mismatch))


def describe_errors(errors: list[Any]) -> str:
    parts = []
    for entry in errors:
        if isinstance(entry, dict):
            text = str(entry.get("description") or entry.get("error") or entry)
            number = entry.get("error_number")
            parts.append(f"{text} ({number})" if number else text)
        else:
            parts.append(str(entry))
    return "; ".join(parts) or "no error detail"


def slurm_ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verify slurmrestd (hostname included) against `ca_file`, or the system store when None.
    Raises OSError/ssl.SSLError when the file cannot be read or holds no certificate."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def is_retryable_status(status: int) -> bool:
    return status >= 500 or status in (408, 429)


@dataclass(frozen=True)
class ClientOptions:
    timeout_seconds: float = 10.0
    attempts: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=2.0))
    max_connections: int = 32


class _Retry(Exception):
    def __init__(self, error: SlurmError) -> None:
        self.error = error


class SlurmClient:
    """Usage: `client = SlurmClient("a", url, tokens); nodes = await client.list_nodes()`;
    `await client.close()` at the end."""

    def __init__(
        self,
        cluster: str,
        base_url: str,
        tokens: TokenSource,
        options: ClientOptions | None = None,
        *,
        ca_file: Path | None = None,
        api_version: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.base_url = base_url.rstrip("/")
        self.tokens = tokens
        self.options = options or ClientOptions()
        # SLURM_API_VERSION: checked now (a version we do not speak stops the service at
        # start); slurmrestd is asked whether it speaks it on the first call.
        self.wanted_version = known_version(api_version).name if api_version else None
        self._version: SlurmApiVersion | None = None
        self._negotiating = asyncio.Lock()
        # Built now, so that an unreadable CA file stops the service at start.
        self._ssl = slurm_ssl_context(ca_file)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.options.timeout_seconds),
                connector=aiohttp.TCPConnector(limit=self.options.max_connections, ssl=self._ssl),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- the API version --------------------------------------------------------------------

    @property
    def version(self) -> SlurmApiVersion | None:
        """The version chosen by `negotiate`, None before."""
        return self._version

    async def negotiate(self) -> SlurmApiVersion:
        """The API version to speak, chosen once: see the module's docstring. Unreachable
        slurmrestd: SlurmUnreachable, and the next call asks again."""
        if self._version is not None:
            return self._version
        async with self._negotiating:
            if self._version is None:
                served = await self._served_versions()
                try:
                    chosen = choose_version(served, self.wanted_version)
                except NoCommonApiVersion as exc:
                    raise SlurmVersionMismatch(self.cluster, exc) from None
                log.info(
                    "slurm.api_version",
                    cluster=self.cluster,
                    version=chosen.name,
                    served=sorted(served),
                    wanted=self.wanted_version,
                )
                self._version = chosen
            return self._version

    async def _served_versions(self) -> frozenset[str]:
        try:
            document = await self._call("GET", OPENAPI_PATH, what="read openapi")
        except SlurmAuthError:
            raise
        except (SlurmApiError, SlurmMalformedResponse) as exc:
            # No readable document (a proxy that only passes /slurm/, an old slurmrestd):
            # ask each version's ping instead.
            log.info("slurm.openapi_unreadable", cluster=self.cluster, error=str(exc))
        else:
            served = versions_in_openapi(document)
            if served:
                return served
        candidates = [self.wanted_version] if self.wanted_version else list(API_VERSIONS)
        for name in sorted(candidates, key=lambda n: API_VERSIONS[n].number, reverse=True):
            try:
                await self._call("GET", f"{API_VERSIONS[name].prefix}/ping/", what="ping")
            except SlurmAuthError:
                raise
            except SlurmApiError as exc:
                if exc.status == 404:  # slurmrestd has no path of that version
                    continue
                raise
            # The newest of ours that answers is the one we would choose anyway.
            return frozenset({name})
        return frozenset()

    # --- the calls the syncer makes ----------------------------------------------------------

    async def ping(self) -> list[Json]:
        body = await self.request("GET", "/ping", what="ping", retry_errors_in_body=True)
        return _list_of_objects(self.cluster, body, "pings")

    async def list_nodes(self) -> list[Json]:
        """Every node, each with only the fields the syncer reads (`_ListedNode`)."""
        body = await self.request(
            "GET", "/nodes", what="list nodes", retry_errors_in_body=True, node_listing=True
        )
        return _list_of_objects(self.cluster, body, "nodes")

    async def get_node(self, name: str) -> Json | None:
        """The node, or None when Slurm has no node of that name."""
        try:
            body = await self.request("GET", f"/node/{name}", what=f"get node {name}")
        except SlurmApiError as exc:
            if _says_no_such_node(exc):
                return None
            raise
        nodes = _list_of_objects(self.cluster, body, "nodes")
        for node in nodes:
            if node.get("name") == name:
                return node
        return None

    async def update_node(self, name: str, states: list[str], reason: str | None = None) -> None:
        version = await self.negotiate()
        payload = version.node_update_body(states, reason)
        await self.request("POST", f"/node/{name}", payload, what=f"update node {name}")

    async def delete_node(self, name: str) -> bool:
        """Delete the node's record (`DELETE /node/{name}`); False when Slurm had no such node.
        Slurm refuses a node that is not dynamic or still runs work (SlurmApiError)."""
        try:
            await self.request("DELETE", f"/node/{name}", what=f"delete node {name}")
        except SlurmApiError as exc:
            if _says_no_such_node(exc):
                return False
            raise
        return True

    async def list_reservations(self) -> list[Json]:
        """Every reservation (`GET /reservations`, served by every version)."""
        body = await self.request(
            "GET", "/reservations", what="list reservations", retry_errors_in_body=True
        )
        return _list_of_objects(self.cluster, body, "reservations")

    async def create_reservation(
        self, name: str, nodes: list[str], start: int, minutes: int, flags: list[str]
    ) -> None:
        """`POST /reservation` (v0.0.43 on); ValueError before sending when the version cannot
        (`SlurmApiVersion.reservation_body`)."""
        version = await self.negotiate()
        payload = version.reservation_body(name, nodes, start, minutes, flags)
        await self.request("POST", "/reservation", payload, what=f"create reservation {name}")

    async def delete_reservation(self, name: str) -> None:
        """`DELETE /reservation/{name}` (v0.0.43 on)."""
        version = await self.negotiate()
        if not version.writes_reservations:
            raise ValueError(f"slurmrestd {version.name} cannot delete reservations")
        await self.request("DELETE", f"/reservation/{name}", what=f"delete reservation {name}")

    async def list_jobs(self, *, attempts: int | None = None) -> list[Json]:
        """Every job slurmctld still holds (`GET /jobs`), whatever its state (jobs.py);
        `attempts` (None: the client's) bounds the tries."""
        body = await self.request(
            "GET", "/jobs", what="list jobs", retry_errors_in_body=True, attempts=attempts
        )
        return _list_of_objects(self.cluster, body, "jobs")

    # --- one request, checked and retried ----------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        payload: Json | None = None,
        *,
        what: str,
        retry_errors_in_body: bool = False,
        node_listing: bool = False,
        attempts: int | None = None,
    ) -> Json:
        """One call of the `/slurm/` API, `path` under the chosen version's prefix, tried up
        to `attempts` times (None: the client's `attempts`)."""
        version = await self.negotiate()
        return await self._call(
            method,
            version.prefix + path,
            payload,
            what=what,
            retry_errors_in_body=retry_errors_in_body,
            node_listing=node_listing,
            attempts=attempts,
        )

    async def _call(
        self,
        method: str,
        url_path: str,
        payload: Json | None = None,
        *,
        what: str,
        retry_errors_in_body: bool = False,
        node_listing: bool = False,
        attempts: int | None = None,
    ) -> Json:
        attempts = self.options.attempts if attempts is None else attempts
        refreshed_token = False
        attempt = 0
        while True:
            attempt += 1
            try:
                body = await self._once(
                    method, url_path, payload, what, retry_errors_in_body, node_listing
                )
                metrics.SLURM_REQUESTS.labels(self.cluster, what.split(" ")[0], "ok").inc()
                return body
            except SlurmAuthError as exc:
                metrics.SLURM_REQUESTS.labels(self.cluster, what.split(" ")[0], exc.kind).inc()
                if refreshed_token:
                    raise
                # The token may have expired or been rotated: one more try with a fresh one.
                refreshed_token = True
                self.tokens.invalidate()
                log.info("slurm.token_refused", cluster=self.cluster, error=str(exc))
                attempt -= 1
            except _Retry as retry:
                error = retry.error
                metrics.SLURM_REQUESTS.labels(self.cluster, what.split(" ")[0], error.kind).inc()
                if attempt >= attempts:
                    raise error from None
                delay = self.options.backoff.delay(attempt)
                log.warning(
                    "slurm.request_retry",
                    cluster=self.cluster,
                    what=what,
                    attempt=attempt,
                    retry_in=delay,
                    error=str(error),
                )
                await asyncio.sleep(delay)
            except SlurmError as exc:
                metrics.SLURM_REQUESTS.labels(self.cluster, what.split(" ")[0], exc.kind).inc()
                raise

    async def _once(
        self,
        method: str,
        url_path: str,
        payload: Json | None,
        what: str,
        retry_errors_in_body: bool,
        node_listing: bool = False,
    ) -> Json:
        try:
            token = self.tokens.token()
        except OSError as exc:
            raise SlurmAuthError(
                self.cluster, 0, [f"cannot read credentials: {exc}"], what
            ) from exc
        except CredentialsUnusable as exc:
            raise SlurmAuthError(self.cluster, 0, [str(exc)], what) from exc
        headers = {
            "X-SLURM-USER-NAME": self.tokens.user,
            "X-SLURM-USER-TOKEN": token,
            "Accept": "application/json",
        }
        url = f"{self.base_url}{url_path}"
        try:
            try:
                async with self._get_session().request(
                    method, url, json=payload, headers=headers
                ) as response:
                    status = response.status
                    data = await response.read()
            except aiohttp.ClientResponseError as exc:
                if not is_doubled_answer(exc):
                    raise
                # Slurm 26.05.5: an error answer followed by a second one; ask again and read
                # only the first, so a refused token or a refused update is seen as such.
                status, data = await first_answer(
                    method, url, headers, payload, self._ssl, self.options.timeout_seconds
                )
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise _Retry(
                SlurmUnreachable(self.cluster, f"{what}: {type(exc).__name__}: {exc}")
            ) from exc
        body = decode_body(data, node_listing=node_listing)
        text = data[:200].decode("utf-8", "replace")
        return self._check(status, body, text, what, retry_errors_in_body)

    def _check(
        self, status: int, body: Any, text: str, what: str, retry_errors_in_body: bool
    ) -> Json:
        """Judge an answer: `body` its decoded JSON (None: empty or not JSON), `text` the
        start of it as sent, for the errors."""
        errors: list[Any] = []
        if isinstance(body, dict):
            raw_errors = body.get("errors", [])
            if not isinstance(raw_errors, list):
                raise SlurmMalformedResponse(self.cluster, f"{what}: `errors` is not a list")
            errors = raw_errors
        if status in AUTH_FAILURE_STATUSES or any(
            isinstance(e, dict) and e.get("error_number") == SLURM_PROTOCOL_AUTHENTICATION_ERROR
            for e in errors
        ):
            raise SlurmAuthError(self.cluster, status, errors or [text[:200]], what)
        if status >= 400:
            detail = errors or [text[:200] or "no body"]
            error: SlurmError = SlurmApiError(self.cluster, status, detail, what)
            if status in (502, 503, 504):
                # slurmrestd is up but slurmctld is not (or a proxy answers): unreachable.
                error = SlurmUnreachable(self.cluster, f"{what}: HTTP {status}: {detail}")
            if is_retryable_status(status):
                raise _Retry(error)
            raise error
        if not isinstance(body, dict):
            raise SlurmMalformedResponse(
                self.cluster, f"{what}: HTTP {status} with a body that is not a JSON object"
            )
        if errors:
            error = SlurmApiError(self.cluster, status, errors, what)
            if retry_errors_in_body:
                raise _Retry(error)
            raise error
        warnings = body.get("warnings")
        if isinstance(warnings, list) and warnings:
            log.debug("slurm.warnings", cluster=self.cluster, what=what, warnings=warnings)
        return body


# slurmrestd 26.05.5 sends every non-2xx answer twice on one connection: the JSON answer with
# `Connection: Close`, then a text/plain one of the same status. aiohttp refuses the whole
# exchange with this message (as an HTTP 400 of its own).
_DOUBLED_ANSWER = "Data after `Connection: close`"
# The most of a first answer without Content-Length that is read (to the end of the stream).
_FIRST_ANSWER_LIMIT = 16 * 1024 * 1024


def is_doubled_answer(error: aiohttp.ClientResponseError) -> bool:
    return str(error.message).startswith(_DOUBLED_ANSWER)


async def first_answer(
    method: str,
    url: str,
    headers: Mapping[str, str],
    payload: Json | None,
    ssl_context: ssl.SSLContext,
    timeout: float,
) -> tuple[int, bytes]:
    """Send one request on a connection of its own and read only the first answer: its status
    and body (by Content-Length, else to the end of the stream). ValueError when the answer
    cannot be read so (chunked, or no HTTP status line)."""
    target = urllib.parse.urlsplit(url)
    tls = target.scheme == "https"
    host = target.hostname or ""
    port = target.port or (443 if tls else 80)
    path = target.path + (f"?{target.query}" if target.query else "")
    body = msgspec.json.encode(payload) if payload is not None else b""
    lines = [
        f"{method} {path or '/'} HTTP/1.1",
        f"Host: {target.netloc}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
        f"Content-Length: {len(body)}",
    ]
    if payload is not None:
        lines.append("Content-Type: application/json")
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl_context if tls else None, server_hostname=host if tls else None
        )
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status_line, *header_lines = head.strip().split("\r\n")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
            fields = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in header_lines)
            }
            if "chunked" in fields.get("transfer-encoding", "").lower():
                raise ValueError("a chunked first answer is not read")
            length = fields.get("content-length")
            if length is not None and length.isdigit():
                data = await reader.readexactly(int(length))
            else:
                data = await reader.read(_FIRST_ANSWER_LIMIT)
            return int(parts[1]), data
        finally:
            writer.close()


def _list_of_objects(cluster: str, body: Json, field: str) -> list[Json]:
    value = body.get(field)
    if not isinstance(value, list):
        raise SlurmMalformedResponse(cluster, f"answer has no `{field}` list")
    return [item if isinstance(item, dict) else {"_malformed": item} for item in value]


def _says_no_such_node(error: SlurmApiError) -> bool:
    text = describe_errors(error.errors).lower()
    return "failure to query node" in text or "invalid node name" in text
