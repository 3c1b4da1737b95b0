"""The read-only verbs of upstream's `kubectl skyhook`: `node list`, `node status`,
`package status` and `version`, on a Skyhook's or a NodeWright's own keys.

Each reads the nodes' `nodeState_<name>` annotations (the controller's record of every
package on the node), as upstream's CLI does, and never writes. A node whose annotation is
not a map of package states is skipped with a warning on stderr (upstream skips it silently
unless verbose): the other nodes are still shown.

Pure functions turn the nodes into rows; `render_*` print them as a table (`-o wide` adds a
column), or as JSON with upstream's field names.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from nodeflow_cli.skyhook import (
    KubeApi,
    VerbError,
    annotations_of,
    get_object,
    match_nodes,
    name_of,
    node_state,
    nodes_of,
)
from nodeflow_contracts.skyhook import SkyhookNames

Obj = Mapping[str, Any]
Say = Callable[[str], None]
Output = Literal["table", "wide", "json"]

COMPLETE, ERRORING, IN_PROGRESS, UNKNOWN = "complete", "erroring", "in_progress", "unknown"
# The Deployment whose image is the Skyhook controller's release (`version`).
CONTROLLER_DEPLOYMENT = "maintenance-scheduler"


@dataclass(frozen=True)
class PackageRow:
    name: str
    version: str
    stage: str
    state: str
    restarts: int
    image: str


@dataclass(frozen=True)
class NodeSummary:
    """One object's packages on one node, rolled up as upstream's CLI does."""

    # Named as upstream's JSON fields (`-o json` prints them as they are).
    nodeName: str
    skyhookName: str
    status: str
    packagesComplete: int
    packagesTotal: int
    restarts: int
    packages: tuple[PackageRow, ...]


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def package_rows(entries: Mapping[str, Obj]) -> tuple[PackageRow, ...]:
    rows = [
        PackageRow(
            name=str(entry.get("name") or key.partition("|")[0]),
            version=str(entry.get("version") or key.partition("|")[2]),
            stage=str(entry.get("stage") or ""),
            state=str(entry.get("state") or ""),
            restarts=_int(entry.get("restarts")),
            image=str(entry.get("image") or ""),
        )
        for key, entry in entries.items()
    ]
    return tuple(sorted(rows, key=lambda r: (r.name, r.version)))


def roll_up(rows: Sequence[PackageRow]) -> str:
    """Upstream's node roll-up: erroring if any package errors, complete if every one is,
    in_progress if any is under way or done, else unknown."""
    if any(r.state == ERRORING for r in rows):
        return ERRORING
    complete = sum(1 for r in rows if r.state == COMPLETE)
    if rows and complete == len(rows):
        return COMPLETE
    if complete or any(r.state == IN_PROGRESS for r in rows):
        return IN_PROGRESS
    return UNKNOWN


def summaries(
    nodes: Iterable[Obj], names: SkyhookNames, owner: str | None, warn: Say
) -> list[NodeSummary]:
    """Every (node, object) pair with a node state of this kind, `owner` alone if given;
    sorted by node, then object."""
    prefix = names.node_state_annotation("")
    found: list[NodeSummary] = []
    for node in nodes:
        for key in annotations_of(node):
            if not key.startswith(prefix):
                continue
            skyhook = key[len(prefix) :]
            if owner is not None and skyhook != owner:
                continue
            try:
                state = node_state(node, key)
            except VerbError as exc:
                warn(f"warning: skipping {exc}")
                continue
            if state is None:
                continue
            rows = package_rows(state.entries)
            found.append(
                NodeSummary(
                    nodeName=name_of(node),
                    skyhookName=skyhook,
                    status=roll_up(rows),
                    packagesComplete=sum(1 for r in rows if r.state == COMPLETE),
                    packagesTotal=len(rows),
                    restarts=sum(r.restarts for r in rows),
                    packages=rows,
                )
            )
    return sorted(found, key=lambda s: (s.nodeName, s.skyhookName))


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    cells = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def _shown_status(status: str) -> str:
    # Upstream shouts an erroring node so it stands out in a long table.
    return status.upper() if status == ERRORING else status


def render_node_list(owner: str, found: Sequence[NodeSummary], output: Output) -> list[str]:
    """`node list --skyhook NAME`: one row per node with the object's state."""
    if output == "json":
        nodes = [
            {
                "nodeName": s.nodeName,
                "status": s.status,
                "packagesComplete": s.packagesComplete,
                "packagesTotal": s.packagesTotal,
                "restarts": s.restarts,
            }
            for s in found
        ]
        return [json.dumps({"skyhookName": owner, "nodes": nodes}, indent=2)]
    if not found:
        return [f'No nodes found for Skyhook "{owner}"']
    complete = sum(1 for s in found if s.status == COMPLETE)
    erroring = sum(1 for s in found if s.status == ERRORING)
    header = [
        f"Skyhook: {owner}",
        "",
        f"Summary: {len(found)} nodes ({complete} complete, {erroring} erroring, "
        f"{len(found) - complete - erroring} in progress)",
        "",
    ]
    wide = output == "wide"
    headers = ["NODE", "STATUS", "PACKAGES", *(["RESTARTS"] if wide else [])]
    rows = [
        [
            s.nodeName,
            _shown_status(s.status),
            f"{s.packagesComplete}/{s.packagesTotal}",
            *([str(s.restarts)] if wide else []),
        ]
        for s in found
    ]
    return header + _table(headers, rows)


def render_node_status(found: Sequence[NodeSummary], output: Output) -> list[str]:
    """`node status [NODE...]`: every object's state on each node; `-o wide` lists the
    packages under each."""
    if output == "json":
        return [json.dumps([asdict(s) for s in found], indent=2)]
    if not found:
        return ["No Skyhook activity found on the selected nodes"]
    if output != "wide":
        rows = [
            [
                s.nodeName,
                s.skyhookName,
                _shown_status(s.status),
                f"{s.packagesComplete}/{s.packagesTotal}",
            ]
            for s in found
        ]
        return _table(["NODE", "SKYHOOK", "STATUS", "PACKAGES"], rows)
    rows = [
        [s.nodeName, s.skyhookName, p.name, p.version, p.stage, p.state, str(p.restarts)]
        for s in found
        for p in s.packages
    ]
    return _table(["NODE", "SKYHOOK", "PACKAGE", "VERSION", "STAGE", "STATE", "RESTARTS"], rows)


def render_package_status(
    owner: str, package: str, found: Sequence[NodeSummary], output: Output
) -> list[str]:
    """`package status PACKAGE --skyhook NAME [--node PATTERN]`: the package on each node."""
    rows = [(s.nodeName, p) for s in found for p in s.packages if p.name == package]
    if output == "json":
        return [json.dumps([{"nodeName": node, **asdict(p)} for node, p in rows], indent=2)]
    if not rows:
        return [f'No package status found for skyhook "{owner}"']
    wide = output == "wide"
    headers = ["NODE", "PACKAGE", "VERSION", "STAGE", "STATE", "RESTARTS"]
    headers += ["IMAGE"] if wide else []
    table = [
        [node, p.name, p.version, p.stage, p.state, str(p.restarts), *([p.image] if wide else [])]
        for node, p in rows
    ]
    return _table(headers, table)


def select_nodes(nodes: Sequence[Obj], patterns: Sequence[str]) -> list[Obj]:
    """The nodes whose names match any of `patterns` (exact or anchored regex, as upstream);
    every node without patterns."""
    if not patterns:
        return list(nodes)
    chosen = set(match_nodes(patterns, [name_of(n) for n in nodes]))
    return [n for n in nodes if name_of(n) in chosen]


def plugin_version() -> str:
    try:
        return importlib.metadata.version("nodeflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def controller_version(deployment: Obj | None, namespace: str) -> str:
    """The Skyhook controller's release, read from its Deployment's image (tag or digest)."""
    if deployment is None:
        return f"unknown (no Deployment {CONTROLLER_DEPLOYMENT} in {namespace})"
    spec = deployment.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    containers = pod.get("containers") if isinstance(pod, Mapping) else None
    images = [
        str(c.get("image") or "")
        for c in containers or ()
        if isinstance(c, Mapping) and c.get("name") == CONTROLLER_DEPLOYMENT
    ] or [str(c.get("image") or "") for c in containers or () if isinstance(c, Mapping)]
    image = images[0] if images else ""
    if not image:
        return f"unknown (Deployment {namespace}/{CONTROLLER_DEPLOYMENT} names no image)"
    if "@" in image:
        return image.split("@", 1)[1]
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


# --- the verbs (reads through a KubeApi) ----------------------------------------------------


async def node_list(
    kube: KubeApi, names: SkyhookNames, owner: str, output: Output, say: Say, warn: Say
) -> bool:
    found = summaries(await nodes_of(kube), names, owner, warn)
    for line in render_node_list(owner, found, output):
        say(line)
    return True


async def node_status(
    kube: KubeApi,
    names: SkyhookNames,
    patterns: Sequence[str],
    owner: str | None,
    output: Output,
    say: Say,
    warn: Say,
) -> bool:
    chosen = select_nodes(await nodes_of(kube), patterns)
    if patterns and not chosen:
        say("No nodes matched the specified patterns")
        return True
    for line in render_node_status(summaries(chosen, names, owner, warn), output):
        say(line)
    return True


async def package_status(
    kube: KubeApi,
    names: SkyhookNames,
    package: str,
    owner: str,
    patterns: Sequence[str],
    output: Output,
    say: Say,
    warn: Say,
) -> bool:
    # The object must exist (upstream reads it first): a misspelt name is not "no status".
    await get_object(kube, names, owner)
    chosen = select_nodes(await nodes_of(kube), patterns)
    found = summaries(chosen, names, owner, warn)
    for line in render_package_status(owner, package, found, output):
        say(line)
    return True


async def version(kube: KubeApi | None, namespace: str, say: Say) -> bool:
    """The plugin's version, and (with a cluster) the Skyhook controller's, from the
    image of its Deployment in `namespace`; a cluster that cannot be read says why."""
    say(f"Nodeflow plugin:\t{plugin_version()}")
    if kube is None:
        return True
    try:
        deployment = await kube.get(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{CONTROLLER_DEPLOYMENT}"
        )
    except Exception as exc:  # any failure to read is reported: the plugin's version stands
        say(f"Skyhook controller:\tunknown ({type(exc).__name__}: {exc})")
        return True
    say(f"Skyhook controller:\t{controller_version(deployment, namespace)}")
    return True


# --- the command line -----------------------------------------------------------------------


def _output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")


def add_version_verb(verbs: Any) -> None:
    version = verbs.add_parser(
        "version", help="the plugin's version and the Skyhook controller's (its image)"
    )
    version.add_argument("--client-only", action="store_true", help="do not ask the cluster")
    version.add_argument(
        "-n",
        "--namespace",
        default="nodeflow-system",
        help="where maintenance-scheduler runs (default nodeflow-system)",
    )


def add_package_status_verb(package_actions: Any, kind: str, owner_flags: Sequence[str]) -> None:
    status = package_actions.add_parser(
        "status", help="the package's version, stage and state on each node"
    )
    status.add_argument("package")
    status.add_argument(*owner_flags, dest="owner", required=True, help=f"the {kind}")
    status.add_argument(
        "--node", action="append", default=[], help="a node name or a regular expression"
    )
    _output_option(status)


def add_node_read_verbs(node_actions: Any, kind: str, owner_flags: Sequence[str]) -> None:
    listing = node_actions.add_parser(
        "list", help=f"the nodes with the {kind}'s state, each rolled up"
    )
    listing.add_argument(*owner_flags, dest="owner", required=True, help=f"the {kind}")
    _output_option(listing)
    status = node_actions.add_parser(
        "status", help=f"every {kind} on the nodes named (all nodes without a name)"
    )
    status.add_argument("nodes", nargs="*", metavar="NODE", help="a name or a regex")
    status.add_argument(*owner_flags, dest="owner", default=None, help=f"only this {kind}")
    _output_option(status)


def is_read_only(args: argparse.Namespace) -> bool:
    """One of this module's verbs (the others write, in nodeflow_cli.skyhook)."""
    action = getattr(args, "action", None)
    return (
        args.verb == "version"
        or (args.verb == "package" and action == "status")
        or (args.verb == "node" and action in ("list", "status"))
    )


async def run_read_only(
    kube: KubeApi | None, names: SkyhookNames, args: argparse.Namespace, say: Say, warn: Say
) -> bool:
    """Run the read-only verb `args` names (`kube` None: `version --client-only`)."""
    if args.verb == "version":
        return await version(kube, args.namespace, say)
    assert kube is not None
    if args.verb == "package":
        return await package_status(
            kube, names, args.package, args.owner, args.node, args.output, say, warn
        )
    if args.action == "list":
        return await node_list(kube, names, args.owner, args.output, say, warn)
    return await node_status(kube, names, args.nodes, args.owner, args.output, say, warn)
