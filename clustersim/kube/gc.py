"""Garbage collection: what deleting an object does to the objects that name it in their
``ownerReferences`` (Background, Foreground and Orphan propagation, and finishing a Foreground
deletion once its dependents are gone), and deleting a namespace: everything in it goes, then the
namespace once it is empty and has no finalizers left."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.kube.errors import NotFound
from clustersim.kube.objects import DeleteResult, Obj, deep_copy, now_rfc3339
from clustersim.kube.patch import MERGE_PATCH
from clustersim.kube.resources import ResourceInfo

if TYPE_CHECKING:
    from clustersim.kube.objectstore import ObjectStore


class GarbageCollector:
    """Follows ownerReferences and namespaces for ``store`` (which owns it and keeps the
    dependents index it reads)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def dependent_refs(self, uid: str) -> list[tuple[ResourceInfo, Obj]]:
        out = []
        for ref in list(self._store._dependents.get(uid, ())):
            key, ns, name = ref.split("\x00")
            info = self._store._infos.get(key)
            obj = self._store._objects.get(key, {}).get(ns, {}).get(name) if info else None
            if info is not None and obj is not None:
                out.append((info, obj))
        return out

    def delete_dependents(self, uid: str, policy: str) -> None:
        for info, obj in self.dependent_refs(uid):
            meta = obj["metadata"]
            if meta.get("deletionTimestamp") and policy == "Background":
                continue
            try:
                self._store.delete(
                    info, meta["name"], meta.get("namespace"), propagation_policy=policy
                )
            except NotFound:
                continue

    def orphan_dependents(self, uid: str) -> None:
        for info, obj in self.dependent_refs(uid):
            refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            patch = {"metadata": {"ownerReferences": refs or None}}
            self._store.patch(
                info, obj["metadata"]["name"], patch, MERGE_PATCH, obj["metadata"].get("namespace")
            )

    def maybe_finish_foreground(self, owner_uid: str) -> None:
        location = self._store._by_uid.get(owner_uid)
        if location is None:
            return
        key, ns, name = location
        owner = self._store._objects[key].get(ns, {}).get(name)
        if owner is None:
            return
        finalizers = owner["metadata"].get("finalizers") or []
        if "foregroundDeletion" not in finalizers or self.dependent_refs(owner_uid):
            return
        remaining = [f for f in finalizers if f != "foregroundDeletion"]
        self._store.patch(
            key, name, {"metadata": {"finalizers": remaining or None}}, MERGE_PATCH, ns or None
        )

    def delete_namespace(self, info: ResourceInfo, new: Obj, existing: Obj) -> DeleteResult:
        meta = new["metadata"]
        name = meta["name"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_rfc3339()
            new["status"] = {"phase": "Terminating"}
            self._store._stamp(new)
            self._store._bucket(info, "")[name] = new
            self._store._commit(info, "MODIFIED", new, existing)
        for other in list(self._store._infos.values()):
            if not other.namespaced:
                continue
            for obj in list(self._store._objects[other.key].get(name, {}).values()):
                if obj["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    self._store.delete(other, obj["metadata"]["name"], name)
                except NotFound:
                    continue
        self.maybe_finish_namespace(name)
        current = self._store._objects["namespaces"][""].get(name)
        return DeleteResult(deep_copy(current or new), current is None)

    def maybe_finish_namespace(self, ns: str) -> None:
        namespace = self._store._objects["namespaces"].get("", {}).get(ns)
        if namespace is None or not namespace["metadata"].get("deletionTimestamp"):
            return
        for other in self._store._infos.values():
            if other.namespaced and self._store._objects[other.key].get(ns):
                return
        if namespace["metadata"].get("finalizers"):
            return
        final = deep_copy(namespace)
        final.get("spec", {}).pop("finalizers", None)
        self._store._remove(self._store._infos["namespaces"], final, namespace)
