"""Who may do what: the one table of each service's NATS permissions and Kubernetes commands.

Two layers, both allow lists:

- `BUS_GRANTS`: what each service's NATS user may publish and subscribe to. The NATS
  server enforces it; `nats_publish_allow`/`nats_subscribe_allow` turn a grant into the
  subjects of its config (the launcher's generated config, k8s/nats/configmap.yaml and
  docker-compose.yml are all rendered from here by `render_accounts`).
- `COMMAND_POLICY`: what each service may ask of the Kubernetes API through k8s-watcher
  (operation, kinds, the fields a patch may touch, a label the object must carry).
  k8s-watcher refuses anything else, so a leaked credential can do no more than its
  service may.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    NODE_CORDON_REASON_ANNOTATION,
    NODESET_LABEL,
    POD_CORDON_ANNOTATION,
    POD_CORDON_SOURCE_ANNOTATION,
    POD_PROTECT_LABEL,
    POD_WAIT_CONDITION,
    SLURM_DELETE_CONDITION,
    SLURM_STATE_CONDITION_PREFIX,
)
from nodeflow_contracts.skyhook import (
    CONFIG_MAP_MANAGED_BY_LABEL,
    FLAVORS,
    NODEWRIGHT,
    NODEWRIGHT_POLICY_MIRROR,
    SKYHOOK,
)
from nodeflow_contracts.topology import ADMIN_USER as ADMIN_USER  # where users look for it
from nodeflow_contracts.topology import (
    APPLIED_COMMANDS_BUCKET,
    CONSUMERS,
    KV_BUCKETS,
    LEASES_BUCKET,
    SLURM_CLUSTERS_BUCKET,
    SLURM_NODES_BUCKET,
    STREAMS,
    WATCHED_KINDS,
    WORKLOAD_POD_GROUP_MIRROR,
)

# The label every Skyhook stage Job carries (its Skyhook's name); a NodeWright's carry theirs.
SKYHOOK_NAME_LABEL = SKYHOOK.name_label
NODEWRIGHT_NAME_LABEL = NODEWRIGHT.name_label


def kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _k8s(*kinds: str) -> tuple[str, ...]:
    return tuple(subjects.k8s_bucket(kind) for kind in kinds)


class BusGrant(msgspec.Struct, frozen=True, kw_only=True):
    """What one service does on the bus; the NATS allow lists are derived from it."""

    # Subjects it publishes (events, decisions, its own command prefix).
    publishes: tuple[str, ...] = ()
    # KV buckets it writes (a put is a publish to `$KV.<bucket>.<key>`), with key filters.
    writes: Mapping[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    # KV buckets and streams it reads (ordered consumers, KV gets, its durable consumers).
    reads_buckets: tuple[str, ...] = ()
    reads_streams: tuple[str, ...] = ()
    # Plain (core NATS) subscriptions.
    subscribes: tuple[str, ...] = ()


ALL_KEYS = (">",)

BUS_GRANTS: dict[str, BusGrant] = {
    "k8s-watcher": BusGrant(
        # Its own commands: only the Lease that mirrors its leadership (kube_lease), sent
        # through its executor like every other service's, so one path writes every Lease.
        publishes=(
            subjects.K8S_EVENTS,
            subjects.K8S_OUTCOMES,
            subjects.k8s_sender_commands("k8s-watcher"),
        ),
        writes={
            **{kind.bucket: ALL_KEYS for kind in WATCHED_KINDS},
            APPLIED_COMMANDS_BUCKET: ALL_KEYS,
            # One replica mirrors the cluster (the others only apply commands).
            LEASES_BUCKET: ("k8s-watcher", "k8s-watcher.>"),
        },
        reads_buckets=(
            *(kind.bucket for kind in WATCHED_KINDS),
            APPLIED_COMMANDS_BUCKET,
            LEASES_BUCKET,
        ),
        reads_streams=("K8S_COMMANDS",),
    ),
    "slurm-syncer": BusGrant(
        publishes=(subjects.SLURM_EVENTS, subjects.k8s_sender_commands("slurm-syncer")),
        writes={
            SLURM_NODES_BUCKET: ALL_KEYS,
            SLURM_CLUSTERS_BUCKET: ALL_KEYS,
            LEASES_BUCKET: ("slurm-syncer", "slurm-syncer.>"),
        },
        reads_buckets=(
            *_k8s("Pod", "Node", "NodeSet"),
            SLURM_NODES_BUCKET,
            SLURM_CLUSTERS_BUCKET,
            LEASES_BUCKET,
        ),
        reads_streams=("SLURM_COMMANDS",),
    ),
    "nodeset-controller": BusGrant(
        publishes=(
            "nodeset.v1.>",
            subjects.k8s_sender_commands("nodeset-controller"),
            subjects.command_ledger("nodeset-controller"),
        ),
        writes={LEASES_BUCKET: ("nodeset-controller", "nodeset-controller.>")},
        reads_buckets=(
            *_k8s(
                "NodeSet", "Node", "Pod", "NodeSlice", "PodDisruptionBudget", "ControllerRevision"
            ),
            SLURM_NODES_BUCKET,
            SLURM_CLUSTERS_BUCKET,
            LEASES_BUCKET,
        ),
        # Its command ledger: records, and the outcomes a new leader reads back.
        reads_streams=("COMMAND_LEDGER", "COMMAND_OUTCOMES"),
        subscribes=(subjects.K8S_OUTCOMES,),
    ),
    "maintenance-scheduler": BusGrant(
        publishes=(
            "maintenance.v1.>",
            subjects.k8s_sender_commands("maintenance-scheduler"),
            subjects.command_ledger("maintenance-scheduler"),
            subjects.command_ledger("maintenance-scheduler-skyhook"),
        ),
        # Two controllers, two leases: NodeMaintenance and Skyhook.
        writes={
            LEASES_BUCKET: (
                "maintenance-scheduler",
                "maintenance-scheduler.>",
                "maintenance-scheduler-skyhook",
            )
        },
        reads_buckets=(
            *_k8s(
                "Node",
                "Pod",
                "Job",
                "PodDisruptionBudget",
                "NodeMaintenance",
                "MaintenanceOperatorConfig",
                "Skyhook",
                "NodeWright",
                "DeploymentPolicy",
                NODEWRIGHT_POLICY_MIRROR,
                "ConfigMap",
            ),
            SLURM_NODES_BUCKET,
            SLURM_CLUSTERS_BUCKET,
            LEASES_BUCKET,
        ),
        # Its command ledger: records, and the outcomes a new leader reads back.
        reads_streams=("COMMAND_LEDGER", "COMMAND_OUTCOMES"),
        subscribes=(subjects.K8S_OUTCOMES,),
    ),
    "topology-placer": BusGrant(
        publishes=(
            "placement.v1.>",
            subjects.k8s_sender_commands("topology-placer"),
            subjects.command_ledger("topology-placer"),
        ),
        writes={LEASES_BUCKET: ("topology-placer", "topology-placer.>")},
        reads_buckets=(
            *_k8s(
                "Node",
                "Pod",
                "PodGroup",
                WORKLOAD_POD_GROUP_MIRROR,
                "ClusterNetworkTopology",
                "PodDisruptionBudget",
                # Volume topology of pods naming a claim (topology_placer.volumes).
                "PersistentVolumeClaim",
                "PersistentVolume",
                "StorageClass",
            ),
            LEASES_BUCKET,
        ),
        # Its command ledger: records, and the outcomes a new leader reads back.
        reads_streams=("COMMAND_LEDGER", "COMMAND_OUTCOMES"),
        subscribes=(subjects.K8S_OUTCOMES,),
    ),
    "metrics-exporter": BusGrant(
        # Pods: the NodeSet pods' names and labels (nodes draining per NodeSet).
        reads_buckets=(*_k8s("NodeSet", "Pod"), SLURM_NODES_BUCKET, SLURM_CLUSTERS_BUCKET),
        reads_streams=("COMMAND_OUTCOMES", "DECISIONS", "SLURM_EVENTS", "DEAD_LETTERS"),
        # K8S_COMMANDS is a work queue: a second consumer would take commands away from
        # k8s-watcher, so commands are counted from a plain subscription.
        subscribes=(subjects.K8S_COMMANDS,),
    ),
}

SERVICES: tuple[str, ...] = tuple(BUS_GRANTS)


def declared_streams() -> tuple[str, ...]:
    """Every stream of the topology table, KV buckets' streams included."""
    return (*(s.name for s in STREAMS), *(kv_stream(b.bucket) for b in KV_BUCKETS))


def _reading(stream: str) -> list[str]:
    """The JetStream API a reader of `stream` calls: consumers (ephemeral, ordered and
    durable: nats-py names them in the subject), pull requests, direct and stream message
    gets (a KV get), acks, and flow control replies of ordered consumers."""
    api = "$JS.API"
    return [
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def nats_publish_allow(service: str) -> list[str]:
    """The subjects `service`'s NATS user may publish to (in a stable order)."""
    grant = BUS_GRANTS[service]
    allowed: list[str] = ["$JS.API.INFO", "$JS.API.STREAM.INFO.*"]
    # Every service declares the topology table on start (nodeflow_runtime.service), so each
    # may create and update the table's streams by name -- and no other stream.
    for stream in declared_streams():
        allowed += [f"$JS.API.STREAM.CREATE.{stream}", f"$JS.API.STREAM.UPDATE.{stream}"]
    streams = [*(kv_stream(b) for b in grant.reads_buckets), *grant.reads_streams]
    for stream in streams:
        allowed += _reading(stream)
    allowed += grant.publishes
    for bucket, keys in grant.writes.items():
        allowed += [subjects.kv_entry(bucket, key) for key in keys]
    for consumer in CONSUMERS.get(service, ()):
        # Its own durable consumers, which it declares on start (nats-py uses this older API
        # for a durable); a message they cannot handle is dead-lettered under `dlq.<subject>`.
        allowed.append(f"$JS.API.CONSUMER.DURABLE.CREATE.{consumer.stream}.{consumer.durable}")
        allowed += [subjects.dead_letter(pattern) for pattern in consumer.filter_subjects]
    return list(dict.fromkeys(allowed))


def inbox_prefix(user: str | None) -> str:
    """The inbox prefix of a client connected as `user`: `_INBOX.<user>`, so that replies and
    JetStream deliveries to one service cannot be read by another (each may subscribe to its
    own inboxes only). Without a user, NATS' default."""
    return f"_INBOX.{subjects.token(user)}" if user else "_INBOX"


def nats_subscribe_allow(service: str) -> list[str]:
    """Replies of requests and JetStream deliveries arrive on its own inboxes; nothing else
    but the grant's plain subscriptions."""
    return [f"{inbox_prefix(service)}.>", *BUS_GRANTS[service].subscribes]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_accounts(password_of: Callable[[str], str], *, indent: int = 0) -> str:
    """The `accounts { NODEFLOW { ... } }` block of a nats-server config: one user per
    service with its allow lists, and the admin user. `password_of(user)` is the text after
    `password:` (a quoted secret, or `$VARIABLE` that the server reads from its environment).
    """
    lines = [
        "accounts {",
        "  NODEFLOW {",
        "    jetstream: enabled",
        "    users: [",
    ]
    for service in SERVICES:
        lines += [
            "      {",
            f"        user: {service}",
            f"        password: {password_of(service)}",
            "        permissions: {",
            "          publish: {",
            "            allow: [",
            *(f"              {_quote(s)}" for s in nats_publish_allow(service)),
            "            ]",
            "          }",
            "          subscribe: {",
            "            allow: [",
            *(f"              {_quote(s)}" for s in nats_subscribe_allow(service)),
            "            ]",
            "          }",
            "        }",
            "      }",
        ]
    lines += [
        "      {",
        f"        user: {ADMIN_USER}",
        f"        password: {password_of(ADMIN_USER)}",
        "      }",
        "    ]",
        "  }",
        "}",
    ]
    pad = " " * indent
    return "".join(f"{pad}{line}\n" for line in lines)


def password_variable(user: str) -> str:
    """`$NATS_PASSWORD_K8S_WATCHER`: where a deployed nats-server reads a user's password."""
    return "$NATS_PASSWORD_" + user.upper().replace("-", "_")


# --- Kubernetes commands -------------------------------------------------------------------

PatchPart = Literal["", "status"]


class CommandGrant(msgspec.Struct, frozen=True, kw_only=True):
    """One thing a service may ask k8s-watcher to do.

    `fields` (patches only) lists what the patch may touch, as paths: `spec.nodes`,
    `metadata.annotations[<key>]`, `status.conditions[<type>]`; `*` matches within a path
    element (`status.conditions[SlurmNodeState*]`), and a path covers what lies beneath it.
    `required_label`: the object made, or the object acted on, must carry this label.
    `forbidden_label`: the object made, or the object acted on, must not carry it.
    `names`: when set, the object made or acted on must bear one of these names.
    `protection_budget`: the object made must be a NodeSet's protection PodDisruptionBudget
    (`pod_protocol.protection_budget_problem`): a budget of another shape would let a buggy
    sender block every drain of a namespace.
    """

    op: str
    kinds: frozenset[str]
    subresource: PatchPart = ""
    fields: tuple[str, ...] = ()
    required_label: str | None = None
    forbidden_label: str | None = None
    names: tuple[str, ...] = ()
    protection_budget: bool = False


def _grant(op: str, *kinds: str, **settings: Any) -> CommandGrant:
    return CommandGrant(op=op, kinds=frozenset(kinds), **settings)


_ANY_OP = (
    "create",
    "delete",
    "patch",
    "cordon",
    "uncordon",
    "evict",
    "bind",
    "nominate",
    "update-status",
    "record-event",
)
_ALL_KINDS = frozenset({*(kind.kind for kind in WATCHED_KINDS), "Event"})


def lease_names(service: str) -> tuple[str, ...]:
    """The leader leases `service` holds: the keys it may write in the leases bucket."""
    keys = BUS_GRANTS[service].writes.get(LEASES_BUCKET, ())
    return tuple(key for key in keys if not key.endswith(">"))


def _lease_mirror(service: str) -> tuple[CommandGrant, ...]:
    """Each leader mirrors its NATS lease into a Kubernetes Lease of the same name
    (nodeflow_bus.kube_lease): it may create and patch the spec of those Leases, no other."""
    names = lease_names(service)
    return (
        _grant("create", "Lease", names=names),
        _grant("patch", "Lease", fields=("spec",), names=names),
    )


COMMAND_POLICY: dict[str, tuple[CommandGrant, ...]] = {
    "k8s-watcher": _lease_mirror("k8s-watcher"),
    "slurm-syncer": (
        *_lease_mirror("slurm-syncer"),
        # Slurm's view of the node on the pod, and the pod following its node's cordon.
        _grant(
            "patch",
            "Pod",
            subresource="status",
            fields=(f"status.conditions[{SLURM_STATE_CONDITION_PREFIX}*]",),
        ),
        _grant(
            "patch",
            "Pod",
            fields=(
                f"metadata.annotations[{POD_CORDON_ANNOTATION}]",
                f"metadata.annotations[{POD_CORDON_SOURCE_ANNOTATION}]",
            ),
        ),
        _grant("record-event", "Pod", "Node"),
    ),
    "nodeset-controller": (
        *_lease_mirror("nodeset-controller"),
        _grant("create", "Pod", required_label=NODESET_LABEL),
        _grant("delete", "Pod", required_label=NODESET_LABEL),
        _grant(
            "patch",
            "Pod",
            subresource="status",
            fields=(
                f"status.conditions[{SLURM_DELETE_CONDITION}]",
                f"status.conditions[{POD_WAIT_CONDITION}]",
            ),
        ),
        _grant("patch", "Node", fields=(f"metadata.annotations[{CLAIM_ANNOTATION}]",)),
        _grant("create", "NodeSlice"),
        _grant("patch", "NodeSlice", fields=("spec.nodes",)),
        _grant("update-status", "NodeSet"),
        _grant("record-event", "NodeSet", "Pod", "Node"),
        # workloadDisruptionProtection: the protect label on its pods, and the NodeSet's
        # PodDisruptionBudget (labelled with its NodeSet) over them, of that shape alone.
        _grant(
            "patch",
            "Pod",
            fields=(f"metadata.labels[{POD_PROTECT_LABEL}]",),
            required_label=NODESET_LABEL,
        ),
        _grant(
            "create",
            "PodDisruptionBudget",
            required_label=NODESET_LABEL,
            protection_budget=True,
        ),
        _grant("delete", "PodDisruptionBudget", required_label=NODESET_LABEL),
        # Revision history: its NodeSets' ControllerRevisions (labelled with their NodeSet),
        # made, and deleted beyond revisionHistoryLimit or to be made again on a rollback.
        _grant("create", "ControllerRevision", required_label=NODESET_LABEL),
        _grant("delete", "ControllerRevision", required_label=NODESET_LABEL),
    ),
    # NodeMaintenance (issue #14): cordon and drain a node, evict its pods, report status.
    "maintenance-scheduler": (
        *_lease_mirror("maintenance-scheduler"),
        _grant("cordon", "Node"),
        _grant("uncordon", "Node"),
        _grant("patch", "Node", fields=(f"metadata.annotations[{NODE_CORDON_REASON_ANNOTATION}]",)),
        _grant("evict", "Pod"),
        # Its finalizer and the progress it keeps on the request (so a restart resumes).
        _grant(
            "patch",
            "NodeMaintenance",
            fields=(
                "metadata.finalizers",
                "metadata.ownerReferences",
                "metadata.annotations[maintenance.nvidia.com/node-initial-state.unschedulable]",
                "metadata.annotations[maintenance.nvidia.com/ready-time]",
                "metadata.annotations[maintenance.nvidia.com/wait-pod-completion-start-time]",
                "metadata.annotations[nodeflow.dev/drain-spec-hash]",
                "metadata.annotations[nodeflow.dev/drain-start-time]",
            ),
        ),
        _grant("update-status", "NodeMaintenance"),
        # Garbage collection of requests Ready for longer than maxNodeMaintenanceTimeSeconds,
        # and the Skyhook controller's own requests once their interrupts are done.
        _grant("delete", "NodeMaintenance"),
        # The MaintenanceOperatorConfig's: a maxParallelOperations read otherwise upstream.
        _grant("record-event", "NodeMaintenance", "Node", "Pod", "MaintenanceOperatorConfig"),
        # Skyhook: a Job per package stage and node (labelled with its Skyhook), failing one
        # stuck pulling its image and keeping a failed one with its logs; a NodeMaintenance
        # before an interrupt; the per-node state; the Skyhook's status; the policy in use.
        # A NodeWright's the same, with its own keys (nodeflow_contracts.skyhook).
        *(_grant("create", "Job", required_label=names.name_label) for names in FLAVORS),
        # The ConfigMaps a package pod mounts (node metadata, the package's configMap), only
        # those labelled with a Skyhook (or NodeWright); their data rewritten when it changed.
        *(_grant("create", "ConfigMap", required_label=names.name_label) for names in FLAVORS),
        # Its own no longer wanted (an older version's, a node's no longer targeted).
        *(_grant("delete", "ConfigMap", required_label=names.name_label) for names in FLAVORS),
        # (The patch tests the ConfigMap's own label, so it fits its own kind's grant only.)
        *(
            _grant(
                "patch",
                "ConfigMap",
                fields=(
                    "data",
                    f"metadata.labels[{names.name_label}]",
                    f"metadata.labels[{CONFIG_MAP_MANAGED_BY_LABEL}]",
                ),
                required_label=names.name_label,
            )
            for names in FLAVORS
        ),
        _grant(
            "patch", "Job", fields=("spec.activeDeadlineSeconds", "spec.ttlSecondsAfterFinished")
        ),
        _grant("create", "NodeMaintenance"),
        _grant(
            "patch",
            "Node",
            fields=(
                *(
                    field
                    for names in FLAVORS
                    for field in (
                        f"metadata.annotations[{names.node_state_annotation('*')}]",
                        f"metadata.annotations[{names.status_key('*')}]",
                        f"metadata.labels[{names.status_key('*')}]",
                        f"metadata.annotations[{names.version_annotation('*')}]",
                        f"metadata.annotations[{names.cordon_annotation('*')}]",
                        # runtimeRequired: the mark of an auto-taint.
                        f"metadata.annotations[{names.auto_taint_annotation('*')}]",
                        # runtimeRequiredCordonAfter: the persistent cordon's mark.
                        f"metadata.annotations[{names.runtime_required_cordon_annotation}]",
                    )
                ),
                # runtimeRequired: the runtime-required taints.
                "spec.taints",
            ),
        ),
        # The Skyhook's node conditions (upstream `UpdateCondition`), by type; never the
        # kubelet's (Ready, MemoryPressure, ...).
        _grant(
            "patch",
            "Node",
            subresource="status",
            fields=tuple(
                f"status.conditions[{condition}]"
                for names in FLAVORS
                for condition in (
                    names.not_ready_condition("*"),
                    names.erroring_condition("*"),
                )
            ),
        ),
        _grant("update-status", "Skyhook", "NodeWright"),
        # Its own finalizer: a deleted Skyhook first removes its marks from the nodes.
        _grant(
            "patch", "Skyhook", "NodeWright", "DeploymentPolicy", fields=("metadata.finalizers",)
        ),
    ),
    # Gang and topology placement (issue #16): bind, nominate, preempt, report status.
    "topology-placer": (
        *_lease_mirror("topology-placer"),
        _grant("bind", "Pod"),
        _grant("nominate", "Pod"),
        # Preemption victims and broken gangs are deleted, as kube-scheduler deletes victims;
        # never a NodeSet pod: the Slurm jobs on it are drained by the NodeSet protocol only.
        _grant("delete", "Pod", forbidden_label=NODESET_LABEL),
        # Why a gang waits (PodScheduled=False) and why a pod goes (DisruptionTarget).
        _grant(
            "patch",
            "Pod",
            subresource="status",
            fields=("status.conditions[PodScheduled]", "status.conditions[DisruptionTarget]"),
        ),
        _grant("update-status", "PodGroup", "ClusterNetworkTopology"),
        _grant("record-event", "PodGroup", "Pod"),
        # The node a WaitForFirstConsumer claim's volume is made for, before its pod's bind.
        _grant(
            "patch",
            "PersistentVolumeClaim",
            fields=("metadata.annotations[volume.kubernetes.io/selected-node]",),
        ),
    ),
    "metrics-exporter": (),
    ADMIN_USER: (
        *(_grant(op, *_ALL_KINDS, fields=("*",)) for op in _ANY_OP),
        _grant("patch", *_ALL_KINDS, subresource="status", fields=("*",)),
    ),
}


def touched_fields(patch_type: str, patch: Any) -> list[str] | None:
    """The paths a patch touches, in the form of `CommandGrant.fields`; None when the patch
    is not of a shape that can be judged (such a patch is refused)."""
    if patch_type == "json":
        if not isinstance(patch, list):
            return None
        paths: list[str] = []
        for operation in patch:
            if not isinstance(operation, dict) or not isinstance(operation.get("path"), str):
                return None
            parts = [
                p.replace("~1", "/").replace("~0", "~") for p in operation["path"][1:].split("/")
            ]
            if operation.get("op") in ("move", "copy"):
                return None  # reads another path: judged by neither
            paths.append(_path_of(parts))
        return paths
    if not isinstance(patch, dict):
        return None
    found: list[str] = []
    _walk(patch, [], found)
    return found


def _path_of(parts: list[str]) -> str:
    if len(parts) >= 3 and parts[0] == "metadata" and parts[1] in ("annotations", "labels"):
        return f"metadata.{parts[1]}[{parts[2]}]"
    return ".".join(parts)


def _walk(value: Any, path: list[str], found: list[str]) -> None:
    if path == ["status", "conditions"] and isinstance(value, list):
        for entry in value:
            kind = entry.get("type") if isinstance(entry, dict) else None
            found.append(f"status.conditions[{kind if isinstance(kind, str) else '?'}]")
        return
    if path in (["metadata", "annotations"], ["metadata", "labels"]) and isinstance(value, dict):
        found.extend(f"metadata.{path[1]}[{key}]" for key in value)
        return
    if isinstance(value, dict):
        # An empty object merges into nothing: it touches no field.
        for key, inner in value.items():
            if not isinstance(key, str) or key.startswith("$"):
                # Strategic-merge directives ($patch, $retainKeys, ...) act on the path itself.
                found.append(".".join(path) or "*")
                continue
            _walk(inner, [*path, key], found)
        return
    found.append(".".join(path))


def field_allowed(path: str, allowed: Iterable[str]) -> bool:
    """Whether `path` is one of the `allowed` patterns or lies beneath one. Only `*` is a
    wildcard (brackets are literal: they enclose annotation keys and condition types)."""
    for pattern in allowed:
        wildcard = re.escape(pattern).replace(r"\*", ".*")
        if re.fullmatch(wildcard, path) or re.match(wildcard + r"\.", path):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """`python -m nodeflow_contracts.permissions`: print the accounts block of a deployed
    nats-server (passwords from `$NATS_PASSWORD_<USER>`), to paste into k8s/nats/configmap.yaml
    (indent 4) and docker-compose.yml (indent 8, `$` doubled)."""
    args = sys.argv[1:] if argv is None else argv
    indent = int(args[0]) if args else 0
    sys.stdout.write(render_accounts(password_variable, indent=indent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
