"""In-memory Kubernetes object store: the heart of the API emulator.

In-process actors (simulated kubelet, scheduler, job controller) call this API directly; the
HTTP layer (``clustersim.kube.server``) is a thin adapter over the very same calls, so both see
one consistent cluster.  All CRUD methods are synchronous and never block (call them from the
event-loop thread; the store is not thread-safe); ``watch`` returns an async iterator.

Resources are named like kubectl does: ``"pods"``, ``"nodes"``, ``"jobs.batch"``,
``"poddisruptionbudgets.policy"``, ``"leases.coordination.k8s.io"``,
``"nodesets.nodeflow.dev"``; singular names, kinds and short names (``"pod"``, ``"Pod"``,
``"po"``) resolve too.  Objects are plain JSON dicts (``{"apiVersion", "kind", "metadata",
...}``).

API summary (``store = Store()``)::

    store.create(resource, obj, namespace=None, dry_run=False) -> dict
    store.get(resource, name, namespace=None) -> dict
    store.list(resource, namespace=None, label_selector="", field_selector="",
               limit=None, continue_token=None) -> ListResult(items, resource_version, continue_)
    store.update(resource, obj, namespace=None, subresource=None, dry_run=False) -> dict
    store.patch(resource, name, patch, patch_type=MERGE_PATCH, namespace=None,
                subresource=None, dry_run=False) -> dict
    store.delete(resource, name, namespace=None, grace_period_seconds=None,
                 propagation_policy=None, preconditions=None, dry_run=False) -> DeleteResult
    store.bind(name, namespace, node_name) -> dict            # pods/binding
    store.evict(name, namespace, delete_options=None) -> DeleteResult  # pods/eviction (PDBs)
    store.get_scale(resource, name, ns) / store.update_scale(resource, name, ns, replicas)
    store.watch(resource, namespace=None, label_selector="", field_selector="",
                resource_version=None, allow_bookmarks=False) -> Watch
    store.resource_version -> int                               # current global RV
    store.resolve(resource) -> ResourceInfo

* ``update`` enforces optimistic concurrency: a ``metadata.resourceVersion`` that is not the
  stored one raises ``Conflict`` (409).  Omitting it is an unconditional update.
* ``subresource="status"`` changes only ``.status``; the main resource ignores ``.status`` for
  kinds with a status subresource.  ``metadata.generation`` is bumped on spec changes only.
* ``patch_type`` is one of ``patch.MERGE_PATCH``, ``STRATEGIC_MERGE_PATCH``, ``JSON_PATCH``,
  ``APPLY_PATCH`` (the Content-Type values).
* ``delete``: objects with finalizers get ``deletionTimestamp`` and stay until the finalizers are
  removed.  A pod bound to a node (``spec.nodeName`` set, not terminal) is deleted gracefully:
  it gets ``deletionTimestamp`` + ``deletionGracePeriodSeconds`` and stays until someone (the
  kubelet) deletes it again with ``grace_period_seconds=0``.  ``DeleteResult.deleted`` tells
  whether the object is gone.  Garbage collection follows ``ownerReferences``
  (``propagation_policy`` ``Background`` (default), ``Foreground`` or ``Orphan``).
* ``watch`` registers synchronously (no event between a list and the watch call is lost), then
  ``async for event in w`` yields ``WatchEvent(type, object)`` with type ADDED / MODIFIED /
  DELETED / BOOKMARK.  ``resource_version=None`` or ``"0"`` starts with synthetic ADDED events for
  the current objects; ``"N"`` replays from the retained history after N, raising ``Gone`` (410)
  when N is older than the history window.  ``w.close()`` (or ``async with``) ends it.
* Objects returned by get/create/update/patch are private copies.  Objects in ``list`` items and
  watch events are shared with the store: treat them as read-only (``deep_copy`` them first;
  it lives in ``clustersim.kube.objects``).
* Errors are ``clustersim.kube.errors.ApiError`` subclasses (``NotFound``, ``AlreadyExists``,
  ``Conflict``, ``Invalid``, ``Gone``, ``TooManyRequests``, ...); ``err.status()`` is the
  Kubernetes ``Status`` body.

This module builds the store from its parts: the object store itself (``objectstore``:
resources, resourceVersions, indexes, CRUD, watches and continue tokens) and the collaborators
each Store is constructed with, ``admission.Admission`` (defaulting and validation before an
object is stored), ``gc.GarbageCollector`` (ownerReferences, namespace deletion) and
``disruption.Disruption`` (evictions, PodDisruptionBudgets).  The object store knows them only
as hooks, so the imports run one way (this module -> the collaborators -> ``objectstore``;
``objects`` holds what they all share).
"""

from __future__ import annotations

from collections.abc import Iterable

from clustersim.kube.admission import Admission
from clustersim.kube.disruption import Disruption
from clustersim.kube.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    TooManyRequests,
)
from clustersim.kube.gc import GarbageCollector
from clustersim.kube.objectstore import (
    DEFAULT_NAMESPACES,
    ROOT_CA_CONFIGMAP,
    Collaborators,
    ListResult,
    ObjectStore,
    Watch,
    WatchEvent,
    root_ca_configmap,
)


def collaborators(store: ObjectStore) -> Collaborators:
    """Admission, garbage collection and disruption, each working on ``store``."""
    return Collaborators(
        admission=Admission(store),
        collector=GarbageCollector(store),
        disruption=Disruption(store),
    )


class Store(ObjectStore):
    """The cluster state, with admission, garbage collection and disruption.  See the module
    docstring for the API."""

    def __init__(
        self,
        *,
        history_size: int = 20_000,
        bookmark_interval: float = 30.0,
        namespaces: Iterable[str] = DEFAULT_NAMESPACES,
    ) -> None:
        super().__init__(
            collaborators,
            history_size=history_size,
            bookmark_interval=bookmark_interval,
            namespaces=namespaces,
        )


__all__ = [
    "DEFAULT_NAMESPACES",
    "ROOT_CA_CONFIGMAP",
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Gone",
    "Invalid",
    "ListResult",
    "NotFound",
    "Store",
    "TooManyRequests",
    "Watch",
    "WatchEvent",
    "collaborators",
    "root_ca_configmap",
]
