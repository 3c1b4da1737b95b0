"""Patch algorithms: JSON merge patch (RFC 7386), Kubernetes strategic merge patch and JSON
patch (RFC 6902).  All functions are pure: they never mutate their inputs.

Strategic merge uses the patch metadata of the built-in types: lists whose field name is in
``MERGE_KEYS`` are merged by that key (``conditions`` by ``type``, ``containers`` by ``name``,
...), ``finalizers`` is merged as a set of primitives, every other list is replaced.  The
directives ``$patch: replace|delete|merge``, ``$retainKeys``, ``$setElementOrder/<field>`` and
``$deleteFromPrimitiveList/<field>`` are understood.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from clustersim.kube.errors import BadRequest, Invalid, UnsupportedMediaType

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
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    """Kubernetes strategic merge patch for built-in kinds."""
    if not isinstance(patch, dict):
        raise BadRequest("strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
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
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
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
        return [copy.deepcopy(p) for p in patch]
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
            merged.append({k: copy.deepcopy(v) for k, v in item.items() if not k.startswith("$")})
        else:
            merged[index] = _smp_map(merged[index], item)
    return merged


# --- RFC 6902 ---------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise BadRequest(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise Invalid(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if idx > limit:
        raise Invalid(f"array index {idx} out of bounds")
    return idx


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    current = doc
    for token in tokens[:-1]:
        if isinstance(current, dict):
            if token not in current:
                raise Invalid(f"jsonpatch: path {path!r} does not exist")
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(current, token, allow_end=False)]
        else:
            raise Invalid(f"jsonpatch: path {path!r} does not exist")
    return current


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise Invalid(f"jsonpatch: path {path!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False)]
    raise Invalid(f"jsonpatch: path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise Invalid(f"jsonpatch: cannot add at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise Invalid("jsonpatch: cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise Invalid(f"jsonpatch: remove operation does not apply: {path!r} missing")
        del parent[last]
    elif isinstance(parent, list):
        parent.pop(_index(parent, last, allow_end=False))
    else:
        raise Invalid(f"jsonpatch: cannot remove {path!r}")
    return doc


def json_patch(target: JSON, operations: JSON) -> JSON:
    """Apply RFC 6902 operations; a failed ``test`` or a missing path is 422 Invalid."""
    if not isinstance(operations, list):
        raise BadRequest("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise BadRequest(f"invalid json patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _add(_remove(doc, op["from"]), path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise Invalid(f"jsonpatch: test operation failed at {path!r}")
        else:
            raise BadRequest(f"unknown json patch operation {kind!r}")
    return doc


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
