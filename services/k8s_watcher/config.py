"""Configuration of k8s-watcher (environment variables, see nodeflow_runtime.config)."""

from __future__ import annotations

import msgspec

from k8s_watcher.kinds import resolve_watched_kind, watched_kind_infos
from nodeflow_bus import Backoff
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE
from nodeflow_contracts.topology import WatchedKind
from nodeflow_runtime.config import ServiceConfig


class K8sWatcherConfig(ServiceConfig, kw_only=True):
    # Path of a kubeconfig (env KUBECONFIG). Empty: in-cluster config when running in a pod
    # (KUBERNETES_SERVICE_HOST is set), else the kubeconfig's default location.
    kubeconfig: str = ""
    kube_context: str = ""
    # Namespaces to mirror; empty mirrors all namespaces with one cluster-wide watch per kind.
    watched_namespaces: tuple[str, ...] = ()
    # maintenance-scheduler's SKYHOOK_NAMESPACE: the kinds only the Skyhook controller's
    # objects are wanted of (its ConfigMaps, topology.WatchedKind.skyhook_namespace_only) are
    # mirrored from there alone, whatever WATCHED_NAMESPACES says, so k8s-watcher's RBAC on
    # them is a Role in this namespace.
    skyhook_namespace: str = DEFAULT_SKYHOOK_NAMESPACE
    # Namespaces commands may act in (comma list); empty: all. A command on a namespaced object
    # elsewhere is refused (policy.py), so a service whose NATS password leaked cannot reach
    # beyond the namespaces that hold NodeSets and their workloads; the production RBAC grants
    # pod writes in those namespaces only. Cluster-scoped objects (Nodes) are not affected.
    command_namespaces: tuple[str, ...] = ()
    # Kinds to mirror (e.g. "Node,Pod"); empty mirrors every kind of topology.WATCHED_KINDS.
    watched_kinds: tuple[str, ...] = ()
    # Label selector per kind: LABEL_SELECTORS="Pod=app=gpu;tier!=test,Node=pool=a100".
    # Entries are separated by ',', so requirements inside one selector are joined with ';'.
    label_selectors: dict[str, str] = msgspec.field(default_factory=dict)
    # Client-side rate limit of every API request (token bucket, like client-go's QPS/Burst).
    # client-go's 5/10 is for kubectl. Sized for a 4,000-node cluster: bringing up a NodeSet
    # on every node takes about two requests per pod (node claim, pod create) plus a few per
    # round (status, Events, NodeSlices), ~8,500 requests, which 300/s serves in under 30 s;
    # the burst covers a relist of every kind at start. Still far below what one client may
    # send a kube-apiserver (max-mutating-requests-inflight 200 at a few ms each).
    kube_qps: float = 300.0
    kube_burst: int = 600
    kube_request_timeout_seconds: float = 30.0
    # Longest the API server may go without answering any call before k8s-watcher asks it
    # (GET /version) to keep readiness true: a standby replica (no mirror) makes no call
    # between commands. While it does not answer, asked with backoff up to 5 s.
    kube_probe_interval_seconds: float = 10.0
    list_page_size: int = 500
    # Server-side watch timeout; each watch asks for this plus up to 100% random jitter so the
    # watches of all kinds do not end together (client-go does the same).
    watch_timeout_seconds: float = 300.0
    # Backoff of list/watch after an error (API down, 5xx, 429).
    retry_initial_seconds: float = 0.2
    retry_max_seconds: float = 30.0
    # Commands applied at once per sender (different objects; each sender has its own
    # consumer); one sender's commands for one object are serial.
    command_concurrency: int = 32
    # Delay between attempts of a command that failed for a passing reason (5xx, 429, PDB).
    command_retry_initial_seconds: float = 1.0
    command_retry_max_seconds: float = 30.0
    # Every replica applies commands; one mirrors the cluster into KV, the holder of this lease.
    leader_lease_ttl_seconds: float = 15.0

    def __post_init__(self) -> None:
        super().__post_init__()
        problems: list[str] = []
        if self.kube_qps <= 0:
            problems.append("KUBE_QPS must be > 0")
        if self.kube_burst < 1:
            problems.append("KUBE_BURST must be >= 1")
        if self.kube_probe_interval_seconds <= 0:
            problems.append("KUBE_PROBE_INTERVAL_SECONDS must be > 0")
        if self.command_concurrency < 1:
            problems.append("COMMAND_CONCURRENCY must be >= 1")
        if self.list_page_size < 1:
            problems.append("LIST_PAGE_SIZE must be >= 1")
        if not self.skyhook_namespace:
            problems.append("SKYHOOK_NAMESPACE must name a namespace")
        if self.leader_lease_ttl_seconds <= 0:
            problems.append("LEADER_LEASE_TTL_SECONDS must be > 0")
        try:
            kinds = {info.kind for info in watched_kind_infos(self.watched_kinds)}
        except ValueError as exc:
            problems.append(f"WATCHED_KINDS: {exc}")
            kinds = set()
        unknown = set(self.label_selectors) - kinds
        if kinds and unknown:
            problems.append(f"LABEL_SELECTORS names kinds that are not watched: {sorted(unknown)}")
        try:
            Backoff(initial=self.retry_initial_seconds, maximum=self.retry_max_seconds)
            Backoff(
                initial=self.command_retry_initial_seconds,
                maximum=self.command_retry_max_seconds,
            )
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))

    def label_selector(self, kind: str) -> str:
        """LABEL_SELECTORS' selector of the kind, else the kind's own (topology.WatchedKind:
        only the NodeSets' ControllerRevisions, only the Skyhook controller's ConfigMaps)."""
        watched = resolve_watched_kind(kind)
        default = watched.label_selector if watched is not None else ""
        selector = self.label_selectors.get(kind, default)
        return selector.replace(";", ",")

    def mirrored_namespaces(self, kind: WatchedKind) -> tuple[str, ...]:
        """The namespaces a kind is listed and watched in, one informer each; empty: one
        cluster-wide informer (and always for a cluster-scoped kind)."""
        if not kind.namespaced:
            return ()
        if kind.skyhook_namespace_only:
            return (self.skyhook_namespace,)
        return self.watched_namespaces

    @property
    def list_watch_backoff(self) -> Backoff:
        return Backoff(initial=self.retry_initial_seconds, maximum=self.retry_max_seconds)

    @property
    def command_backoff(self) -> Backoff:
        return Backoff(
            initial=self.command_retry_initial_seconds, maximum=self.command_retry_max_seconds
        )
