"""Rule 7e, revision history: one apps/v1 ControllerRevision per template a NodeSet has run
(pure), so `kubectl nodeflow rollout undo` can put an earlier template back.

As for a DaemonSet or StatefulSet (and Slinky's NodeSet):

- The revision of a template is the hash its pods already carry in `controller-revision-hash`
  (`podspec.revision_hash` of `.spec.template.spec`); its ControllerRevision is named
  `<nodeset>-<hash>`, owned by the NodeSet (garbage collection removes the history with it),
  labelled `nodeflow.dev/nodeset: <nodeset>` and with the hash label, and its `data` holds
  `{"spec": {"template": ...}}`, the patch that puts that template back.
- A template no revision holds is created with `revision` one above the highest
  (`create on change`). Going back to a template whose revision still exists takes that
  revision to the top of the history (`reuse on rollback`): no duplicate, and the history's
  order stays the order the templates were applied in. Kubernetes' controllers raise the
  object's `revision` with an update; kube-apiserver refuses any update of a
  ControllerRevision whose stored `data` bytes its own JSON encoder would not write the same
  (it compares the raw bytes, and k8s-watcher's client writes JSON with spaces), so here the
  revision is deleted (uid and resourceVersion preconditions) and made again under the same
  name with the next number: one object per template, as there.
- Revisions beyond `spec.revisionHistoryLimit` (default 10) are deleted, oldest `revision`
  first, counting only the revisions not live: the update revision, the current revision
  and any revision a pod of the NodeSet still carries are never deleted (`prune`).
- The status reports `updateRevision` (the template's revision) and `currentRevision` (the
  revision the NodeSet's pods run: the update revision once every pod carries it; until
  then the one reported before while a pod still carries it, else the one most pods carry).

The hash covers the pod spec alone, as the pods' label does: a template changed only in its
metadata rolls no pod and makes no new revision (the revision keeps the metadata it was
created with). Everything is read back from the API objects (the revisions as k8s-watcher
mirrors them, the pods, the NodeSet's status), so a restarted controller plans the same.
"""

from __future__ import annotations

import copy
import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeflow_contracts.pod_protocol import NODESET_LABEL, REVISION_LABEL
from nodeflow_kube.fields import labels_of, meta, name_of, resource_version_of, uid_of
from nodeset_controller.objects import NODESET_KIND, owned_by_nodeset
from nodeset_controller.spec import NodeSetSpec

Obj = Mapping[str, Any]

REVISION_API_VERSION = "apps/v1"
REVISION_KIND = "ControllerRevision"
_MAX_NAME = 253


@dataclass(frozen=True)
class CreateRevision:
    """Create the ControllerRevision of the NodeSet's template (`revision_object`)."""

    name: str
    hash: str
    revision: int
    why: str


@dataclass(frozen=True)
class DeleteRevision:
    """Delete a revision beyond the history limit (uid and resourceVersion preconditions)."""

    name: str
    uid: str
    resource_version: str
    why: str


HistoryAction = CreateRevision | DeleteRevision


@dataclass(frozen=True)
class HistoryPlan:
    actions: list[HistoryAction] = field(default_factory=list)
    update_revision: str = ""
    current_revision: str = ""


def revision_name(nodeset_name: str, revision_hash: str) -> str:
    """`<nodeset>-<hash>`; a name too long for an object name keeps its start and a digest
    of the whole, so two NodeSets never share a revision name."""
    name = f"{nodeset_name}-{revision_hash}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: _MAX_NAME - 11]}-{digest}"


def revision_number(revision: Obj) -> int:
    number = revision.get("revision")
    return number if isinstance(number, int) and not isinstance(number, bool) else 0


def revision_template(revision: Obj) -> Mapping[str, Any] | None:
    """The template a revision puts back (its `data.spec.template`), None if it holds none."""
    data = revision.get("data")
    spec = data.get("spec") if isinstance(data, Mapping) else None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    return template if isinstance(template, Mapping) else None


def revision_object(spec: NodeSetSpec, revision_hash: str, revision: int) -> dict[str, Any]:
    """The ControllerRevision of the NodeSet's template as created."""
    return {
        "apiVersion": REVISION_API_VERSION,
        "kind": REVISION_KIND,
        "metadata": {
            "name": revision_name(spec.name, revision_hash),
            "namespace": spec.namespace,
            "labels": {NODESET_LABEL: spec.name, REVISION_LABEL: revision_hash},
            "ownerReferences": owned_by_nodeset(spec.name, spec.uid),
        },
        "data": {"spec": {"template": copy.deepcopy(dict(spec.template))}},
        "revision": revision,
    }


def owned_by(revision: Obj, spec: NodeSetSpec) -> bool:
    """The revision is the NodeSet's: labelled with it and controlled by its uid."""
    if labels_of(revision).get(NODESET_LABEL) != spec.name:
        return False
    refs = meta(revision).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(ref, Mapping)
        and ref.get("kind") == NODESET_KIND
        and ref.get("uid") == spec.uid
        and ref.get("controller") is True
        for ref in refs
    )


def sorted_history(revisions: Iterable[Obj]) -> list[Obj]:
    """Oldest first: by `revision`, then by name (as apimachinery's history sort)."""
    return sorted(revisions, key=lambda r: (revision_number(r), name_of(r)))


def plan_history(
    spec: NodeSetSpec,
    revision_hash: str,
    revisions: Collection[Obj],
    pod_hashes: Collection[str],
    reported: Mapping[str, Any],
    live_hashes: Collection[str] = (),
) -> HistoryPlan:
    """The revision actions and the two status fields for the NodeSet's template
    `revision_hash`, its revisions as mirrored (any of its namespace), the hashes its
    counted pods carry (for currentRevision), those of every pod it still has, leaving or
    terminating ones too (`live_hashes`, never pruned), and its status as stored
    (`reported`)."""
    ours = sorted_history(r for r in revisions if owned_by(r, spec))
    by_name = {name_of(r): r for r in ours}
    update = revision_name(spec.name, revision_hash)
    highest = revision_number(ours[-1]) if ours else 0
    actions: list[HistoryAction] = []
    existing = by_name.get(update)
    if existing is None:
        if update not in {name_of(r) for r in revisions}:
            # Not taken by an object that is not ours (that one is never touched).
            actions.append(
                CreateRevision(
                    update,
                    revision_hash,
                    highest + 1,
                    f"template {revision_hash} is new: revision {highest + 1}",
                )
            )
    elif name_of(ours[-1]) != update:
        # A rollback: made again, once gone, as the newest (see the module docstring).
        actions.append(
            DeleteRevision(
                update,
                uid_of(existing),
                resource_version_of(existing),
                f"template back to revision {revision_number(existing)}: made again as "
                f"revision {highest + 1}",
            )
        )
    current = current_revision(spec.name, update, pod_hashes, reported)
    live = {update, current}
    live.update(revision_name(spec.name, h) for h in (*pod_hashes, *live_hashes) if h)
    history = [r for r in ours if name_of(r) not in live]
    excess = len(history) - spec.revision_history_limit
    for old in history[: max(excess, 0)]:
        actions.append(
            DeleteRevision(
                name_of(old),
                uid_of(old),
                resource_version_of(old),
                f"revision {revision_number(old)} is beyond revisionHistoryLimit "
                f"{spec.revision_history_limit} and no pod runs it",
            )
        )
    return HistoryPlan(actions, update_revision=update, current_revision=current)


def current_revision(
    nodeset_name: str, update: str, pod_hashes: Collection[str], reported: Mapping[str, Any]
) -> str:
    """The revision the pods run: `update` once none carries another; otherwise the one
    reported before while a pod still carries it, else the one most pods carry."""
    others = Counter(revision_name(nodeset_name, h) for h in pod_hashes if h)
    others.pop(update, None)
    if not others:
        return update
    before = reported.get("currentRevision")
    if isinstance(before, str) and before in others:
        return before
    return min(others, key=lambda name: (-others[name], name))
