"""Facts read from API objects, memoised by (uid, resourceVersion).

The API server gives every change of an object a new resourceVersion, so what was read from
one version holds until the next: a pass over 16k nodes and their pods reads only what
changed since the last pass. An object without both uid and resourceVersion is read afresh.
`of_all` (one pass) keeps just the versions it saw, so versions gone from the cluster (and
the objects their facts hold) do not pile up; in between, the memo is dropped once it grows
past its limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

Facts = TypeVar("Facts")
VersionKey = tuple[object, object]


class FactsByVersion(Generic[Facts]):
    def __init__(self, read: Callable[[Mapping[str, Any]], Facts], limit: int) -> None:
        self._read = read
        self._limit = limit
        self._memo: dict[VersionKey, Facts] = {}

    def versions(self) -> set[VersionKey]:
        """The (uid, resourceVersion) pairs held now."""
        return set(self._memo)

    def held(self, key: VersionKey) -> Facts | None:
        return self._memo.get(key)

    def of(self, obj: Mapping[str, Any]) -> Facts:
        metadata = obj.get("metadata")
        if type(metadata) is dict:
            key = (metadata.get("uid"), metadata.get("resourceVersion"))
            if key[0] and key[1]:
                found = self._memo.get(key)
                if found is None:
                    if len(self._memo) >= self._limit:
                        self._memo.clear()
                    found = self._memo[key] = self._read(obj)
                return found
        return self._read(obj)

    def of_each(self, objects: Iterable[Mapping[str, Any]]) -> list[Facts]:
        """The facts of every object, in order, as `of` gives them (the memo keeps every
        version it holds). The lookup is inlined: a preemption pass asks it of every pod."""
        memo, read = self._memo, self._read
        found_facts: list[Facts] = []
        append = found_facts.append
        for obj in objects:
            metadata = obj.get("metadata")
            if type(metadata) is dict:
                key = (metadata.get("uid"), metadata.get("resourceVersion"))
                if key[0] and key[1]:
                    found = memo.get(key)
                    if found is None:
                        if len(memo) >= self._limit:
                            memo.clear()
                        found = memo[key] = read(obj)
                    append(found)
                    continue
            append(read(obj))
        return found_facts

    def of_all(self, objects: Iterable[Mapping[str, Any]]) -> list[Facts]:
        """The facts of every object, in order; afterwards the memo holds just these versions.
        The lookup is inlined: a pass calls this over every node and every pod."""
        memo, read = self._memo, self._read
        kept: dict[VersionKey, Facts] = {}
        found_facts: list[Facts] = []
        append = found_facts.append
        for obj in objects:
            metadata = obj.get("metadata")
            if type(metadata) is dict:
                key = (metadata.get("uid"), metadata.get("resourceVersion"))
                if key[0] and key[1]:
                    found = memo.get(key)
                    if found is None:
                        found = read(obj)
                    kept[key] = found
                    append(found)
                    continue
            append(read(obj))
        self._memo = kept
        return found_facts
