"""aiohttp front end of the Kubernetes API emulator (what kubernetes-asyncio and kubectl use).

``build_app(store)`` returns the Application; ``serve(store)`` is an async context manager that
runs it on 127.0.0.1 on a free port and writes a kubeconfig (no auth)::

    async with serve(Store(), kubeconfig_path=path) as running:
        running.url, running.port, running.kubeconfig_path

Besides the Kubernetes API the app exposes a fault-injection admin API:

* ``GET /_sim/readyz`` -> ``ok``
* ``GET /_sim/faults`` -> current fault settings
* ``POST /_sim/faults`` with JSON, any of: ``{"drop_watches": true}`` (end every open watch now),
  ``{"gone_next_watches": 1}`` (the next N watch requests get a 410 ERROR event),
  ``{"error_rate": 0.2, "error_code": 500|429, "verbs": ["list"], "resources": ["pods"]}``
  (fail that fraction of matching requests), ``{"error_count": 3, ...}`` (fail the next N
  matching requests), ``{"latency_ms": 50}`` (delay every API request)
* ``DELETE /_sim/faults`` -> clear all faults
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog
import yaml
from aiohttp import web

from clustersim.kube import errors, protobuf, tables
from clustersim.kube.errors import ApiError, BadRequest, Cause, MethodNotAllowed, NotFound
from clustersim.kube.objects import Obj, deep_copy
from clustersim.kube.patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from clustersim.kube.portforward import serve_port_forward
from clustersim.kube.resources import ResourceInfo
from clustersim.kube.store import Store, WatchEvent

log = structlog.get_logger("clustersim.kube")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
STORE_KEY: web.AppKey[Store] = web.AppKey("store", Store)
FAULTS_KEY: web.AppKey[Faults] = web.AppKey("faults", object)  # type: ignore[arg-type]

KUBE_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-clustersim",
    "gitCommit": "clustersim",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


#: seconds aiohttp waits for in-flight handlers when the server stops
SHUTDOWN_TIMEOUT = 2.0
#: seconds a list waits for a resourceVersion newer than the store (the watch cache's 3 s)
TOO_LARGE_RV_WAIT = 3.0


@dataclass
class Faults:
    """Fault-injection settings (see module docstring)."""

    error_rate: float = 0.0
    error_count: int = 0
    error_code: int = 500
    verbs: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    latency_ms: float = 0.0
    gone_next_watches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "error_rate": self.error_rate,
            "error_count": self.error_count,
            "error_code": self.error_code,
            "verbs": self.verbs,
            "resources": self.resources,
            "latency_ms": self.latency_ms,
            "gone_next_watches": self.gone_next_watches,
        }

    def scoped(self, verb: str, info: ResourceInfo) -> bool:
        if self.verbs and verb not in self.verbs:
            return False
        names = {info.key, info.plural, info.kind}
        return not self.resources or bool(names & set(self.resources))

    def injected_error(self, verb: str, info: ResourceInfo) -> ApiError | None:
        if not self.scoped(verb, info):
            return None
        hit = False
        if self.error_count > 0:
            self.error_count -= 1
            hit = True
        elif self.error_rate > 0 and random.random() < self.error_rate:
            hit = True
        if not hit:
            return None
        if self.error_code == 429:
            return errors.TooManyRequests(
                "the server has received too many requests and has asked us to try again "
                "later (injected)",
                retry_after_seconds=1,
            )
        return errors.InternalError(f"injected fault ({verb} {info.key})", code=self.error_code)


# --------------------------------------------------------------------------- responses


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    response = json_response(err.status(), err.code)
    if err.retry_after_seconds is not None:
        response.headers["Retry-After"] = str(err.retry_after_seconds)
    return response


def serves_group(store: Store, group: str) -> bool:
    return any(info.group == group for info in store.resources())


def page_not_found() -> web.Response:
    """kube-apiserver's answer under /apis/<group> for a group it does not serve: no API
    handler is behind the path, so its mux answers in plain text, not with a Status."""
    return web.Response(status=404, text="404 page not found\n")


def success_status(info: ResourceInfo, obj: Obj) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": obj["metadata"]["name"],
            "group": info.group,
            "kind": info.plural,
            "uid": obj["metadata"].get("uid"),
        },
    }


def wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first


# --------------------------------------------------------------------------- discovery


def _api_resource(info: ResourceInfo) -> list[Obj]:
    main: Obj = {
        "name": info.plural,
        "singularName": info.singular,
        "namespaced": info.namespaced,
        "kind": info.kind,
        "verbs": list(info.verbs),
        "storageVersionHash": "",
    }
    if info.short_names:
        main["shortNames"] = list(info.short_names)
    if info.categories:
        main["categories"] = list(info.categories)
    out = [main]
    if "status" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/status",
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    if "scale" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/scale",
                "singularName": "",
                "namespaced": info.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }
        )
    if "eviction" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/eviction",
                "singularName": "",
                "namespaced": True,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }
        )
    if "log" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            }
        )
    if "portforward" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/portforward",
                "singularName": "",
                "namespaced": True,
                "kind": "PodPortForwardOptions",
                "verbs": ["create", "get"],
            }
        )
    if "binding" in info.subresources:
        out.append(
            {
                "name": f"{info.plural}/binding",
                "singularName": "",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    return out


def resource_list(store: Store, group: str, version: str) -> Obj:
    resources: list[Obj] = []
    for info in store.resources():
        if info.group == group and version in info.versions:
            resources.extend(_api_resource(info))
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def api_groups(store: Store) -> list[Obj]:
    groups: dict[str, list[str]] = {}
    for info in store.resources():
        if not info.group:
            continue
        versions = groups.setdefault(info.group, [])
        for v in info.versions:
            if v not in versions:
                versions.append(v)
    out = []
    for group, versions in groups.items():
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        out.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return out


# --------------------------------------------------------------------------- openapi v3
# kubectl reads /openapi/v3 to learn whether the server validates fields itself (the PATCH
# operation of a kind lists a ``fieldValidation`` query parameter).  Full schemas are not
# served: kubectl then falls back to its compiled-in types for strategic merge patches.


def _group_versions(store: Store) -> dict[str, list[ResourceInfo]]:
    out: dict[str, list[ResourceInfo]] = {}
    for info in store.resources():
        for version in info.versions:
            gv = f"apis/{info.group}/{version}" if info.group else f"api/{version}"
            out.setdefault(gv, []).append(info)
    return out


def openapi_v3_index(store: Store) -> Obj:
    paths = {}
    for gv, infos in _group_versions(store).items():
        digest = hashlib.sha256(",".join(sorted(i.key for i in infos)).encode()).hexdigest()
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest[:32].upper()}"}
    return {"paths": paths}


def openapi_v3_document(store: Store, gv: str) -> Obj | None:
    infos = _group_versions(store).get(gv)
    if not infos:
        return None
    version = gv.rsplit("/", 1)[1]
    paths: Obj = {}
    for info in infos:
        scope = "/namespaces/{namespace}" if info.namespaced else ""
        path = f"/{gv}{scope}/{info.plural}/{{name}}"
        paths[path] = {
            "patch": {
                "operationId": f"patch{info.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {
                    "group": info.group,
                    "version": version,
                    "kind": info.kind,
                },
                "parameters": [
                    {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "content": {
                        MERGE_PATCH: {"schema": {"type": "object"}},
                        JSON_PATCH: {"schema": {"type": "object"}},
                        APPLY_PATCH: {"schema": {"type": "object"}},
                    }
                },
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


# --------------------------------------------------------------------------- routing


@dataclass
class Target:
    info: ResourceInfo
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_target(store: Store, group: str, version: str, rest: str) -> tuple[Target, bool]:
    parts = [p for p in rest.split("/") if p]
    watch_path = False
    if parts and parts[0] == "watch":
        watch_path = True
        parts = parts[1:]
    namespace: str | None = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        candidate = store.find(group, version, parts[2])
        if candidate is not None and candidate.namespaced:
            namespace = parts[1]
            parts = parts[2:]
    if not parts or len(parts) > 3:
        raise NotFound("the server could not find the requested resource")
    info = store.find(group, version, parts[0])
    if info is None:
        raise NotFound("the server could not find the requested resource")
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    if (
        sub is not None
        and sub not in info.subresources
        and not (info.key == "namespaces" and sub == "finalize")
    ):
        raise NotFound("the server could not find the requested resource")
    return Target(info, version, namespace, name, sub), watch_path


def pod_log(pod: Obj, container: str | None) -> str:
    """pods/log: what a simulated container printed -- its command and, once it ended, its
    exit code -- so `kubectl logs` (and `kubectl logs job/<name>`) show a stage's output."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = spec.get("containers") or []
    # An init container's log is read by naming it (`kubectl logs -c`), as the kubelet serves.
    named = [*containers, *(spec.get("initContainers") or [])] if container else containers
    chosen = [c for c in named if container in (None, c.get("name"))]
    if not chosen:
        raise BadRequest(f"container {container} is not valid for pod {pod['metadata']['name']}")
    if container is None and len(containers) > 1:
        raise BadRequest(
            f"a container name must be specified for pod {pod['metadata']['name']}, choose one "
            f"of: [{' '.join(str(c.get('name')) for c in containers)}]"
        )
    found = chosen[0]
    states = {
        c.get("name"): c.get("state") or {}
        for c in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
    }
    state = states.get(found.get("name")) or {}
    if "running" not in state and "terminated" not in state:
        reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
        raise BadRequest(
            f'container "{found.get("name")}" in pod "{pod["metadata"]["name"]}" is waiting to '
            f"start: {reason}"
        )
    command = " ".join(str(a) for a in [*(found.get("command") or []), *(found.get("args") or [])])
    env = " ".join(f"{e.get('name')}={e.get('value', '')}" for e in found.get("env") or [])
    lines = [
        f"{found.get('image')} started on {spec.get('nodeName')}: {command or '(entrypoint)'}",
    ]
    if env:
        lines.append(f"environment: {env}")
    if "terminated" in state:
        ended = state["terminated"]
        lines.append(f"exited with code {ended.get('exitCode')} ({ended.get('reason')})")
    return "\n".join(lines) + "\n"


def _bool_param(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def _dry_run(request: web.Request, body: Obj | None = None) -> bool:
    if request.query.get("dryRun") == "All":
        return True
    return bool(body and body.get("dryRun") == ["All"])


def _decode_body(raw: bytes, content_type: str) -> Any:
    try:
        if content_type.startswith(protobuf.PROTOBUF):
            return protobuf.decode_body(raw)
        if "yaml" in content_type:
            return yaml.safe_load(raw)
        return _decoder.decode(raw)
    except protobuf.UnsupportedKind as exc:
        raise errors.UnsupportedMediaType(str(exc)) from exc
    except (msgspec.DecodeError, yaml.YAMLError, protobuf.ProtobufError) as exc:
        raise BadRequest(f"error decoding request body: {exc}") from exc


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise BadRequest("request body is empty")
    return _decode_body(raw, request.headers.get("Content-Type", "application/json"))


def _output(target: Target, obj: Obj) -> Obj:
    """Serve custom objects under the requested version (no conversion: same schema)."""
    if target.info.is_crd:
        wanted = target.info.api_version(target.version)
        if obj.get("apiVersion") != wanted:
            obj = dict(obj)
            obj["apiVersion"] = wanted
    return obj


class ApiHandler:
    def __init__(self, store: Store, faults: Faults) -> None:
        self.store = store
        self.faults = faults
        #: set when the app shuts down: watches opened from now on end at once, so a watch
        #: request that races the shutdown cannot keep the server waiting for its handler
        self.shutting_down = False

    def shut_down(self) -> int:
        """End every open watch and refuse to keep new ones open; returns how many ended."""
        self.shutting_down = True
        return self.store.close_all_watches()

    async def core(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "", "v1", request.match_info["rest"])

    async def grouped(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        if not serves_group(self.store, m["group"]):
            return page_not_found()
        return await self._dispatch(request, m["group"], m["version"], m["rest"])

    async def _dispatch(
        self, request: web.Request, group: str, version: str, rest: str
    ) -> web.StreamResponse:
        target, watch_path = _parse_target(self.store, group, version, rest)
        method = request.method
        watching = watch_path or _bool_param(request, "watch")
        verb = _verb(method, target, watching)
        if self.faults.latency_ms > 0:
            await asyncio.sleep(self.faults.latency_ms / 1000)
        injected = self.faults.injected_error(verb, target.info)
        if injected is not None:
            raise injected
        if structlog.is_configured():
            # Unconfigured structlog prints every level; per-request lines only when the
            # process set up logging (and its level filter) itself.
            log.debug("request", method=method, path=request.path, verb=verb)
        if target.subresource == "portforward" and method in ("GET", "POST"):
            assert target.name is not None
            pod = self.store.peek(target.info, target.name, target.namespace)
            return await serve_port_forward(request, pod)
        if verb == "watch":
            return await self._watch(request, target)
        if verb == "list":
            return await self._list(request, target)
        if verb == "get":
            return self._get(request, target)
        if verb == "create":
            return await self._create(request, target)
        if verb == "update":
            return await self._update(request, target)
        if verb == "patch":
            return await self._patch(request, target)
        if verb == "delete":
            return await self._delete(request, target)
        if verb == "deletecollection":
            return await self._delete_collection(request, target)
        raise MethodNotAllowed("the server does not allow this method on the requested resource")

    # -- reads

    def _get(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        if target.subresource == "scale":
            return json_response(self.store.get_scale(target.info, target.name, target.namespace))
        obj = self.store.peek(target.info, target.name, target.namespace)
        if target.subresource == "log":
            return web.Response(
                text=pod_log(obj, request.query.get("container")), content_type="text/plain"
            )
        if wants_table(request):
            return json_response(
                tables.table(
                    target.info,
                    [obj],
                    obj["metadata"]["resourceVersion"],
                    request.query.get("includeObject", "Metadata"),
                )
            )
        return json_response(_output(target, obj))

    async def _list(self, request: web.Request, target: Target) -> web.Response:
        q = request.query
        limit = int(q["limit"]) if q.get("limit", "").isdigit() else None
        exact = await self._list_resource_version(
            q.get("resourceVersion", ""),
            q.get("resourceVersionMatch", ""),
            q.get("continue", ""),
            bool(limit),
        )
        result = self.store.list(
            target.info,
            target.namespace,
            q.get("labelSelector", ""),
            q.get("fieldSelector", ""),
            limit=limit,
            continue_token=q.get("continue") or None,
            exact_resource_version=exact,
        )
        if wants_table(request):
            return json_response(
                tables.table(
                    target.info,
                    result.items,
                    result.resource_version,
                    q.get("includeObject", "Metadata"),
                    result.continue_,
                )
            )
        metadata: Obj = {"resourceVersion": result.resource_version}
        if result.continue_:
            metadata["continue"] = result.continue_
            metadata["remainingItemCount"] = result.remaining_item_count
        items = result.items
        if target.info.is_crd:
            items = [_output(target, o) for o in items]
        body = {
            "kind": target.info.list_kind,
            "apiVersion": target.info.api_version(target.version),
            "metadata": metadata,
            "items": items,
        }
        return json_response(body)

    async def _list_resource_version(
        self, resource_version: str, match: str, continue_token: str, limited: bool
    ) -> int | None:
        """Apply a list's resourceVersion/resourceVersionMatch; the version to list exactly at,
        or None for the newest state.

        A version newer than the store is waited for (as the watch cache does) and then
        answered with 504 ResourceVersionTooLarge."""
        causes = list_options_causes(resource_version, match, continue_token)
        if causes:
            raise errors.invalid("ListOptions", "", causes, "meta.k8s.io")
        if continue_token and resource_version not in ("", "0"):
            raise BadRequest("specifying resource version is not allowed when using continue")
        if resource_version in ("", "0"):
            return None
        try:
            wanted = int(resource_version)
        except ValueError as exc:
            raise BadRequest(f"invalid resource version {resource_version!r}") from exc
        deadline = asyncio.get_running_loop().time() + TOO_LARGE_RV_WAIT
        while wanted > self.store.resource_version:
            if asyncio.get_running_loop().time() >= deadline:
                raise errors.too_large_resource_version(wanted, self.store.resource_version)
            await asyncio.sleep(0.05)
        # A version with a limit and no match is an exact read (the legacy paging semantics).
        if match == "Exact" or (not match and limited):
            return wanted
        return None

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        q = request.query
        if target.name is not None:
            selector = f"metadata.name={target.name}"
            fields = q.get("fieldSelector", "")
            field_selector = f"{fields},{selector}" if fields else selector
        else:
            field_selector = q.get("fieldSelector", "")
        as_table = wants_table(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if self.faults.gone_next_watches > 0:
            self.faults.gone_next_watches -= 1
            await _write_event(response, _gone_event("injected: too old resource version"))
            return response
        try:
            watch = self.store.watch(
                target.info,
                target.namespace,
                q.get("labelSelector", ""),
                field_selector,
                resource_version=q.get("resourceVersion") or None,
                allow_bookmarks=_bool_param(request, "allowWatchBookmarks"),
            )
        except errors.Gone as exc:
            await _write_event(response, _gone_event(exc.message))
            return response
        if self.shutting_down:
            watch.close()  # the app began shutting down while this request was in flight
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        first = True
        try:
            async with asyncio.timeout(timeout):
                async for event in watch:
                    payload = event.object
                    if as_table and event.type != "BOOKMARK":
                        payload = tables.table(
                            target.info,
                            [payload],
                            payload["metadata"]["resourceVersion"],
                            q.get("includeObject", "Metadata"),
                            with_columns=first,
                        )
                        first = False
                    elif target.info.is_crd:
                        payload = _output(target, payload)
                    await _write_event(response, {"type": event.type, "object": payload})
                if watch.error is not None:
                    await _write_event(response, {"type": "ERROR", "object": watch.error.status()})
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            watch.close()
        return response

    # -- writes

    async def _create(self, request: web.Request, target: Target) -> web.Response:
        body = await _read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("request body must be an object")
        if target.name is not None and target.subresource == "eviction":
            return self._evict(target, body)
        if target.name is not None and target.subresource == "binding":
            return self._bind(target, body)
        if target.name is not None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource"
            )
        if target.info.is_crd and body.get("apiVersion") != target.info.api_version(target.version):
            raise BadRequest(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({target.info.api_version(target.version)})"
            )
        created = self.store.create(
            target.info,
            body,
            target.namespace,
            dry_run=_dry_run(request),
            version=target.version,
            copy=False,  # the body was decoded for this request; the answer is encoded now
        )
        return json_response(_output(target, created), 201)

    def _evict(self, target: Target, body: Obj) -> web.Response:
        assert target.name is not None
        namespace = target.namespace or "default"
        self.store.evict(target.name, namespace, body.get("deleteOptions"))
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            201,
        )

    def _bind(self, target: Target, body: Obj) -> web.Response:
        assert target.name is not None
        node = (body.get("target") or {}).get("name")
        if not node:
            raise errors.invalid(
                "Binding",
                target.name,
                [errors.Cause("FieldValueRequired", "Required value", "target.name")],
            )
        self.store.bind(target.name, target.namespace or "default", node)
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            201,
        )

    async def _update(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        body = await _read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("request body must be an object")
        name = (body.get("metadata") or {}).get("name")
        if name != target.name:
            raise BadRequest(
                f"the name of the object ({name}) does not match the name on the URL "
                f"({target.name})"
            )
        if target.subresource == "scale":
            replicas = (body.get("spec") or {}).get("replicas", 0)
            rv = (body.get("metadata") or {}).get("resourceVersion")
            return json_response(
                self.store.update_scale(target.info, target.name, target.namespace, replicas, rv)
            )
        sub = "status" if target.subresource == "status" else None
        if target.info.key == "namespaces" and target.subresource == "finalize":
            return json_response(self._finalize_namespace(body))
        updated = self.store.update(
            target.info, body, target.namespace, subresource=sub, dry_run=_dry_run(request)
        )
        return json_response(_output(target, updated))

    def _finalize_namespace(self, body: Obj) -> Obj:
        finalizers = (body.get("spec") or {}).get("finalizers") or []
        name = body["metadata"]["name"]
        return self.store.patch(
            "namespaces", name, {"spec": {"finalizers": finalizers or None}}, MERGE_PATCH
        )

    async def _patch(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        content_type = request.headers.get("Content-Type", MERGE_PATCH).split(";")[0].strip()
        if content_type not in (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH, APPLY_PATCH):
            raise errors.UnsupportedMediaType(
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}, {STRATEGIC_MERGE_PATCH}"
            )
        body = await _read_json(request)
        if target.subresource == "scale":
            from clustersim.kube.patch import apply_patch

            scale = self.store.get_scale(target.info, target.name, target.namespace)
            patched = apply_patch(scale, body, content_type, strategic=True)
            replicas = (patched.get("spec") or {}).get("replicas", 0)
            return json_response(
                self.store.update_scale(target.info, target.name, target.namespace, replicas)
            )
        if content_type == APPLY_PATCH:
            return self._server_side_apply(request, target, body)
        sub = "status" if target.subresource == "status" else None
        # The stored object itself, encoded at once (nothing runs in between): the reply
        # needs no copy of it.
        patched_obj = self.store.patch(
            target.info,
            target.name,
            body,
            content_type,
            target.namespace,
            subresource=sub,
            dry_run=_dry_run(request),
            copy_result=False,
        )
        return json_response(_output(target, patched_obj))

    def _server_side_apply(self, request: web.Request, target: Target, body: Any) -> web.Response:
        assert target.name is not None
        if not isinstance(body, dict):
            raise BadRequest("apply patch must be an object")
        if not request.query.get("fieldManager"):
            raise BadRequest("PATCH, application/apply-patch+yaml requires fieldManager to be set")
        try:
            self.store.peek(target.info, target.name, target.namespace)
        except NotFound:
            body.setdefault("metadata", {}).setdefault("name", target.name)
            created = self.store.create(
                target.info,
                body,
                target.namespace,
                dry_run=_dry_run(request),
                version=target.version,
            )
            return json_response(_output(target, created), 201)
        sub = "status" if target.subresource == "status" else None
        patched = self.store.patch(
            target.info,
            target.name,
            body,
            APPLY_PATCH,
            target.namespace,
            subresource=sub,
            dry_run=_dry_run(request),
        )
        return json_response(_output(target, patched))

    async def _delete_options(self, request: web.Request) -> Obj:
        options: Obj = {}
        raw = await request.read()
        if raw:
            decoded = _decode_body(raw, request.headers.get("Content-Type", "application/json"))
            if isinstance(decoded, dict):
                options.update(decoded)
        q = request.query
        if "gracePeriodSeconds" in q:
            options["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
        if "propagationPolicy" in q:
            options["propagationPolicy"] = q["propagationPolicy"]
        if q.get("orphanDependents") == "true" or options.get("orphanDependents") is True:
            options["propagationPolicy"] = "Orphan"
        if q.get("dryRun") == "All":
            options["dryRun"] = ["All"]
        return options

    async def _delete(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        options = await self._delete_options(request)
        result = self.store.delete(
            target.info,
            target.name,
            target.namespace,
            grace_period_seconds=options.get("gracePeriodSeconds"),
            propagation_policy=options.get("propagationPolicy"),
            preconditions=options.get("preconditions"),
            dry_run=options.get("dryRun") == ["All"],
        )
        if result.deleted and not target.info.return_deleted_object:
            return json_response(success_status(target.info, result.object))
        return json_response(_output(target, result.object))

    async def _delete_collection(self, request: web.Request, target: Target) -> web.Response:
        options = await self._delete_options(request)
        q = request.query
        items = self.store.list(
            target.info, target.namespace, q.get("labelSelector", ""), q.get("fieldSelector", "")
        ).items
        deleted = []
        for obj in list(items):
            meta = obj["metadata"]
            with contextlib.suppress(NotFound):
                deleted.append(
                    self.store.delete(
                        target.info,
                        meta["name"],
                        meta.get("namespace"),
                        grace_period_seconds=options.get("gracePeriodSeconds"),
                        propagation_policy=options.get("propagationPolicy"),
                        dry_run=options.get("dryRun") == ["All"],
                    ).object
                )
        return json_response(
            {
                "kind": target.info.list_kind,
                "apiVersion": target.info.api_version(target.version),
                "metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": deleted,
            }
        )


def list_options_causes(resource_version: str, match: str, continue_token: str) -> list[Cause]:
    """``ValidateListOptions`` for the resourceVersionMatch rules (non-watch lists)."""
    if not match:
        return []
    causes = []
    if not resource_version:
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                "resourceVersionMatch",
            )
        )
    if continue_token:
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                "resourceVersionMatch",
            )
        )
    if match not in ("Exact", "NotOlderThan"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan", ""',
                "resourceVersionMatch",
            )
        )
    if match == "Exact" and resource_version == "0":
        causes.append(
            Cause(
                "FieldValueForbidden",
                'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                "resourceVersionMatch",
            )
        )
    return causes


def _verb(method: str, target: Target, watching: bool) -> str:
    if method == "GET":
        if watching:
            return "watch"
        return "get" if target.name is not None else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        if target.name is None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource"
            )
        return "update"
    if method == "PATCH":
        if target.name is None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource"
            )
        return "patch"
    if method == "DELETE":
        return "delete" if target.name is not None else "deletecollection"
    raise MethodNotAllowed(f"method {method} is not allowed")


def _gone_event(message: str) -> Obj:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "Expired",
            "code": 410,
        },
    }


async def _write_event(response: web.StreamResponse, event: Obj) -> None:
    await response.write(_encoder.encode(event) + b"\n")


# --------------------------------------------------------------------------- app


@web.middleware
async def _errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        log.debug("api_error", path=request.path, code=err.code, reason=err.reason)
        return error_response(err)
    except web.HTTPNotFound:
        return error_response(NotFound("the server could not find the requested resource"))
    except web.HTTPMethodNotAllowed:
        return error_response(
            MethodNotAllowed("the server does not allow this method on the requested resource")
        )


def build_app(store: Store, faults: Faults | None = None) -> web.Application:
    """The aiohttp Application serving ``store`` (plus the /_sim/ admin API)."""
    app = web.Application(middlewares=[_errors_middleware], client_max_size=64 * 1024**2)
    app[STORE_KEY] = store
    active_faults = faults or Faults()
    app[FAULTS_KEY] = active_faults
    api = ApiHandler(store, active_faults)

    async def version(_: web.Request) -> web.Response:
        return json_response(KUBE_VERSION)

    async def api_versions(request: web.Request) -> web.Response:
        host = request.host
        return json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
            }
        )

    async def core_resources(_: web.Request) -> web.Response:
        return json_response(resource_list(store, "", "v1"))

    async def group_list(_: web.Request) -> web.Response:
        return json_response(
            {"kind": "APIGroupList", "apiVersion": "v1", "groups": api_groups(store)}
        )

    async def group(request: web.Request) -> web.Response:
        name = request.match_info["group"]
        for entry in api_groups(store):
            if entry["name"] == name:
                return json_response({"kind": "APIGroup", "apiVersion": "v1", **entry})
        return page_not_found()

    async def group_version(request: web.Request) -> web.Response:
        m = request.match_info
        if not serves_group(store, m["group"]):
            return page_not_found()
        listing = resource_list(store, m["group"], m["version"])
        if not listing["resources"]:
            raise NotFound("the server could not find the requested resource")
        return json_response(listing)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def sim_readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def sim_faults_get(_: web.Request) -> web.Response:
        return json_response(active_faults.to_dict())

    async def sim_faults_post(request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("faults must be a JSON object")
        dropped = 0
        if body.get("drop_watches"):
            dropped = store.close_all_watches()
        if body.get("compact"):
            store.compact()
        for key in ("error_rate", "latency_ms"):
            if key in body:
                setattr(active_faults, key, float(body[key]))
        for key in ("error_count", "error_code", "gone_next_watches"):
            if key in body:
                setattr(active_faults, key, int(body[key]))
        for key in ("verbs", "resources"):
            if key in body:
                setattr(active_faults, key, list(body[key] or []))
        return json_response({**active_faults.to_dict(), "dropped_watches": dropped})

    async def sim_faults_delete(_: web.Request) -> web.Response:
        fresh = Faults()
        for key, value in fresh.to_dict().items():
            setattr(active_faults, key, value)
        return json_response(active_faults.to_dict())

    async def openapi_missing(_: web.Request) -> web.Response:
        raise NotFound("the server could not find the requested resource")

    async def openapi_v3_root(_: web.Request) -> web.Response:
        return json_response(openapi_v3_index(store))

    async def openapi_v3_group(request: web.Request) -> web.Response:
        document = openapi_v3_document(store, request.match_info["gv"])
        if document is None:
            raise NotFound("the server could not find the requested resource")
        return json_response(document)

    async def on_shutdown(_: web.Application) -> None:
        # Runs after the listening socket is closed and before aiohttp waits for in-flight
        # handlers: open watches would otherwise hold the shutdown for its whole timeout.
        api.shut_down()

    app.on_shutdown.append(on_shutdown)
    r = app.router
    r.add_get("/version", version)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", healthz)
    r.add_get("/livez", healthz)
    r.add_get("/api", api_versions)
    r.add_get("/api/v1", core_resources)
    r.add_get("/apis", group_list)
    r.add_get("/apis/{group}", group)
    r.add_get("/apis/{group}/{version}", group_version)
    r.add_get("/openapi/v3", openapi_v3_root)
    r.add_get("/openapi/v3/{gv:.+}", openapi_v3_group)
    r.add_get("/openapi/{rest:.*}", openapi_missing)
    r.add_get("/_sim/readyz", sim_readyz)
    r.add_get("/_sim/faults", sim_faults_get)
    r.add_post("/_sim/faults", sim_faults_post)
    r.add_delete("/_sim/faults", sim_faults_delete)
    r.add_route("*", "/api/v1/{rest:.+}", api.core)
    r.add_route("*", "/apis/{group}/{version}/{rest:.+}", api.grouped)
    return app


# --------------------------------------------------------------------------- running


@dataclass
class RunningServer:
    url: str
    port: int
    kubeconfig_path: Path
    store: Store
    faults: Faults
    app: web.Application


def kubeconfig_text(url: str, context: str = "clustersim") -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": context, "user": {}}],
        "contexts": [
            {
                "name": context,
                "context": {"cluster": context, "user": context, "namespace": "default"},
            }
        ],
        "current-context": context,
    }
    return yaml.safe_dump(config, sort_keys=False)


@contextlib.asynccontextmanager
async def serve(
    store: Store | None = None,
    *,
    port: int = 0,
    kubeconfig_path: str | os.PathLike[str] | None = None,
    faults: Faults | None = None,
) -> AsyncIterator[RunningServer]:
    """Run the emulator on 127.0.0.1 (``port=0``: a free port) and write a kubeconfig."""
    active_store = store if store is not None else Store()
    active_faults = faults or Faults()
    app = build_app(active_store, active_faults)
    # shutdown_timeout bounds the wait for handlers still running at shutdown (a client that
    # stopped reading a watch, an injected latency); watches themselves end in on_shutdown.
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port or 0)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    bound_port = int(sockets[0].getsockname()[1]) if sockets else port
    url = f"http://127.0.0.1:{bound_port}"
    temp_dir: tempfile.TemporaryDirectory[str] | None = None
    if kubeconfig_path is None:
        temp_dir = tempfile.TemporaryDirectory(prefix="clustersim-kube-")
        path = Path(temp_dir.name) / "kubeconfig"
    else:
        path = Path(kubeconfig_path)
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(kubeconfig_text(url))
    log.debug("kube_api_started", url=url, kubeconfig=str(path))
    try:
        yield RunningServer(url, bound_port, path, active_store, active_faults, app)
    finally:
        await runner.cleanup()
        if temp_dir is not None:
            temp_dir.cleanup()


__all__ = [
    "Faults",
    "RunningServer",
    "WatchEvent",
    "build_app",
    "deep_copy",
    "kubeconfig_text",
    "serve",
]
