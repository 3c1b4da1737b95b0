"""The object store of the Kubernetes API emulator: resources, resourceVersions, indexes, CRUD,
watches and continue tokens (its API is described in ``clustersim.kube.store``, where ``Store``
is built).

It knows nothing of its collaborators' modules: admission (defaulting and validation before an
object is stored), garbage collection (ownerReferences, namespace deletion) and disruption
(evictions, PodDisruptionBudget status) reach it as the hooks below (``AdmissionHooks``,
``CollectorHooks``, ``DisruptionHooks``), made by the ``Collaborators`` factory it is
constructed with.  They are built with the store and use its internals in turn, so the imports
run one way: ``store`` -> ``admission``, ``gc``, ``disruption`` -> ``objectstore``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from clustersim.kube import errors
from clustersim.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Cause,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    TooManyRequests,
)
from clustersim.kube.objects import (
    DeleteResult,
    Obj,
    deep_copy,
    get_path,
    now_rfc3339,
    set_path,
)
from clustersim.kube.patch import MERGE_PATCH, apply_patch, result_is_fresh
from clustersim.kube.resources import BUILTINS, ResourceInfo, crd_resource_infos
from clustersim.kube.selectors import FieldSelector, LabelSelector, parse_label_selector

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# The PriorityClasses every cluster has from the start.
SYSTEM_PRIORITY_CLASSES = {
    "system-cluster-critical": 2000000000,
    "system-node-critical": 2000001000,
}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_DNS_SUBDOMAIN_MAX = 253

_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_dns_subdomain(name: str) -> bool:
    """RFC 1123 subdomain, as k8s.io/apimachinery validation.IsDNS1123Subdomain."""
    return len(name) <= _DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Everything that counts as "spec" for generation bumps: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or () if "uid" in r]


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    object: Obj


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: str
    continue_: str | None = None
    remaining_item_count: int | None = None


@dataclass(frozen=True)
class _LogEntry:
    rv: int
    key: str
    type: str
    obj: Obj
    old: Obj | None


_CLOSED = object()


class Watch:
    """An async iterator of WatchEvents; create with ``ObjectStore.watch``."""

    def __init__(
        self,
        store: ObjectStore,
        info: ResourceInfo,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        allow_bookmarks: bool,
        bookmark_interval: float,
    ) -> None:
        self.store = store
        self.info = info
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.allow_bookmarks = allow_bookmarks
        self.bookmark_interval = bookmark_interval
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = False
        self._next_bookmark = time.monotonic() + bookmark_interval
        self.error: ApiError | None = None  # set when the store ends the watch with an error

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if not self.labels.empty and not self.labels.matches(meta.get("labels")):
            return False
        return self.fields.empty or self.fields.matches(obj)

    def _offer(self, entry: _LogEntry) -> None:
        new_match = self.matches(entry.obj)
        if entry.type == "ADDED":
            if new_match:
                self._queue.put_nowait(WatchEvent("ADDED", entry.obj))
            return
        if entry.type == "DELETED":
            if new_match:
                self._queue.put_nowait(WatchEvent("DELETED", entry.obj))
            return
        old_match = entry.old is not None and self.matches(entry.old)
        if new_match and old_match:
            self._queue.put_nowait(WatchEvent("MODIFIED", entry.obj))
        elif new_match:
            self._queue.put_nowait(WatchEvent("ADDED", entry.obj))
        elif old_match:
            self._queue.put_nowait(WatchEvent("DELETED", entry.obj))

    def _push(self, event: WatchEvent) -> None:
        self._queue.put_nowait(event)

    def close(self, error: ApiError | None = None) -> None:
        """End the watch; iteration stops after already-queued events."""
        if self._closed:
            return
        self._closed = True
        self.error = error
        self.store._unregister(self)
        self._queue.put_nowait(_CLOSED)

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if not self._queue.empty():
                item = self._queue.get_nowait()
            elif self.allow_bookmarks:
                timeout = max(0.0, self._next_bookmark - time.monotonic())
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                except TimeoutError:
                    self._next_bookmark = time.monotonic() + self.bookmark_interval
                    return self.store.bookmark_event(self.info)
            else:
                item = await self._queue.get()
            if item is _CLOSED:
                self._queue.put_nowait(_CLOSED)
                raise StopAsyncIteration
            assert isinstance(item, WatchEvent)
            return item

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AdmissionHooks(Protocol):
    """Defaulting and validation, before an object is stored."""

    def prepare_create(self, info: ResourceInfo, obj: Obj) -> Obj: ...

    def validate(self, info: ResourceInfo, obj: Obj, old: Obj | None) -> Obj: ...

    def prepare_crd(self, obj: Obj) -> Obj: ...


class CollectorHooks(Protocol):
    """Garbage collection: dependents by ownerReferences, and namespace deletion."""

    def orphan_dependents(self, uid: str) -> None: ...

    def delete_dependents(self, uid: str, policy: str) -> None: ...

    def maybe_finish_foreground(self, owner_uid: str) -> None: ...

    def delete_namespace(self, info: ResourceInfo, new: Obj, existing: Obj) -> DeleteResult: ...

    def maybe_finish_namespace(self, ns: str) -> None: ...


class DisruptionHooks(Protocol):
    """pods/eviction and the PodDisruptionBudgets' status."""

    def evict(
        self, name: str, namespace: str, delete_options: Mapping[str, Any] | None = None
    ) -> DeleteResult: ...

    def refresh_pdbs(self, namespace: str) -> None: ...


@dataclass(frozen=True)
class Collaborators:
    admission: AdmissionHooks
    collector: CollectorHooks
    disruption: DisruptionHooks


class ObjectStore:
    """The cluster state.  See ``clustersim.kube.store`` for the API.  ``collaborators`` is
    called once, with the store, before the store holds any object."""

    def __init__(
        self,
        collaborators: Callable[[ObjectStore], Collaborators],
        *,
        history_size: int = 20_000,
        bookmark_interval: float = 30.0,
        namespaces: Iterable[str] = DEFAULT_NAMESPACES,
    ) -> None:
        self._rv = 0
        self._compacted_rv = 0
        self._history: deque[_LogEntry] = deque(maxlen=history_size)
        self.bookmark_interval = bookmark_interval
        self._infos: dict[str, ResourceInfo] = {}
        self._aliases: dict[str, str] = {}
        # key -> namespace ("" for cluster scope) -> name -> object
        self._objects: dict[str, dict[str, dict[str, Obj]]] = {}
        self._watchers: dict[str, set[Watch]] = {}
        self._by_uid: dict[str, tuple[str, str, str]] = {}
        self._dependents: dict[str, set[str]] = {}
        # spec.nodeName -> {(namespace, name)}: kubelets list their pods by node constantly
        self._pods_by_node: dict[str, set[tuple[str, str]]] = {}
        self._listeners: list[Callable[[str, str, Obj, Obj | None], None]] = []
        hooks = collaborators(self)
        self._admission = hooks.admission
        self._disruption = hooks.disruption
        self._gc = hooks.collector
        for info in BUILTINS:
            self.register(info)
        for ns in namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            self.create(
                "priorityclasses",
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                    "description": "Used for system critical pods that must run in the cluster.",
                },
            )

    # ----------------------------------------------------------------- registry

    def register(self, info: ResourceInfo) -> None:
        """Serve a resource (built-in or from a CRD)."""
        self._infos[info.key] = info
        self._objects.setdefault(info.key, {})
        for alias in (info.key, info.plural, info.singular, info.kind, *info.short_names):
            if alias:
                self._aliases.setdefault(alias, info.key)
                self._aliases.setdefault(alias.lower(), info.key)
                if info.group:
                    self._aliases[f"{alias.lower()}.{info.group}"] = info.key
        for version in info.versions:
            if info.group:
                self._aliases[f"{info.plural}.{version}.{info.group}"] = info.key

    def unregister(self, key: str) -> None:
        info = self._infos.pop(key, None)
        if info is None:
            return
        for watch in list(self._watchers.get(key, ())):
            watch.close()
        for ns_objects in self._objects.pop(key, {}).values():
            for obj in ns_objects.values():
                self._by_uid.pop(obj["metadata"]["uid"], None)
        self._aliases = {a: k for a, k in self._aliases.items() if k != key}

    def resolve(self, resource: str | ResourceInfo) -> ResourceInfo:
        if isinstance(resource, ResourceInfo):
            return resource
        key = self._aliases.get(resource) or self._aliases.get(resource.lower())
        if key is None or key not in self._infos:
            raise NotFound(f"the server could not find the requested resource ({resource})")
        return self._infos[key]

    def resources(self) -> list[ResourceInfo]:
        return list(self._infos.values())

    def find(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        key = f"{plural}.{group}" if group else plural
        info = self._infos.get(key)
        if info is None or version not in info.versions:
            return None
        return info

    def add_listener(self, listener: Callable[[str, str, Obj, Obj | None], None]) -> None:
        """Synchronous callback ``(resource_key, event_type, obj, old)`` after every commit."""
        self._listeners.append(listener)

    # ----------------------------------------------------------------- helpers

    @property
    def resource_version(self) -> int:
        return self._rv

    def _bucket(self, info: ResourceInfo, namespace: str) -> dict[str, Obj]:
        by_ns = self._objects[info.key]
        bucket = by_ns.get(namespace)
        if bucket is None:
            bucket = by_ns[namespace] = {}
        return bucket

    def _namespace_of(self, info: ResourceInfo, namespace: str | None, obj: Obj | None) -> str:
        if not info.namespaced:
            return ""
        meta_ns = (obj or {}).get("metadata", {}).get("namespace") if obj else None
        if namespace and meta_ns and namespace != meta_ns:
            raise BadRequest(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        return namespace or meta_ns or "default"

    def _lookup(self, info: ResourceInfo, name: str, namespace: str) -> Obj:
        obj = self._objects[info.key].get(namespace, {}).get(name)
        if obj is None:
            raise errors.not_found(info.plural, name, info.group)
        return obj

    def _stamp(self, obj: Obj) -> int:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        return self._rv

    def _commit(self, info: ResourceInfo, event_type: str, obj: Obj, old: Obj | None) -> None:
        entry = _LogEntry(self._rv, info.key, event_type, obj, old)
        if len(self._history) == self._history.maxlen:
            # The oldest entry falls out of the window: watches from before it get 410.
            self._compacted_rv = self._history[0].rv
        self._history.append(entry)
        for watch in list(self._watchers.get(info.key, ())):
            watch._offer(entry)
        for listener in self._listeners:
            listener(info.key, event_type, obj, old)

    def _write_status(self, info: ResourceInfo, new: Obj, old: Obj) -> None:
        if new == old:
            return
        self._stamp(new)
        self._bucket(info, new["metadata"].get("namespace", ""))[new["metadata"]["name"]] = new
        self._commit(info, "MODIFIED", new, old)

    def _index(self, info: ResourceInfo, obj: Obj, old: Obj | None, removed: bool) -> None:
        meta = obj["metadata"]
        ref = f"{info.key}\x00{meta.get('namespace', '')}\x00{meta['name']}"
        old_owners = set(_owner_uids(old)) if old is not None else set()
        new_owners = set() if removed else set(_owner_uids(obj))
        for uid in old_owners - new_owners:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self._dependents[uid]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(uid, set()).add(ref)
        if removed:
            self._by_uid.pop(meta["uid"], None)
        else:
            self._by_uid[meta["uid"]] = (info.key, meta.get("namespace", ""), meta["name"])
        if info.key == "pods":
            self._index_node(obj, old, removed)

    def _index_node(self, obj: Obj, old: Obj | None, removed: bool) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        old_node = (old.get("spec") or {}).get("nodeName") if old is not None else None
        new_node = None if removed else (obj.get("spec") or {}).get("nodeName")
        if old_node == new_node:
            return
        if old_node:
            members = self._pods_by_node.get(old_node)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._pods_by_node[old_node]
        if new_node:
            self._pods_by_node.setdefault(new_node, set()).add(key)

    def bookmark_event(self, info: ResourceInfo) -> WatchEvent:
        return WatchEvent(
            "BOOKMARK",
            {
                "kind": info.kind,
                "apiVersion": info.api_version(),
                "metadata": {"resourceVersion": str(self._rv)},
            },
        )

    # ----------------------------------------------------------------- create

    def create(
        self,
        resource: str | ResourceInfo,
        obj: Obj,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        version: str | None = None,
        copy: bool = True,
    ) -> Obj:
        """Create ``obj``; returns a copy of the stored object.  ``copy=False`` (the HTTP layer,
        which owns its freshly decoded body and encodes the answer at once) hands ``obj`` over
        to the store and returns the stored object itself, which must not be modified."""
        info = self.resolve(resource)
        new = deep_copy(obj) if copy else obj
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise BadRequest("metadata must be an object")
        ns = self._namespace_of(info, namespace, new)
        new["apiVersion"] = new.get("apiVersion") or info.api_version(version)
        new["kind"] = new.get("kind") or info.kind
        if new["kind"] != info.kind:
            raise BadRequest(f"the kind {new['kind']!r} does not match the resource {info.key!r}")
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    info.kind,
                    "",
                    [
                        Cause(
                            "FieldValueRequired",
                            "name or generateName is required",
                            "metadata.name",
                        )
                    ],
                    info.group,
                )
            meta["name"] = prefix + "".join(random.choices(_NAME_CHARS, k=5))
        name = meta["name"]
        if not _is_dns_subdomain(name) and info.kind != "Event":
            raise errors.invalid(
                info.kind,
                name,
                [
                    Cause(
                        "FieldValueInvalid",
                        f'Invalid value: "{name}": a lowercase RFC 1123 '
                        "subdomain must consist of lower case alphanumeric characters, '-' or "
                        "'.', and must start and end with an alphanumeric character",
                        "metadata.name",
                    )
                ],
                info.group,
            )
        if info.namespaced:
            meta["namespace"] = ns
            self._check_namespace_open(ns)
        else:
            meta.pop("namespace", None)
        bucket = self._bucket(info, ns)
        if name in bucket:
            raise errors.already_exists(info.plural, name, info.group)
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        if info.reset_status_on_create:
            new.pop("status", None)
        new = self._admission.prepare_create(info, new)
        new = self._admission.validate(info, new, None)
        if dry_run:
            return new
        self._stamp(new)
        bucket[name] = new
        self._index(info, new, None, removed=False)
        self._commit(info, "ADDED", new, None)
        self._after_write(info, new, None)
        return deep_copy(new) if copy else new

    def _check_namespace_open(self, ns: str) -> None:
        namespace = self._objects["namespaces"].get("", {}).get(ns)
        if namespace is None:
            raise errors.not_found("namespaces", ns)
        if namespace["metadata"].get("deletionTimestamp"):
            raise Forbidden(
                f"unable to create new content in namespace {ns} because it is being terminated",
                name=ns,
                kind="namespaces",
            )

    # ----------------------------------------------------------------- read

    def get(self, resource: str | ResourceInfo, name: str, namespace: str | None = None) -> Obj:
        info = self.resolve(resource)
        ns = (namespace or "default") if info.namespaced else ""
        return deep_copy(self._lookup(info, name, ns))

    def peek(self, resource: str | ResourceInfo, name: str, namespace: str | None = None) -> Obj:
        """Like ``get`` but returns the shared (read-only!) stored object without copying."""
        info = self.resolve(resource)
        ns = (namespace or "default") if info.namespaced else ""
        return self._lookup(info, name, ns)

    def list(
        self,
        resource: str | ResourceInfo,
        namespace: str | None = None,
        label_selector: str | LabelSelector = "",
        field_selector: str | FieldSelector = "",
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        exact_resource_version: int | None = None,
    ) -> ListResult:
        """Items sorted by namespace/name; ``items`` are shared read-only objects.

        ``exact_resource_version`` lists the collection as it was at that version (rebuilt from
        the watch history; 410 when it is older than the retained window), like
        ``resourceVersionMatch=Exact``; continue tokens likewise serve the version of the first
        page."""
        info = self.resolve(resource)
        labels = (
            label_selector
            if isinstance(label_selector, LabelSelector)
            else parse_label_selector(label_selector)
        )
        fields = (
            field_selector
            if isinstance(field_selector, FieldSelector)
            else FieldSelector.parse(field_selector)
        )
        list_rv = self._rv
        start_after: tuple[str, str] | None = None
        if continue_token:
            list_rv, start_after = self._decode_continue(continue_token)
        elif exact_resource_version is not None:
            list_rv = self._exact_version(exact_resource_version)
        by_ns: Mapping[str, Mapping[str, Obj]] = self._objects[info.key]
        if list_rv < self._rv:
            by_ns = self._collection_at(info, list_rv)
        namespaces = [namespace] if info.namespaced and namespace else sorted(by_ns)
        name_filter = fields.equality_value("metadata.name")
        node_filter = fields.equality_value("spec.nodeName") if info.key == "pods" else None
        if node_filter and not limit and list_rv == self._rv:
            return self._list_pods_on_node(node_filter, namespace, labels, fields, list_rv)
        items: list[Obj] = []
        for ns in namespaces:
            if start_after is not None and ns < start_after[0]:
                continue
            bucket = by_ns.get(ns)
            if not bucket:
                continue
            if name_filter is not None:
                candidate = bucket.get(name_filter)
                names = [name_filter] if candidate is not None else []
            else:
                names = sorted(bucket)
            for name in names:
                if start_after is not None and (ns, name) <= start_after:
                    continue
                obj = bucket[name]
                if not labels.empty and not labels.matches(obj["metadata"].get("labels")):
                    continue
                if not fields.empty and not fields.matches(obj):
                    continue
                items.append(obj)
        if limit and limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            token = self._encode_continue(list_rv, last.get("namespace", ""), last["name"])
            return ListResult(items[:limit], str(list_rv), token, len(items) - limit)
        return ListResult(items, str(list_rv))

    def _exact_version(self, rv: int) -> int:
        if rv > self._rv:
            raise errors.too_large_resource_version(rv, self._rv)
        if self._too_old(rv):
            raise Gone("The resourceVersion for the provided list is too old.")
        return rv

    def _collection_at(self, info: ResourceInfo, rv: int) -> dict[str, dict[str, Obj]]:
        """The objects of ``info`` as they were at ``rv``: undo the newer history entries."""
        collection = {ns: dict(bucket) for ns, bucket in self._objects[info.key].items()}
        for entry in reversed(self._history):
            if entry.rv <= rv:
                break
            if entry.key != info.key:
                continue
            meta = entry.obj["metadata"]
            bucket = collection.setdefault(meta.get("namespace", ""), {})
            if entry.type == "ADDED" or entry.old is None:
                bucket.pop(meta["name"], None)
            else:
                bucket[meta["name"]] = entry.old
        return collection

    def _list_pods_on_node(
        self,
        node: str,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        list_rv: int,
    ) -> ListResult:
        pods = self._objects["pods"]
        items = []
        for ns, name in sorted(self._pods_by_node.get(node, ())):
            if namespace and ns != namespace:
                continue
            obj = pods[ns][name]
            if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj):
                items.append(obj)
        return ListResult(items, str(list_rv))

    def _encode_continue(self, rv: int, ns: str, name: str) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{ns}/{name}"})
        return base64.urlsafe_b64encode(raw.encode()).decode()

    def _decode_continue(self, token: str) -> tuple[int, tuple[str, str]]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv = int(data["rv"])
            ns, _, name = str(data["start"]).partition("/")
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"continue key is not valid: {exc}") from exc
        if self._too_old(rv):
            raise Gone(
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter, or use the "
                "continue token in this response to retrieve the remainder of the results."
            )
        return rv, (ns, name)

    def _too_old(self, rv: int) -> bool:
        return rv < self._compacted_rv

    # ----------------------------------------------------------------- update / patch

    def update(
        self,
        resource: str | ResourceInfo,
        obj: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        info = self.resolve(resource)
        incoming = deep_copy(obj)
        meta = incoming.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            raise errors.invalid(
                info.kind,
                "",
                [Cause("FieldValueRequired", "name is required", "metadata.name")],
                info.group,
            )
        ns = self._namespace_of(info, namespace, incoming)
        return deep_copy(self._update(info, incoming, ns, subresource, dry_run))

    def _update(
        self, info: ResourceInfo, incoming: Obj, ns: str, subresource: str | None, dry_run: bool
    ) -> Obj:
        meta = incoming["metadata"]
        name = meta["name"]
        existing = self._lookup(info, name, ns)
        old_meta = existing["metadata"]
        rv = meta.get("resourceVersion")
        if rv and rv != old_meta["resourceVersion"]:
            raise errors.conflict(info.plural, name, info.group)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise errors.conflict(
                info.plural,
                name,
                info.group,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{old_meta['uid']}",
            )
        if info.is_crd or "kind" not in incoming:
            incoming.setdefault("kind", info.kind)
        incoming.setdefault("apiVersion", existing["apiVersion"])
        if subresource == "status":
            new = {k: v for k, v in existing.items() if k != "status"}
            new["metadata"] = dict(old_meta)
            if "status" in incoming:
                new["status"] = incoming["status"]
            new = deep_copy(new)
        else:
            new = incoming
            new_meta = new["metadata"]
            for fixed in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if fixed in old_meta:
                    new_meta[fixed] = old_meta[fixed]
                else:
                    new_meta.pop(fixed, None)
            if info.namespaced:
                new_meta["namespace"] = ns
            if info.has_status:
                if "status" in existing:
                    new["status"] = deep_copy(existing["status"])
                else:
                    new.pop("status", None)
            if _spec_part(new) != _spec_part(existing):
                new_meta["generation"] = int(old_meta.get("generation", 1)) + 1
            if info.key == "customresourcedefinitions.apiextensions.k8s.io":
                new = self._admission.prepare_crd(new)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        new = self._admission.validate(info, new, existing)
        if new == existing:
            return existing
        if dry_run:
            return new
        new_meta = new["metadata"]
        if (
            new_meta.get("deletionTimestamp")
            and not new_meta.get("finalizers")
            and not new_meta.get("deletionGracePeriodSeconds")
        ):
            self._remove(info, new, existing)
            return new
        self._stamp(new)
        self._bucket(info, ns)[name] = new
        self._index(info, new, existing, removed=False)
        self._commit(info, "MODIFIED", new, existing)
        self._after_write(info, new, existing)
        return new

    def patch(
        self,
        resource: str | ResourceInfo,
        name: str,
        patch: Any,
        patch_type: str = MERGE_PATCH,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        copy_result: bool = True,
    ) -> Obj:
        """Apply a patch. `copy_result=False` returns the stored object itself, a copy fewer
        per write: only for a caller that neither keeps nor changes it (the kubelet)."""
        info = self.resolve(resource)
        ns = (namespace or "default") if info.namespaced else ""
        existing = self._lookup(info, name, ns)
        patched = apply_patch(existing, patch, patch_type, strategic=info.strategic_merge)
        if not isinstance(patched, dict):
            raise BadRequest("patch did not produce an object")
        if not result_is_fresh(patch_type, strategic=info.strategic_merge):
            patched = deep_copy(patched)  # never let the stored object's parts be changed
        meta = patched.setdefault("metadata", {})
        if meta.get("name") != name:
            raise BadRequest("the name of the object does not match the name on the URL")
        updated = self._update(info, patched, ns, subresource, dry_run)
        return deep_copy(updated) if copy_result else updated

    # ----------------------------------------------------------------- delete

    def delete(
        self,
        resource: str | ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> DeleteResult:
        info = self.resolve(resource)
        ns = (namespace or "default") if info.namespaced else ""
        existing = self._lookup(info, name, ns)
        meta = existing["metadata"]
        if preconditions:
            want_uid = preconditions.get("uid")
            if want_uid and want_uid != meta["uid"]:
                raise errors.conflict(
                    info.plural,
                    name,
                    info.group,
                    f"Precondition failed: UID in precondition: {want_uid}, UID in object "
                    f"meta: {meta['uid']}",
                )
            want_rv = preconditions.get("resourceVersion")
            if want_rv and want_rv != meta["resourceVersion"]:
                raise errors.conflict(
                    info.plural,
                    name,
                    info.group,
                    f"Precondition failed: ResourceVersion in precondition: {want_rv}, "
                    f"ResourceVersion in object meta: {meta['resourceVersion']}",
                )
        policy = propagation_policy or info.default_propagation
        if policy not in ("Background", "Foreground", "Orphan"):
            raise BadRequest(f"invalid propagationPolicy {policy!r}")
        if dry_run:
            return DeleteResult(deep_copy(existing), True)
        grace = self._grace_period(info, existing, grace_period_seconds)
        new = deep_copy(existing)
        new_meta = new["metadata"]
        finalizers: list[str] = list(new_meta.get("finalizers") or [])
        wait_for_dependents = policy == "Foreground" and self._dependents.get(meta["uid"])
        if wait_for_dependents and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if policy == "Orphan":
            self._gc.orphan_dependents(meta["uid"])
        new_meta["finalizers"] = finalizers
        if not finalizers:
            new_meta.pop("finalizers")
        if info.key == "namespaces":
            return self._gc.delete_namespace(info, new, existing)
        if grace > 0 or finalizers:
            if not new_meta.get("deletionTimestamp"):
                new_meta["deletionTimestamp"] = now_rfc3339()
            if grace > 0 or "deletionGracePeriodSeconds" in new_meta:
                new_meta["deletionGracePeriodSeconds"] = grace
            if grace == 0 and not finalizers:
                self._remove(info, new, existing)
                return DeleteResult(deep_copy(new), True)
            if new != existing:
                self._stamp(new)
                self._bucket(info, ns)[name] = new
                self._index(info, new, existing, removed=False)
                self._commit(info, "MODIFIED", new, existing)
                self._after_write(info, new, existing)
            if "foregroundDeletion" in finalizers:
                self._gc.delete_dependents(meta["uid"], "Foreground")
                self._gc.maybe_finish_foreground(new_meta["uid"])
            current = self._objects[info.key].get(ns, {}).get(name)
            return DeleteResult(deep_copy(current or new), current is None)
        self._remove(info, new, existing)
        return DeleteResult(deep_copy(new), True)

    def _grace_period(self, info: ResourceInfo, obj: Obj, requested: int | None) -> int:
        if info.key != "pods":
            return 0
        spec = obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        grace = requested
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        current = obj["metadata"].get("deletionGracePeriodSeconds")
        if current is not None and grace > current:
            grace = int(current)
        return max(0, int(grace))

    def _remove(self, info: ResourceInfo, final: Obj, existing: Obj) -> None:
        meta = final["metadata"]
        ns = meta.get("namespace", "")
        bucket = self._bucket(info, ns)
        if bucket.get(meta["name"]) is not existing:
            return
        del bucket[meta["name"]]
        self._stamp(final)
        self._index(info, final, existing, removed=True)
        self._commit(info, "DELETED", final, existing)
        self._after_write(info, None, final)
        self._gc.delete_dependents(meta["uid"], "Background")
        for owner_uid in _owner_uids(final):
            self._gc.maybe_finish_foreground(owner_uid)
        if ns and info.key != "namespaces":
            self._gc.maybe_finish_namespace(ns)

    # ----------------------------------------------------------------- pods/binding, eviction

    def bind(self, name: str, namespace: str, node_name: str) -> Obj:
        """pods/binding: set spec.nodeName once (Conflict if already bound)."""
        info = self._infos["pods"]
        pod = self._lookup(info, name, namespace)
        current = pod["spec"].get("nodeName")
        if current:
            raise errors.conflict(
                "pods/binding", name, "", f'pod {name} is already assigned to node "{current}"'
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict("pods/binding", name, "", f"pod {name} is being deleted")
        new = deep_copy(pod)
        new["spec"]["nodeName"] = node_name
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status["conditions"] = conditions
        self._stamp(new)
        self._bucket(info, namespace)[name] = new
        self._index(info, new, pod, removed=False)
        self._commit(info, "MODIFIED", new, pod)
        self._after_write(info, new, pod)
        return deep_copy(new)

    def evict(
        self, name: str, namespace: str, delete_options: Mapping[str, Any] | None = None
    ) -> DeleteResult:
        """pods/eviction: delete the pod unless a PodDisruptionBudget forbids it (429)."""
        return self._disruption.evict(name, namespace, delete_options)

    # ----------------------------------------------------------------- scale

    def get_scale(self, resource: str | ResourceInfo, name: str, namespace: str | None) -> Obj:
        info = self.resolve(resource)
        if info.scale is None:
            raise NotFound(f"the server could not find the requested resource ({info.key}/scale)")
        ns = (namespace or "default") if info.namespaced else ""
        obj = self._lookup(info, name, ns)
        return _scale_of(info, obj)

    def update_scale(
        self,
        resource: str | ResourceInfo,
        name: str,
        namespace: str | None,
        replicas: int,
        resource_version: str | None = None,
    ) -> Obj:
        info = self.resolve(resource)
        if info.scale is None:
            raise NotFound(f"the server could not find the requested resource ({info.key}/scale)")
        ns = (namespace or "default") if info.namespaced else ""
        obj = deep_copy(self._lookup(info, name, ns))
        if resource_version and resource_version != obj["metadata"]["resourceVersion"]:
            raise errors.conflict(info.plural, name, info.group)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid(
                "Scale",
                name,
                [
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {replicas}: must be greater than or equal to 0",
                        "spec.replicas",
                    )
                ],
                "autoscaling",
            )
        set_path(obj, info.scale.spec_replicas_path, replicas)
        updated = self._update(info, obj, ns, None, False)
        return _scale_of(info, updated)

    # ----------------------------------------------------------------- watch

    def watch(
        self,
        resource: str | ResourceInfo,
        namespace: str | None = None,
        label_selector: str | LabelSelector = "",
        field_selector: str | FieldSelector = "",
        *,
        resource_version: str | None = None,
        allow_bookmarks: bool = False,
        bookmark_interval: float | None = None,
    ) -> Watch:
        info = self.resolve(resource)
        labels = (
            label_selector
            if isinstance(label_selector, LabelSelector)
            else parse_label_selector(label_selector)
        )
        fields = (
            field_selector
            if isinstance(field_selector, FieldSelector)
            else FieldSelector.parse(field_selector)
        )
        watch = Watch(
            self,
            info,
            namespace if info.namespaced and namespace else None,
            labels,
            fields,
            allow_bookmarks,
            bookmark_interval if bookmark_interval is not None else self.bookmark_interval,
        )
        if resource_version in (None, "", "0"):
            for obj in self.list(info, watch.namespace, labels, fields).items:
                watch._push(WatchEvent("ADDED", obj))
        else:
            try:
                since = int(resource_version)
            except ValueError as exc:
                raise BadRequest(f"invalid resourceVersion {resource_version!r}") from exc
            if self._too_old(since):
                raise Gone(f"too old resource version: {since} ({self._compacted_rv})")
            for entry in self._history:
                if entry.rv > since and entry.key == info.key:
                    watch._offer(entry)
        self._watchers.setdefault(info.key, set()).add(watch)
        return watch

    def _unregister(self, watch: Watch) -> None:
        watchers = self._watchers.get(watch.info.key)
        if watchers is not None:
            watchers.discard(watch)

    def close_all_watches(self, error: ApiError | None = None) -> int:
        """End every open watch (fault injection); returns how many were closed."""
        all_watches = [w for ws in self._watchers.values() for w in ws]
        for watch in all_watches:
            watch.close(error)
        return len(all_watches)

    def compact(self) -> None:
        """Forget the whole watch history (later watches from older versions get 410)."""
        self._history.clear()
        self._compacted_rv = self._rv

    # ----------------------------------------------------------------- hooks

    def _after_write(self, info: ResourceInfo, new: Obj | None, old: Obj | None) -> None:
        key = info.key
        if key == "pods":
            ns = (new or old or {}).get("metadata", {}).get("namespace", "")
            self._disruption.refresh_pdbs(ns)
        elif key == "poddisruptionbudgets.policy" and new is not None:
            self._disruption.refresh_pdbs(new["metadata"]["namespace"])
        elif key == "namespaces" and new is not None and old is None:
            name = new["metadata"]["name"]
            self.create("configmaps", root_ca_configmap(name), name)
        elif key == "customresourcedefinitions.apiextensions.k8s.io":
            if new is not None and not new["metadata"].get("deletionTimestamp"):
                crd_info = crd_resource_infos(new)
                existing_objects = self._objects.get(crd_info.key)
                self.register(crd_info)
                if existing_objects is not None:
                    self._objects[crd_info.key] = existing_objects
            elif new is None and old is not None:
                self.unregister(crd_resource_infos(old).key)


# --------------------------------------------------------------------- pure helpers

ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
_ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters."
)


def root_ca_configmap(namespace: str) -> Obj:
    """What kube-controller-manager's root CA publisher writes into every namespace. The
    emulator serves plain HTTP and has no CA, so the bundle is empty, as that controller
    publishes it when it is given none."""
    return {
        "metadata": {
            "name": ROOT_CA_CONFIGMAP,
            "namespace": namespace,
            "annotations": {"kubernetes.io/description": _ROOT_CA_DESCRIPTION},
        },
        "data": {"ca.crt": ""},
    }


def _scale_of(info: ResourceInfo, obj: Obj) -> Obj:
    assert info.scale is not None
    meta = obj["metadata"]
    status: Obj = {"replicas": int(get_path(obj, info.scale.status_replicas_path) or 0)}
    if info.scale.label_selector_path:
        selector = get_path(obj, info.scale.label_selector_path)
        if selector is not None:
            status["selector"] = selector
    scale_meta = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        if k in meta
    }
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_meta,
        "spec": {"replicas": int(get_path(obj, info.scale.spec_replicas_path) or 0)},
        "status": status,
    }


__all__ = [
    "DEFAULT_NAMESPACES",
    "ROOT_CA_CONFIGMAP",
    "AdmissionHooks",
    "AlreadyExists",
    "ApiError",
    "Collaborators",
    "CollectorHooks",
    "Conflict",
    "DisruptionHooks",
    "Gone",
    "Invalid",
    "ListResult",
    "NotFound",
    "ObjectStore",
    "TooManyRequests",
    "Watch",
    "WatchEvent",
]
