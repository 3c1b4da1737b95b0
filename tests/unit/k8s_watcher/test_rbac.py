"""The ClusterRole and Role of k8s-watcher grant exactly the verbs its code can use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from k8s_watcher.kinds import (
    CREATABLE_KINDS,
    DELETABLE_KINDS,
    KNOWN_KINDS,
    PATCHABLE_KINDS,
    SKYHOOK_NAMESPACE_KINDS,
    STATUS_PATCHABLE_KINDS,
    watched_kind_infos,
)

RBAC = Path(__file__).resolve().parents[3] / "k8s" / "rbac" / "k8s-watcher.yaml"


def granted(kind: str = "ClusterRole") -> dict[tuple[str, str], set[str]]:
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == kind]
    permissions: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                permissions.setdefault((group, resource), set()).update(rule["verbs"])
    return permissions


def used_by_the_code() -> dict[tuple[str, str], set[str]]:
    used: dict[tuple[str, str], set[str]] = {}

    def use(group: str, resource: str, *verbs: str) -> None:
        used.setdefault((group, resource), set()).update(verbs)

    for info in watched_kind_infos():
        use(info.group, info.plural, "list", "watch")
    # A kind name may be served by two groups (DeploymentPolicy: skyhook's and nodewright's).
    by_kind: dict[str, list[Any]] = {}
    for info in KNOWN_KINDS:
        if not info.read_only:  # list and watch only
            by_kind.setdefault(info.kind, []).append(info)
    for kind in CREATABLE_KINDS:
        for info in by_kind[kind]:
            # get: is an AlreadyExists object the one an earlier delivery created?
            use(info.group, info.plural, "create", "get")
    for kind in DELETABLE_KINDS:
        for info in by_kind[kind]:
            use(info.group, info.plural, "delete")
    for kind in PATCHABLE_KINDS:
        for info in by_kind[kind]:
            use(info.group, info.plural, "patch")
    for kind in STATUS_PATCHABLE_KINDS:
        for info in by_kind[kind]:
            use(info.group, info.plural + "/status", "patch")
    use("", "pods/eviction", "create")
    use("", "pods/binding", "create")
    return used


def test_cluster_role_matches_the_verbs_the_code_uses() -> None:
    """Cluster-wide, all but the kinds used in the Skyhook namespace only, which the Role
    there grants (rule 10a)."""
    used = used_by_the_code()
    skyhook_only = {
        (info.group, info.plural) for info in KNOWN_KINDS if info.kind in SKYHOOK_NAMESPACE_KINDS
    }
    assert skyhook_only
    assert granted() == {k: v for k, v in used.items() if k not in skyhook_only}
    assert granted("Role") == {k: v for k, v in used.items() if k in skyhook_only}
