"""`kubectl nodeflow skyhook|nodewright VERB`: the verbs of upstream's `kubectl skyhook`
(NVIDIA Skyhook, renamed NodeWright), with their names and meanings, for Skyhook objects
(skyhook.nvidia.com) and NodeWright objects (nodewright.nvidia.com), each group with its own
keys from nodeflow_contracts.skyhook.

Each verb writes only what maintenance-scheduler's Skyhook controller reads:
- pause/resume, disable/enable: the `<group>/pause` / `<group>/disable` annotation of the
  object ("true", or removed);
- node ignore/unignore: the `<group>/ignore` label of nodes;
- package rerun: the package's entry (`name|version`) of the node's `nodeState_<name>`
  annotation, removed (or, with --stage, put back in_progress at that stage);
- node reset: the node's `nodeState_<name>` annotation, removed;
- reset: every node's marks of the object (nodeState, status, version and cordon
  annotations, the status label, the group's autoTaint_<taint key> mark) and, unless
  --skip-batch-reset, the rollout's batch state in the object's status (as
  `deployment-policy reset` alone);
- package logs: only reads, the logs of the package's stage pods.

A patch that edits or removes a node's nodeState carries the node's resourceVersion, so a
state the controller wrote since the node was read is never overwritten: the verb reads the
node again and decides again. The patch builders here are pure (objects in, patch out); the
verbs at the bottom do the reads and writes through a `KubeApi` (nodeflow_cli.main.Kube).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from nodeflow_contracts.skyhook import SkyhookNames

Obj = Mapping[str, Any]

# The stages `package rerun --stage` and `package logs --stage` take (upstream's list).
STAGES = ("apply", "config", "interrupt", "post-interrupt")
MERGE_PATCH = "application/merge-patch+json"
# A node patch refused for a stale resourceVersion is decided again on the node read anew;
# past this many tries the controller keeps writing the node, and the verb says so.
CONFLICT_RETRIES = 5
# Characters that make a node argument a regular expression (upstream's rule): anything else
# names one node exactly.
_REGEX_CHARS = frozenset(".*+?^${}[]|()\\")


class VerbError(Exception):
    """The verb cannot do what it was asked (no such object, a bad pattern): exit 1."""


class Conflict(Exception):
    """The API server refused a patch: its resourceVersion precondition no longer holds."""


def _meta(obj: Obj) -> Obj:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def _strings(raw: object) -> Mapping[str, str]:
    return raw if isinstance(raw, Mapping) else {}


def name_of(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return _strings(_meta(obj).get("annotations"))


def labels_of(obj: Obj) -> Mapping[str, str]:
    return _strings(_meta(obj).get("labels"))


# --- selecting nodes ------------------------------------------------------------------------


def match_nodes(patterns: Iterable[str], names: Iterable[str]) -> list[str]:
    """The nodes named by `patterns`, sorted: a pattern with a regex character is a regular
    expression matched against the whole name, any other names one node exactly."""
    available = sorted(set(names))
    matched: set[str] = set()
    for pattern in patterns:
        if _REGEX_CHARS.isdisjoint(pattern):
            matched.update(n for n in available if n == pattern)
            continue
        try:
            expression = re.compile(pattern)
        except re.error as exc:
            raise VerbError(f"invalid node pattern {pattern!r}: {exc}") from exc
        matched.update(n for n in available if expression.fullmatch(n))
    return sorted(matched)


# --- node state -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    """A node's nodeState annotation for one object: its entries by key (`name|version`)."""

    node: str
    resource_version: str
    entries: Mapping[str, Obj]


def node_state(node: Obj, annotation: str) -> NodeState | None:
    """The node's state for the object whose nodeState annotation is `annotation`; None when
    the node has none. An annotation that is not a JSON object of objects raises VerbError:
    nothing is edited on a node whose state cannot be read."""
    raw = annotations_of(node).get(annotation)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise VerbError(f"node {name_of(node)}: {annotation} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise VerbError(f"node {name_of(node)}: {annotation} is not a map of package states")
    return NodeState(name_of(node), str(_meta(node).get("resourceVersion") or ""), data)


def _node_patch(
    resource_version: str,
    annotations: Mapping[str, str | None],
    labels: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """A merge patch of a node's metadata; with `resource_version` the API server refuses it
    (409) once the node changed since it was read."""
    metadata: dict[str, Any] = {"annotations": dict(annotations)}
    if labels:
        metadata["labels"] = dict(labels)
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def package_key(skyhook: Obj, package: str) -> str:
    """The package's key in a nodeState annotation (`name|version`, upstream's unique
    name), from the object's spec; VerbError when the object has no such package."""
    packages = (skyhook.get("spec") or {}).get("packages") or {}
    found = packages.get(package) if isinstance(packages, Mapping) else None
    if not isinstance(found, Mapping):
        names = ", ".join(sorted(packages)) if isinstance(packages, Mapping) else ""
        raise VerbError(
            f"package {package!r} is not in {name_of(skyhook)}'s spec.packages ({names or 'none'})"
        )
    return f"{package}|{found.get('version') or ''}"


def rerun_patch(
    state: NodeState, annotation: str, key: str, stage: str | None
) -> dict[str, Any] | None:
    """The patch that makes the package of `key` run again on the node: its entry removed
    (it starts again from its first stage; the annotation removed once empty) or, with
    `stage`, the entry back to that stage, in progress. None when the node has no entry of
    that package."""
    if key not in state.entries:
        return None
    entries = {k: dict(v) for k, v in state.entries.items()}
    if stage is None:
        del entries[key]
    else:
        entries[key].update(stage=stage, state="in_progress")
    value = json.dumps(entries, sort_keys=True, separators=(",", ":")) if entries else None
    return _node_patch(state.resource_version, {annotation: value})


def node_reset_patch(state: NodeState, annotation: str) -> dict[str, Any]:
    """`node reset`: the node's whole state for the object removed, so every package runs
    again from its first stage."""
    return _node_patch(state.resource_version, {annotation: None})


def reset_patch(
    state: NodeState, node_annotations: Sequence[str], node_labels: Sequence[str]
) -> dict[str, Any]:
    """`reset`: every mark of the object on the node removed (its nodeState first among
    `node_annotations`), as if the object had never run there."""
    return _node_patch(
        state.resource_version,
        dict.fromkeys(node_annotations),
        dict.fromkeys(node_labels),
    )


def batch_reset_patch(skyhook: Obj) -> dict[str, Any]:
    """`deployment-policy reset` (and `reset` unless --skip-batch-reset): a status merge
    patch that starts the rollout again from batch 1 in every compartment and forgets which
    nodes it picked (nodePriority) and its order offset."""
    status = skyhook.get("status") or {}
    compartments = status.get("compartmentStatuses") or {}
    patch: dict[str, Any] = {"nodeOrderOffset": 0, "nodePriority": None}
    if isinstance(compartments, Mapping) and compartments:
        patch["compartmentStatuses"] = {
            name: {"batchState": fresh_batch_state()} for name in sorted(compartments)
        }
    return {"status": patch}


def fresh_batch_state() -> dict[str, Any]:
    return {
        "currentBatch": 1,
        "consecutiveFailures": 0,
        "completedNodes": 0,
        "failedNodes": 0,
        "shouldStop": False,
        "lastBatchSize": 0,
        "lastBatchFailed": False,
    }


def batch_summary(skyhook: Obj) -> list[str]:
    """One line per compartment with a batch state: its batch and node counts."""
    compartments = (skyhook.get("status") or {}).get("compartmentStatuses") or {}
    lines = []
    for name in sorted(compartments if isinstance(compartments, Mapping) else {}):
        batch = (compartments[name] or {}).get("batchState")
        if isinstance(batch, Mapping):
            lines.append(
                f"  {name}: batch {batch.get('currentBatch', 1)}, "
                f"{batch.get('completedNodes', 0)} completed, {batch.get('failedNodes', 0)} failed"
                + (", stopped" if batch.get("shouldStop") else "")
            )
    return lines


def annotation_patch(key: str, value: str | None) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) one annotation of an object."""
    return {"metadata": {"annotations": {key: value}}}


def ignore_patch(node: Obj, label: str, ignore: bool) -> dict[str, Any] | None:
    """The ignore label set to "true" (or removed); None when the node already is so."""
    ignored = labels_of(node).get(label) == "true"
    if ignored == ignore:
        return None
    return {"metadata": {"labels": {label: "true" if ignore else None}}}


# --- package logs ---------------------------------------------------------------------------


def pod_selector(name_label: str, owner: str, package_label: str, package: str) -> str:
    return f"{name_label}={owner},{package_label}={package}"


def log_pods(
    pods: Iterable[Obj], node_patterns: Sequence[str], stage_label: str, stage: str | None
) -> list[Obj]:
    """The package's stage pods to show, newest first, on the nodes named (all when none)
    and of `stage` (all when None)."""
    chosen = []
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node_patterns and not match_nodes(node_patterns, [node]):
            continue
        if stage is not None and labels_of(pod).get(stage_label) != stage:
            continue
        chosen.append(pod)
    return sorted(chosen, key=lambda p: str(_meta(p).get("creationTimestamp") or ""), reverse=True)


def container_state(pod: Obj, container: str) -> str:
    """`running`, `waiting: REASON`, `exit CODE` or `unknown`, from the pod's status."""
    status = pod.get("status") or {}
    for entry in [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]:
        if entry.get("name") != container:
            continue
        state = entry.get("state") or {}
        if "running" in state:
            return "running"
        if "terminated" in state:
            return f"exit {(state['terminated'] or {}).get('exitCode', '?')}"
        if "waiting" in state:
            return f"waiting: {(state['waiting'] or {}).get('reason') or 'not started'}"
    return "unknown"


def log_containers(pod: Obj) -> list[str]:
    """The stage's containers of a package pod (the stage and its check), in order: the init
    containers but the one that only copies the package in (`-init`)."""
    spec = pod.get("spec") or {}
    names = [str(c.get("name") or "") for c in spec.get("initContainers") or ()]
    return [n for n in names if n and not n.endswith("-init")]


def log_query(container: str, tail: int | None, follow: bool) -> str:
    query: dict[str, str] = {"container": container}
    if tail is not None and tail >= 0:
        query["tailLines"] = str(tail)
    if follow:
        query["follow"] = "true"
    return urlencode(query)


# --- the verbs ------------------------------------------------------------------------------


class KubeApi(Protocol):
    async def get(self, path: str) -> Obj | None: ...

    async def patch(self, path: str, body: Any, content_type: str) -> Obj: ...

    def stream_text(self, path: str, *, follow: bool = False) -> AsyncIterator[bytes]: ...


NODES = "/api/v1/nodes"
# Asks the user to go on (the prompt given); None: --confirm was given, nothing is asked.
Confirm = Callable[[str], bool] | None
Say = Callable[[str], None]

# verb: (the annotation's attribute of SkyhookNames, the value written, what it did)
LIFECYCLE: Mapping[str, tuple[str, str | None, str]] = {
    "pause": ("pause_annotation", "true", "paused"),
    "resume": ("pause_annotation", None, "resumed"),
    "disable": ("disable_annotation", "true", "disabled"),
    "enable": ("disable_annotation", None, "enabled"),
}


def resource(names: SkyhookNames, name: str) -> str:
    """The object as kubectl names it in its output (`skyhook.skyhook.nvidia.com/gpu-init`)."""
    return f"{names.singular}.{names.group}/{name}"


def object_path(names: SkyhookNames, name: str) -> str:
    return f"{names.collection_path}/{quote(name, safe='')}"


def node_path(name: str) -> str:
    return f"{NODES}/{quote(name, safe='')}"


def reset_annotations(names: SkyhookNames, name: str) -> tuple[str, ...]:
    """Every node annotation the controller writes for one object, its nodeState first."""
    return (
        names.node_state_annotation(name),
        names.status_key(name),
        names.version_annotation(name),
        names.cordon_annotation(name),
    )


def auto_taint_marks(node: Obj, names: SkyhookNames) -> tuple[str, ...]:
    """The group's `autoTaint_<taint key>` annotations on the node, which `reset` removes.
    Upstream's reset names `autoTaint_<object name>`, a key its controller never writes (it
    keys the mark by the runtime-required taint's key, as maintenance-scheduler does): the
    mark the controller does write goes, so a node left with no mark of either group is new
    again and gets the runtime-required taint back before its packages run again (a node
    another object still marks is not new, whatever this mark says)."""
    marker = names.auto_taint_annotation("")
    return tuple(sorted(k for k in annotations_of(node) if k.startswith(marker)))


async def get_object(kube: KubeApi, names: SkyhookNames, name: str) -> Obj:
    found = await kube.get(object_path(names, name))
    if found is None:
        raise VerbError(f"{names.kind} {name} not found")
    return found


async def nodes_of(kube: KubeApi) -> list[Obj]:
    listed = await kube.get(NODES) or {}
    return [n for n in listed.get("items") or () if isinstance(n, Mapping)]


def _packages(count: int) -> str:
    return f"{count} package" if count == 1 else f"{count} packages"


def _go_on(confirm: Confirm, question: str, say: Say) -> bool:
    if confirm is None or confirm(question):
        return True
    say("aborted: nothing changed")
    return False


async def lifecycle(
    kube: KubeApi,
    names: SkyhookNames,
    verb: str,
    name: str,
    *,
    dry_run: bool,
    confirm: Confirm,
    say: Say,
) -> bool:
    """pause, resume, disable, enable: the object's pause or disable annotation set to
    "true" or removed. The controller starts no new stage of a paused object (running Jobs
    end) and nothing at all for a disabled one."""
    attribute, value, done = LIFECYCLE[verb]
    key: str = getattr(names, attribute)
    obj = await get_object(kube, names, name)
    title = resource(names, name)
    current = annotations_of(obj).get(key)
    if (current == value) if value is not None else current is None:
        say(f"{title} unchanged ({key} is {current or 'not set'})")
        return True
    if dry_run:
        say(f"{title} {done} (dry run)")
        return True
    if not _go_on(confirm, f"{verb} {names.kind} {name}?", say):
        return False
    await kube.patch(object_path(names, name), annotation_patch(key, value), MERGE_PATCH)
    say(f"{title} {done}")
    return True


async def _edit_node(
    kube: KubeApi, node: Obj, build: Callable[[Obj], dict[str, Any] | None]
) -> bool:
    """Apply `build(node)`'s patch (None: nothing to do); on a 409 (the node changed since it
    was read) read the node again and build again. False when there was nothing to do."""
    name = name_of(node)
    for _ in range(CONFLICT_RETRIES):
        patch = build(node)
        if patch is None:
            return False
        try:
            await kube.patch(node_path(name), patch, MERGE_PATCH)
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
            fresh = await kube.get(node_path(name))
            if fresh is None:
                return False
            node = fresh
            continue
        return True
    raise VerbError(f"node {name} kept changing under {CONFLICT_RETRIES} tries; run it again")


def _states(nodes: Iterable[Obj], annotation: str, say: Say) -> dict[str, tuple[Obj, NodeState]]:
    """The nodes with a state for the object, by name; a node whose state cannot be read is
    named and left alone."""
    found: dict[str, tuple[Obj, NodeState]] = {}
    for node in nodes:
        try:
            state = node_state(node, annotation)
        except VerbError as exc:
            say(f"skipped: {exc}")
            continue
        if state is not None:
            found[state.node] = (node, state)
    return found


async def package_rerun(
    kube: KubeApi,
    names: SkyhookNames,
    package: str,
    owner: str,
    node_patterns: Sequence[str],
    *,
    stage: str | None,
    dry_run: bool,
    confirm: Confirm,
    say: Say,
) -> bool:
    """`package rerun PACKAGE`: on each node named that has a state of the package, its
    entry removed from the node's nodeState (or back at `stage`, in progress)."""
    if stage is not None and stage not in STAGES:
        raise VerbError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    obj = await get_object(kube, names, owner)
    key = package_key(obj, package)
    annotation = names.node_state_annotation(owner)
    states = _states(await nodes_of(kube), annotation, say)
    chosen = [n for n in match_nodes(node_patterns, states) if key in states[n][1].entries]
    if not chosen:
        say(f"no node named has a state of package {key} for {names.kind} {owner}")
        return True
    again = f"from stage {stage}" if stage else "from its first stage"
    say(f"{resource(names, owner)} package {key} runs again {again} on {len(chosen)} node(s):")
    for node in chosen:
        entry = states[node][1].entries[key]
        say(f"  {node} (now {entry.get('stage', '?')} {entry.get('state', '?')})")
    if dry_run:
        say("dry run: nothing changed")
        return True
    if not _go_on(confirm, f"rerun package {key} on {len(chosen)} node(s)?", say):
        return False
    done = 0
    for node in chosen:

        def build(current: Obj) -> dict[str, Any] | None:
            state = node_state(current, annotation)
            return None if state is None else rerun_patch(state, annotation, key, stage)

        done += await _edit_node(kube, states[node][0], build)
    say(f"package {key} reset on {done} node(s)")
    return True


async def node_reset(
    kube: KubeApi,
    names: SkyhookNames,
    owner: str,
    node_patterns: Sequence[str],
    *,
    dry_run: bool,
    confirm: Confirm,
    say: Say,
) -> bool:
    """`node reset NODE...`: the object's whole nodeState removed from each node named, so
    every package runs again there from its first stage."""
    await get_object(kube, names, owner)
    annotation = names.node_state_annotation(owner)
    states = _states(await nodes_of(kube), annotation, say)
    chosen = match_nodes(node_patterns, states)
    if not chosen:
        say(f"no node named has a state for {names.kind} {owner}")
        return True
    say(f"{resource(names, owner)}: every package runs again on {len(chosen)} node(s):")
    for node in chosen:
        say(f"  {node} ({_packages(len(states[node][1].entries))})")
    if dry_run:
        say("dry run: nothing changed")
        return True
    if not _go_on(confirm, f"reset {len(chosen)} node(s) for {names.kind} {owner}?", say):
        return False
    done = 0
    for node in chosen:

        def build(current: Obj) -> dict[str, Any] | None:
            state = node_state(current, annotation)
            return None if state is None else node_reset_patch(state, annotation)

        done += await _edit_node(kube, states[node][0], build)
    say(f"{done} node(s) reset")
    return True


async def reset(
    kube: KubeApi,
    names: SkyhookNames,
    owner: str,
    *,
    batches: bool,
    dry_run: bool,
    confirm: Confirm,
    say: Say,
) -> bool:
    """`reset NAME`: every node's marks of the object removed (the rollout starts over on
    every node) and, with `batches`, its batch state reset (`deployment-policy reset`)."""
    obj = await get_object(kube, names, owner)
    marks = reset_annotations(names, owner)
    states = _states(await nodes_of(kube), marks[0], say)
    title = resource(names, owner)
    say(f"{title}: every package runs again on {len(states)} node(s):")
    for node in sorted(states):
        say(f"  {node} ({_packages(len(states[node][1].entries))})")
    if batches:
        say("and the rollout starts again from batch 1")
    if dry_run:
        say("dry run: nothing changed")
        return True
    if not _go_on(confirm, f"reset {names.kind} {owner} on {len(states)} node(s)?", say):
        return False
    done = 0
    for node in sorted(states):

        def build(current: Obj) -> dict[str, Any] | None:
            state = node_state(current, marks[0])
            if state is None:
                return None
            every_mark = (*marks, *auto_taint_marks(current, names))
            return reset_patch(state, every_mark, (names.status_key(owner),))

        done += await _edit_node(kube, states[node][0], build)
    say(f"{done} node(s) reset")
    if batches:
        await kube.patch(f"{object_path(names, owner)}/status", batch_reset_patch(obj), MERGE_PATCH)
        say(f"{title} batch state reset")
    return True


async def policy_reset(
    kube: KubeApi,
    names: SkyhookNames,
    owner: str,
    *,
    dry_run: bool,
    confirm: Confirm,
    say: Say,
) -> bool:
    """`deployment-policy reset NAME`: the object's rollout starts again from batch 1 in
    every compartment (its nodes keep their state)."""
    obj = await get_object(kube, names, owner)
    title = resource(names, owner)
    current = batch_summary(obj)
    say(f"{title} batch state:" if current else f"{title} has no batch state yet")
    for line in current:
        say(line)
    if dry_run:
        say("dry run: nothing changed")
        return True
    if not _go_on(confirm, f"reset the batch state of {names.kind} {owner}?", say):
        return False
    await kube.patch(f"{object_path(names, owner)}/status", batch_reset_patch(obj), MERGE_PATCH)
    say(f"{title} batch state reset: the rollout starts again from batch 1")
    return True


async def node_ignore(
    kube: KubeApi,
    names: SkyhookNames,
    node_patterns: Sequence[str],
    *,
    ignore: bool,
    dry_run: bool,
    say: Say,
) -> bool:
    """`node ignore|unignore NODE...`: the ignore label set to "true" (or removed) on each
    node named. An ignored node stays a target of every object of the group but runs
    nothing (it shows blocked)."""
    nodes = {name_of(n): n for n in await nodes_of(kube)}
    chosen = match_nodes(node_patterns, nodes)
    if not chosen:
        say("no node matched")
        return True
    verb = "ignored" if ignore else "unignored"
    done = 0
    for node in chosen:
        patch = ignore_patch(nodes[node], names.ignore_label, ignore)
        if patch is None:
            say(f"node/{node} unchanged (already {'ignored' if ignore else 'not ignored'})")
            continue
        if not dry_run:
            await kube.patch(node_path(node), patch, MERGE_PATCH)
        done += 1
        say(f"node/{node} {verb}" + (" (dry run)" if dry_run else ""))
    return True


async def package_logs(
    kube: KubeApi,
    names: SkyhookNames,
    package: str,
    owner: str,
    namespace: str,
    node_patterns: Sequence[str],
    *,
    stage: str | None,
    tail: int | None,
    follow: bool,
    write: Callable[[bytes], None],
    say: Say,
) -> bool:
    """`package logs PACKAGE`: the logs of the package's stage pods (newest first) in the
    controller's namespace, each stage container (the stage and its check) under a header
    naming the pod, its node and the container's state."""
    if stage is not None and stage not in STAGES:
        raise VerbError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    ns = quote(namespace, safe="")
    selector = pod_selector(names.name_label, owner, names.package_label, package)
    listed = await kube.get(
        f"/api/v1/namespaces/{ns}/pods?{urlencode({'labelSelector': selector})}"
    )
    pods = [p for p in (listed or {}).get("items") or () if isinstance(p, Mapping)]
    chosen = log_pods(pods, node_patterns, names.stage_label, stage)
    if not chosen:
        say(f"no pod of package {package} of {names.kind} {owner} in namespace {namespace}")
        return True
    for pod in chosen:
        pod_name = name_of(pod)
        node = (pod.get("spec") or {}).get("nodeName") or "?"
        for container in log_containers(pod):
            state = container_state(pod, container)
            say(f"--- pod {pod_name} on node {node}, container {container} ({state})")
            if state.startswith(("waiting", "unknown")):
                continue
            path = f"/api/v1/namespaces/{ns}/pods/{quote(pod_name, safe='')}/log?" + log_query(
                container, tail, follow
            )
            async for chunk in kube.stream_text(path, follow=follow):
                write(chunk)
    return True
