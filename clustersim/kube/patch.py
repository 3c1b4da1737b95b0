"""Patch algorithms: JSON merge patch (RFC 7386, json-merge-patch), JSON patch (RFC 6902,
jsonpatch) and Kubernetes strategic merge patch (ours: no Python library merges lists by the
Go structs' ``patchMergeKey``).  All functions are pure: they never mutate their inputs.

Strategic merge uses the patch metadata of the built-in types: lists whose field name is in
``MERGE_KEYS`` are merged by that key (``conditions`` by ``type``, ``containers`` by ``name``,
...), ``finalizers`` is merged as a set of primitives, every other list is replaced.  The
directives ``$patch: replace|delete|merge``, ``$retainKeys``, ``$setElementOrder/<field>`` and
``$deleteFromPrimitiveList/<field>`` are understood.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import json_merge_patch  # type: ignore[import-untyped]
import jsonpatch
import jsonpointer

from clustersim.kube.errors import BadRequest, Invalid, UnsupportedMediaType
from clustersim.kube.objects import deep_copy

JSON = Any

#: Field name -> merge key for lists of objects merged by a key (the Go structs' patchMergeKey).
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "addresses": "type",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "podIPs": "ip",
}
#: Lists of primitives merged as sets (patchStrategy "merge" without a key).
MERGE_PRIMITIVE_LISTS = frozenset({"finalizers"})

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    # The library merges into its first argument and keeps the patch's values: copy both
    # (through JSON, several times faster than copy.deepcopy on objects of this size).
    return json_merge_patch.merge(deep_copy(target), deep_copy(patch))


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    """Kubernetes strategic merge patch for built-in kinds."""
    if not isinstance(patch, dict):
        raise BadRequest("strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: deep_copy(v) for k, v in patch.items() if not k.startswith("$")}
    if directive == "delete":
        return {}
    result = dict(target)
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            removed = set(map(_hashable, value or []))
            result[name] = [v for v in result.get(name) or [] if _hashable(v) not in removed]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _smp_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = value
    if isinstance(retain, list):
        keep = set(retain)
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, dict | list) else value


def _smp_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    existing: list[Any] = list(current) if isinstance(current, list) else []
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [deep_copy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if field in MERGE_PRIMITIVE_LISTS:
        seen = set(map(_hashable, existing))
        merged = list(existing)
        for item in patch:
            if _hashable(item) not in seen:
                merged.append(item)
                seen.add(_hashable(item))
        return merged
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return [deep_copy(p) for p in patch]
    merged = list(existing)
    for item in patch:
        if key not in item:
            raise BadRequest(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (i for i, e in enumerate(merged) if isinstance(e, dict) and e.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append({k: deep_copy(v) for k, v in item.items() if not k.startswith("$")})
        else:
            merged[index] = _smp_map(merged[index], item)
    return merged


def json_patch(target: JSON, operations: JSON) -> JSON:
    """Apply RFC 6902 operations.  As kube-apiserver: a body that is not a list of objects is
    400 Bad Request; an operation that cannot apply (a failed ``test``, a missing path, an
    unknown ``op``) is 422 Invalid with the library's message, and nothing is applied."""
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise BadRequest("json patch must be a list of operations")
    document = deep_copy(target)
    try:
        for operation in deep_copy(operations):
            step = jsonpatch.JsonPatch([_as_kube_apiserver_applies(document, operation)])
            document = step.apply(document, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise Invalid(f"the JSON patch could not be applied: {exc}") from exc
    return document


def _as_kube_apiserver_applies(document: JSON, operation: dict[str, Any]) -> dict[str, Any]:
    """kube-apiserver's JSON patch (evanphx/json-patch v4) lets ``replace`` set an object
    member that does not exist, where RFC 6902 (and the library) refuse: it becomes ``add``."""
    path = operation.get("path")
    if operation.get("op") != "replace" or not isinstance(path, str) or not path:
        return operation
    try:
        parts = jsonpointer.JsonPointer(path).parts
        parent = jsonpointer.JsonPointer.from_parts(parts[:-1]).resolve(document)
    except jsonpointer.JsonPointerException:
        return operation  # the library reports the bad path
    if isinstance(parent, dict) and parts[-1] not in parent:
        return {**operation, "op": "add"}
    return operation


def result_is_fresh(patch_type: str, *, strategic: bool) -> bool:
    """Whether `apply_patch` returns a document that shares nothing with its target (a
    strategic merge reuses the target's unchanged parts)."""
    if patch_type in (JSON_PATCH, MERGE_PATCH):
        return True
    return patch_type == APPLY_PATCH and not strategic


def apply_patch(target: JSON, patch: JSON, patch_type: str, *, strategic: bool) -> JSON:
    """Dispatch on the Content-Type of a PATCH request."""
    if patch_type == JSON_PATCH:
        return json_patch(target, patch)
    if patch_type == MERGE_PATCH:
        return merge_patch(target, patch)
    if patch_type == STRATEGIC_MERGE_PATCH:
        if not strategic:
            raise UnsupportedMediaType(
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}"
            )
        return strategic_merge_patch(target, patch)
    if patch_type == APPLY_PATCH:
        if strategic:
            return strategic_merge_patch(target, patch)
        return merge_patch(target, patch)
    raise UnsupportedMediaType(f"unsupported patch type {patch_type!r}")
