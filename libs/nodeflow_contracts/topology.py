"""The one declarative table of JetStream streams, KV buckets and durable consumers.

Every service applies this table on start (libs/bus `ensure_topology`), so a changed setting is
updated in place and nothing is declared twice. Subjects come from `subjects`; nothing here
formats a subject by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_contracts.skyhook import CONFIG_MAP_SELECTOR, NODEWRIGHT_POLICY_MIRROR

DAY = 24 * 3600.0

# How long a delivered command waits for its ack before JetStream hands it to another replica.
# Short, so that the commands a crashed executor held are redelivered within seconds; a live
# executor keeps each held command's deadline alive (PullConsumer sends in-progress every
# third of it), however long its API call takes.
COMMAND_ACK_WAIT_SECONDS = 5.0

# Operators' tools and tests: every subject (the JetStream API included), and every command
# (sent as this sender). Never given to a service.
ADMIN_USER = "nodeflow-admin"

# Who sends Kubernetes commands (each under `cmd.k8s.v1.<sender>.>`, the only command prefix
# its NATS user may publish to). k8s-watcher takes each sender's commands from a queue of its
# own (K8S_COMMANDS_CONSUMERS), so one sender's backlog never holds back another's: during a
# scale-out of thousands of pods, nodeset-controller's creates must not delay slurm-syncer's
# condition patches past their deadline. K8S_COMMANDS stores these prefixes only, so a command
# under any other is refused at publish (no stream stores it) instead of waiting unanswered.
K8S_COMMAND_SENDERS: tuple[str, ...] = (
    "nodeset-controller",
    "slurm-syncer",
    "maintenance-scheduler",
    "topology-placer",
    # Its own commands: only the Lease that mirrors its leadership (nodeflow_bus.kube_lease).
    "k8s-watcher",
    ADMIN_USER,
)


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    subjects: tuple[str, ...]
    description: str
    retention: Literal["limits", "workqueue", "interest"] = "limits"
    max_age_seconds: float = DAY
    max_bytes: int = -1
    max_msgs_per_subject: int = -1
    duplicate_window_seconds: float = 120.0
    replicas: int = 1


class KVSpec(msgspec.Struct, frozen=True, kw_only=True):
    bucket: str
    description: str
    history: int = 1
    # Per-key age limit; 0 keeps keys until deleted.
    ttl_seconds: float = 0.0
    replicas: int = 1


class ConsumerSpec(msgspec.Struct, frozen=True, kw_only=True):
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    description: str
    ack_wait_seconds: float = 30.0
    max_deliver: int = 5
    max_ack_pending: int = 1000
    deliver_policy: Literal["all", "new"] = "all"


# The API groups Kubernetes itself serves among those of the watched kinds; every other
# group's kind is served only once its CustomResourceDefinition is installed.
KUBERNETES_GROUPS = frozenset(
    {"", "apps", "batch", "policy", "storage.k8s.io", "scheduling.k8s.io"}
)
# The name the bus knows scheduling.k8s.io's PodGroup by (the Workload API's, KEP-4671), beside
# scheduler-plugins' PodGroup the gangs use.
WORKLOAD_POD_GROUP_MIRROR = "WorkloadPodGroup"
# Our own CRDs' group: installed with Nodeflow, never optional.
NODEFLOW_GROUP = "nodeflow.dev"


class WatchedKind(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool
    # The name the bus knows the kind by (its KV bucket), where two groups serve one kind
    # name; empty: the kind.
    mirror_as: str = ""
    # The objects of the kind k8s-watcher mirrors (a label selector, passed to list and
    # watch); empty: all of them. LABEL_SELECTORS of k8s-watcher overrides it.
    label_selector: str = ""
    # Mirrored from the Skyhook namespace only (k8s-watcher's SKYHOOK_NAMESPACE, the same
    # setting maintenance-scheduler writes there by), so k8s-watcher's RBAC on the kind is a
    # Role in that namespace, never cluster-wide.
    skyhook_namespace_only: bool = False
    # Only read: k8s-watcher mirrors it and refuses any command on it, and its RBAC on the
    # kind is list and watch (a kind name another group also serves, writable there).
    read_only: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def bucket(self) -> str:
        return subjects.k8s_bucket(self.mirror_as or self.kind)

    @property
    def served_by_crd(self) -> bool:
        """A custom resource: the API server serves it only while its CRD is installed."""
        return self.group not in KUBERNETES_GROUPS

    @property
    def optional(self) -> bool:
        """Another project's custom resource (NVIDIA's, Koordinator's, scheduler-plugins'):
        a cluster may not have its CRD, and then has none of its objects. So is a Kubernetes
        API still in alpha: served only where the cluster enables it (`--runtime-config`)."""
        if not self.served_by_crd:
            return "alpha" in self.version
        return self.group != NODEFLOW_GROUP


WATCHED_KINDS: tuple[WatchedKind, ...] = (
    WatchedKind(kind="Node", group="", version="v1", plural="nodes", namespaced=False),
    WatchedKind(kind="Pod", group="", version="v1", plural="pods", namespaced=True),
    WatchedKind(kind="Job", group="batch", version="v1", plural="jobs", namespaced=True),
    WatchedKind(
        kind="PodDisruptionBudget",
        group="policy",
        version="v1",
        plural="poddisruptionbudgets",
        namespaced=True,
    ),
    # The volume topology of pods naming a claim (topology-placer): a bound claim's volume
    # and that volume's node affinity.
    WatchedKind(
        kind="PersistentVolumeClaim",
        group="",
        version="v1",
        plural="persistentvolumeclaims",
        namespaced=True,
    ),
    WatchedKind(
        kind="PersistentVolume",
        group="",
        version="v1",
        plural="persistentvolumes",
        namespaced=False,
    ),
    # The binding mode and allowed topologies of an unbound claim's class (topology-placer).
    WatchedKind(
        kind="StorageClass",
        group="storage.k8s.io",
        version="v1",
        plural="storageclasses",
        namespaced=False,
    ),
    # Only the ConfigMaps the Skyhook controller writes (its package configMaps and node
    # metadata, both flavors), in its namespace: it deletes those no longer wanted
    # (skyhook/configmaps.py). A cluster-wide grant on ConfigMaps would reach every
    # namespace's (kube-system's aws-auth among them).
    WatchedKind(
        kind="ConfigMap",
        group="",
        version="v1",
        plural="configmaps",
        namespaced=True,
        label_selector=CONFIG_MAP_SELECTOR,
        skyhook_namespace_only=True,
    ),
    WatchedKind(
        kind="NodeSet", group=NODEFLOW_GROUP, version="v1alpha1", plural="nodesets", namespaced=True
    ),
    # A NodeSet's revision history (nodeset-controller); k8s-watcher mirrors only those
    # labelled with a NodeSet: ControllerRevisions hold every DaemonSet's and StatefulSet's
    # history too.
    WatchedKind(
        kind="ControllerRevision",
        group="apps",
        version="v1",
        plural="controllerrevisions",
        namespaced=True,
        label_selector=NODESET_LABEL,
    ),
    WatchedKind(
        kind="NodeSlice",
        group=NODEFLOW_GROUP,
        version="v1alpha1",
        plural="nodeslices",
        namespaced=True,
    ),
    WatchedKind(
        kind="NodeMaintenance",
        group="maintenance.nvidia.com",
        version="v1alpha1",
        plural="nodemaintenances",
        namespaced=True,
    ),
    WatchedKind(
        kind="MaintenanceOperatorConfig",
        group="maintenance.nvidia.com",
        version="v1alpha1",
        plural="maintenanceoperatorconfigs",
        namespaced=True,
    ),
    WatchedKind(
        kind="Skyhook",
        group="skyhook.nvidia.com",
        version="v1alpha1",
        plural="skyhooks",
        namespaced=False,
    ),
    # Skyhook's renamed release (nodeflow_contracts.skyhook): the same controller reconciles it.
    WatchedKind(
        kind="NodeWright",
        group="nodewright.nvidia.com",
        version="v1alpha1",
        plural="nodewrights",
        namespaced=False,
    ),
    WatchedKind(
        kind="DeploymentPolicy",
        group="skyhook.nvidia.com",
        version="v1alpha1",
        plural="deploymentpolicies",
        namespaced=False,
    ),
    # A NodeWright's DeploymentPolicy: the same kind in the renamed group, its own bucket.
    WatchedKind(
        kind="DeploymentPolicy",
        group="nodewright.nvidia.com",
        version="v1alpha1",
        plural="deploymentpolicies",
        namespaced=False,
        mirror_as=NODEWRIGHT_POLICY_MIRROR,
    ),
    WatchedKind(
        kind="PodGroup",
        group="scheduling.sigs.k8s.io",
        version="v1alpha1",
        plural="podgroups",
        namespaced=True,
    ),
    # The Workload API's PodGroup (scheduling.k8s.io/v1alpha2, Kubernetes 1.36 behind the
    # GenericWorkload gate): topology-placer reads its disruptionMode, which says whether a
    # preemption evicts the pods of such a group one by one or all together.
    WatchedKind(
        kind="PodGroup",
        group="scheduling.k8s.io",
        version="v1alpha2",
        plural="podgroups",
        namespaced=True,
        mirror_as=WORKLOAD_POD_GROUP_MIRROR,
        read_only=True,
    ),
    WatchedKind(
        kind="ClusterNetworkTopology",
        group="scheduling.koordinator.sh",
        version="v1alpha1",
        plural="clusternetworktopologies",
        namespaced=False,
    ),
)

# How long COMMAND_LEDGER keeps a record: a ledger refuses a command whose lifetime plus
# landing margin is not well inside it (nodeflow_bus.ledger.LedgerSender).
COMMAND_LEDGER_MAX_AGE_SECONDS = 3600.0

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        name="K8S_EVENTS",
        subjects=(subjects.K8S_EVENTS,),
        description="Every change of a watched Kubernetes object (k8s-watcher).",
        max_age_seconds=DAY,
        max_bytes=8 * 1024**3,
    ),
    StreamSpec(
        name="K8S_COMMANDS",
        subjects=tuple(subjects.k8s_sender_commands(sender) for sender in K8S_COMMAND_SENDERS),
        description="Commands for the Kubernetes API, applied by k8s-watcher (work queue).",
        retention="workqueue",
        max_age_seconds=DAY,
    ),
    StreamSpec(
        name="COMMAND_OUTCOMES",
        subjects=(subjects.K8S_OUTCOMES,),
        description="The outcome of every Kubernetes command.",
        max_age_seconds=DAY,
    ),
    StreamSpec(
        name="COMMAND_LEDGER",
        subjects=(subjects.COMMAND_LEDGER,),
        description=(
            "What each controller's Kubernetes commands hold until they can no longer land "
            "(nodeflow_contracts.ledger): read back by a new leader before it plans."
        ),
        # Far longer than any command may land (its lifetime plus the landing margin).
        max_age_seconds=COMMAND_LEDGER_MAX_AGE_SECONDS,
    ),
    StreamSpec(
        name="SLURM_EVENTS",
        subjects=(subjects.SLURM_EVENTS,),
        description="Slurm node changes and poll results (slurm-syncer).",
        max_age_seconds=DAY,
    ),
    StreamSpec(
        name="SLURM_COMMANDS",
        subjects=(subjects.SLURM_COMMANDS,),
        description="Commands for Slurm, applied by slurm-syncer (work queue).",
        retention="workqueue",
        max_age_seconds=DAY,
    ),
    StreamSpec(
        name="DECISIONS",
        subjects=subjects.DECISIONS,
        description="Explained decisions of the controllers, for audit.",
        max_age_seconds=7 * DAY,
    ),
    StreamSpec(
        name="DEAD_LETTERS",
        subjects=(subjects.DEAD_LETTERS,),
        description="Messages that could not be handled, with the error, for inspection.",
        max_age_seconds=14 * DAY,
    ),
)

LEASES_BUCKET = "leases"
SLURM_NODES_BUCKET = "slurm_nodes"
SLURM_CLUSTERS_BUCKET = "slurm_clusters"
APPLIED_COMMANDS_BUCKET = "k8s_applied_commands"

KV_BUCKETS: tuple[KVSpec, ...] = (
    *(
        KVSpec(bucket=kind.bucket, description=f"Latest {kind.kind} objects, by namespace.name")
        for kind in WATCHED_KINDS
    ),
    KVSpec(bucket=SLURM_NODES_BUCKET, description="Latest Slurm node state, by cluster.node"),
    KVSpec(
        bucket=SLURM_CLUSTERS_BUCKET,
        description="Freshness of slurm-syncer's view of each Slurm cluster, by cluster",
    ),
    KVSpec(
        bucket=APPLIED_COMMANDS_BUCKET,
        description="Idempotency keys of applied Kubernetes commands (k8s-watcher)",
        # Longer than the command stream keeps a command, so no redelivery outlives its key.
        ttl_seconds=2 * DAY,
    ),
    KVSpec(
        bucket=LEASES_BUCKET,
        description="Leader leases: one active replica per controller",
        history=1,
    ),
)


# The single consumer of every command that earlier versions had. The admin's queue keeps its
# name, so an upgrade narrows that consumer to the admin's prefix in place (its filter is
# editable) before the other senders' consumers are made. Deleting it instead would not do:
# an old replica still fetching from it recreates a deleted durable with its old filter, and a
# work-queue stream refuses consumers whose filters overlap, so the new ones could not be made.
LEGACY_K8S_COMMANDS_DURABLE = "k8s-watcher-commands"


def k8s_commands_durable(sender: str) -> str:
    """k8s-watcher's durable consumer of `sender`'s Kubernetes commands."""
    if sender == ADMIN_USER:
        return LEGACY_K8S_COMMANDS_DURABLE
    return f"{LEGACY_K8S_COMMANDS_DURABLE}-{sender}"


# One per sender, so that each sender's commands wait only behind its own; the admin's first,
# since it is the one an upgrade narrows before the others can exist (see above).
K8S_COMMANDS_CONSUMERS: tuple[ConsumerSpec, ...] = tuple(
    ConsumerSpec(
        stream="K8S_COMMANDS",
        durable=k8s_commands_durable(sender),
        filter_subjects=(subjects.k8s_sender_commands(sender),),
        description=f"Applies the Kubernetes commands of {sender}.",
        ack_wait_seconds=COMMAND_ACK_WAIT_SECONDS,
        max_deliver=8,
    )
    for sender in sorted(K8S_COMMAND_SENDERS, key=lambda sender: sender != ADMIN_USER)
)

# Durable consumers, by the service that owns them.
CONSUMERS: dict[str, tuple[ConsumerSpec, ...]] = {
    "k8s-watcher": K8S_COMMANDS_CONSUMERS,
    "slurm-syncer": (
        ConsumerSpec(
            stream="SLURM_COMMANDS",
            durable="slurm-syncer-commands",
            filter_subjects=(subjects.SLURM_COMMANDS,),
            description="Applies Slurm node commands.",
            ack_wait_seconds=COMMAND_ACK_WAIT_SECONDS,
            max_deliver=8,
        ),
    ),
    "nodeset-controller": (),
    "maintenance-scheduler": (),
    "topology-placer": (),
    "metrics-exporter": (
        ConsumerSpec(
            stream="COMMAND_OUTCOMES",
            durable="metrics-exporter-outcomes",
            filter_subjects=(subjects.K8S_OUTCOMES,),
            description="Counts command outcomes and latency.",
            deliver_policy="new",
        ),
        ConsumerSpec(
            stream="DECISIONS",
            durable="metrics-exporter-decisions",
            filter_subjects=subjects.DECISIONS,
            description="Counts controller decisions.",
            deliver_policy="new",
        ),
        ConsumerSpec(
            stream="SLURM_EVENTS",
            durable="metrics-exporter-slurm-polls",
            filter_subjects=(subjects.SLURM_POLLS,),
            description="Tracks the age of the last successful poll per Slurm cluster.",
            deliver_policy="new",
        ),
        ConsumerSpec(
            stream="DEAD_LETTERS",
            durable="metrics-exporter-dead-letters",
            filter_subjects=(subjects.DEAD_LETTERS,),
            description="Counts dead-lettered messages.",
            deliver_policy="new",
        ),
    ),
}

SERVICES: tuple[str, ...] = tuple(CONSUMERS)


Replicable = TypeVar("Replicable", StreamSpec, KVSpec)


def replicated(specs: Iterable[Replicable], replicas: int) -> tuple[Replicable, ...]:
    """`specs` stored on `replicas` servers each (1 for a single server; 3 for a cluster, which
    keeps every stream and bucket through the loss of any one server)."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    return tuple(msgspec.structs.replace(spec, replicas=replicas) for spec in specs)


def stream_for_subject(subject: str) -> StreamSpec:
    """The stream that stores `subject` (every published subject has exactly one)."""
    for stream in STREAMS:
        if any(subject_matches(pattern, subject) for pattern in stream.subjects):
            return stream
    raise LookupError(f"no stream stores subject {subject!r}")


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: '*' is one token, a trailing '>' one or more."""
    pattern_tokens = pattern.split(".")
    subject_tokens = subject.split(".")
    for index, part in enumerate(pattern_tokens):
        if part == ">":
            return len(subject_tokens) > index
        if index >= len(subject_tokens):
            return False
        if part != "*" and part != subject_tokens[index]:
            return False
    return len(pattern_tokens) == len(subject_tokens)
