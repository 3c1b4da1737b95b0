"""Pure: `kubectl nodeflow doctor` -- what was fetched in, one line per check out.

Each check reads what `nodeflow_cli.main` fetched from the API server and NATS (None where a
source was not read: the API does not serve that resource, or NATS was not given) and says
OK, WARN, FAIL or SKIP with the detail an on-call engineer acts on. What a check expects is
derived from the contracts the services themselves run on (the watched kinds, the command
grants, the NATS users, the lease names, the topology-placer's scheduler names), not from a
second list kept here. Nothing here reads a clock or a socket.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import BUS_GRANTS, COMMAND_POLICY, SERVICES, lease_names
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import ADMIN_USER, WATCHED_KINDS, WatchedKind
from topology_placer.config import TopologyPlacerConfig

Obj = Mapping[str, Any]
Status = Literal["OK", "WARN", "FAIL", "SKIP"]

# The scheduler name the issue asks about: Koordinator's, which topology-placer also serves.
KOORD_SCHEDULER = "koord-scheduler"
PLACER = "topology-placer"
MIRROR = "k8s-watcher"
# API groups of Kubernetes itself: their kinds come with the API server, not with a CRD.
MAX_NAMED = 5


@dataclass(frozen=True)
class Check:
    status: Status
    name: str
    detail: str


def format_checks(checks: Iterable[Check]) -> list[str]:
    return [f"{c.status:<4}  {c.name}  {c.detail}" for c in checks]


def failed(checks: Iterable[Check]) -> bool:
    return any(c.status == "FAIL" for c in checks)


def _names(items: Iterable[str]) -> str:
    listed = sorted(items)
    more = f" and {len(listed) - MAX_NAMED} more" if len(listed) > MAX_NAMED else ""
    return ", ".join(listed[:MAX_NAMED]) + more


def _meta(obj: Obj) -> Obj:
    found: Obj = obj.get("metadata") or {}
    return found


def _name(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")


def parse_time(value: Any) -> float | None:
    """An RFC 3339 time of the API (`renewTime`: microseconds) as a timestamp."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def _ago(seconds: float) -> str:
    return f"{max(seconds, 0.0):.0f}s ago"


# --- Secrets --------------------------------------------------------------------------------


def nats_user_secret(user: str) -> str:
    """The Secret holding a NATS user's credentials (k8s/services, the chart's default)."""
    return f"nodeflow-{user.removeprefix('nodeflow-')}-nats"


def default_secrets() -> dict[str, set[str]]:
    """Without Deployments to read: the NATS credentials of every service and the
    operators' user, each with its `user` and `password` keys."""
    users = (*SERVICES, ADMIN_USER)
    return {nats_user_secret(user): {"user", "password"} for user in users}


def _pod_spec(workload: Obj) -> Obj:
    template: Obj = (workload.get("spec") or {}).get("template") or {}
    found: Obj = template.get("spec") or {}
    return found


def _containers(workload: Obj) -> list[Obj]:
    spec = _pod_spec(workload)
    return [
        c
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if isinstance(c, Mapping)
    ]


def referenced_secrets(workloads: Iterable[Obj]) -> dict[str, set[str]]:
    """The Secrets (and their keys, where named) the pods of `workloads` need to start:
    env `secretKeyRef`, `envFrom` `secretRef` and secret volumes; optional ones left out."""
    wanted: dict[str, set[str]] = {}
    for workload in workloads:
        for container in _containers(workload):
            for env in container.get("env") or []:
                ref = ((env or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
                if ref.get("name") and not ref.get("optional"):
                    wanted.setdefault(str(ref["name"]), set()).add(str(ref.get("key") or ""))
            for source in container.get("envFrom") or []:
                ref = (source or {}).get("secretRef") or {}
                if ref.get("name") and not ref.get("optional"):
                    wanted.setdefault(str(ref["name"]), set())
        for volume in _pod_spec(workload).get("volumes") or []:
            secret = (volume or {}).get("secret") or {}
            if secret.get("secretName") and not secret.get("optional"):
                keys = {str(i.get("key")) for i in secret.get("items") or [] if i.get("key")}
                wanted.setdefault(str(secret["secretName"]), set()).update(keys)
    return {name: {k for k in keys if k} for name, keys in wanted.items()}


def check_secrets(
    expected: Mapping[str, set[str]],
    secrets: Sequence[Obj] | None,
    namespace: str,
    unread: str = "",
    *,
    deployed: bool = True,
) -> list[Check]:
    """Rule: every Secret the services need is in `namespace` with the keys they read
    (FAIL: missing, or missing a key). None: not read (SKIP, saying why: `unread`, else
    the API server serves none). With no Nodeflow Deployment in `namespace` (`deployed`
    False: not installed yet, or the services run elsewhere, as the local stack's processes
    do) nothing fails to start for want of a Secret: a missing one is a WARN to create it
    before deploying."""
    if secrets is None:
        return [
            Check(
                "SKIP",
                "secrets",
                unread
                or "the API server serves no Secrets (credentials come from elsewhere, e.g. "
                "the local stack's .run/env)",
            )
        ]
    present = {_name(s): s for s in secrets}
    checks = []
    for name, keys in sorted(expected.items()):
        secret = present.get(name)
        title = f"secret {namespace}/{name}"
        if secret is None:
            if deployed:
                checks.append(Check("FAIL", title, "missing: the pods that mount it do not start"))
            else:
                checks.append(
                    Check(
                        "WARN",
                        title,
                        f"missing: no Nodeflow Deployment in {namespace} mounts it yet; "
                        "create it before deploying the services",
                    )
                )
            continue
        have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
        missing = keys - have
        if missing:
            checks.append(Check("FAIL", title, f"missing key(s) {_names(missing)}"))
        else:
            checks.append(Check("OK", title, f"present ({_names(have) or 'no keys'})"))
    return checks


# --- CRDs -----------------------------------------------------------------------------------


def custom_kinds() -> list[WatchedKind]:
    """The kinds the services watch that a CustomResourceDefinition provides."""
    return [k for k in WATCHED_KINDS if k.served_by_crd]


def crd_owners(kind: str) -> str:
    """Who reconciles `kind`: the services that write its status (their command grants);
    failing that, the services that read it (their NATS grants on its KV bucket)."""
    writers = sorted(
        service
        for service, grants in COMMAND_POLICY.items()
        # The operators' user may write every status; it reconciles nothing.
        if service in SERVICES and any(g.op == "update-status" and kind in g.kinds for g in grants)
    )
    if writers:
        return "status by " + ", ".join(writers)
    bucket = subjects.k8s_bucket(kind)
    # k8s-watcher reads back every kind's bucket it mirrors: that makes it no owner.
    readers = sorted(
        s for s, grant in BUS_GRANTS.items() if bucket in grant.reads_buckets and s != MIRROR
    )
    return "read by " + (", ".join(readers) if readers else "no service")


def _version_text(version: Obj) -> str:
    """`v1alpha1 (served, storage)`: a CRD version and its flags that are on."""
    flags = [flag for flag in ("served", "storage") if version.get(flag)]
    return str(version["name"]) + (f" ({', '.join(flags)})" if flags else "")


def check_crds(crds: Sequence[Obj] | None, unread: str = "") -> list[Check]:
    """Rule: each CRD the services watch is installed and serves the version they use
    (FAIL otherwise); the detail lists its versions (served, storage) and its owners.
    None: not read (SKIP, saying why)."""
    if crds is None:
        return [Check("SKIP", "crds", unread or "the API server serves no CRDs")]
    by_name = {_name(c): c for c in crds}
    checks = []
    for kind in custom_kinds():
        crd_name = f"{kind.plural}.{kind.group}"
        title = f"crd {crd_name}"
        owners = crd_owners(kind.kind)
        crd = by_name.get(crd_name)
        if crd is None:
            checks.append(Check("FAIL", title, f"not installed ({kind.kind}: {owners})"))
            continue
        versions = [v for v in (crd.get("spec") or {}).get("versions") or [] if v.get("name")]
        shown = ", ".join(_version_text(v) for v in versions)
        served = {v["name"] for v in versions if v.get("served")}
        if kind.version not in served:
            checks.append(
                Check(
                    "FAIL",
                    title,
                    f"{kind.version} not served (versions {shown or 'none'}); "
                    f"the services use {kind.version}; {owners}",
                )
            )
        else:
            checks.append(Check("OK", title, f"{shown}; {owners}"))
    return checks


# --- COMMAND_NAMESPACES ---------------------------------------------------------------------


def env_setting(deployment: Obj, variable: str, configmaps: Mapping[str, Obj]) -> str | None:
    """The value of `variable` in the Deployment's containers (a value, a ConfigMap key, or
    a ConfigMap's `envFrom`); None when it is not set. `configmaps`: by name, as fetched."""
    for container in _containers(deployment):
        for env in container.get("env") or []:
            if (env or {}).get("name") != variable:
                continue
            if "value" in env:
                return str(env.get("value") or "")
            ref = (env.get("valueFrom") or {}).get("configMapKeyRef") or {}
            data = (configmaps.get(str(ref.get("name") or "")) or {}).get("data") or {}
            if ref.get("key") in data:
                return str(data[ref["key"]])
        for source in container.get("envFrom") or []:
            ref = (source or {}).get("configMapRef") or {}
            data = (configmaps.get(str(ref.get("name") or "")) or {}).get("data") or {}
            prefix = str((source or {}).get("prefix") or "")
            if variable.startswith(prefix) and variable.removeprefix(prefix) in data:
                return str(data[variable.removeprefix(prefix)])
    return None


def env_configmaps(deployment: Obj) -> set[str]:
    """The ConfigMaps the Deployment's env reads (to fetch before `env_setting`)."""
    names = set()
    for container in _containers(deployment):
        for env in container.get("env") or []:
            ref = ((env or {}).get("valueFrom") or {}).get("configMapKeyRef") or {}
            if ref.get("name"):
                names.add(str(ref["name"]))
        for source in container.get("envFrom") or []:
            ref = (source or {}).get("configMapRef") or {}
            if ref.get("name"):
                names.add(str(ref["name"]))
    return names


def namespaces_in_use(objects: Mapping[str, Sequence[Obj]]) -> dict[str, set[str]]:
    """Namespace -> the kinds (of `objects`: kind -> its objects) that have objects there."""
    found: dict[str, set[str]] = {}
    for kind, items in objects.items():
        for obj in items:
            namespace = _meta(obj).get("namespace")
            if namespace:
                found.setdefault(str(namespace), set()).add(kind)
    return found


def check_command_namespaces(
    setting: str | None, in_use: Mapping[str, set[str]], deployed_in: str, unread: str = ""
) -> Check:
    """Rule: every namespace holding NodeSets or PodGroups is in k8s-watcher's
    COMMAND_NAMESPACES (empty: all), or the commands acting there (creating and deleting
    NodeSet pods, binding gang pods) are refused (FAIL). None: no k8s-watcher Deployment;
    `unread`: the Deployments or the namespaces in use not read (both SKIP)."""
    name = "command-namespaces"
    if unread:
        return Check("SKIP", name, unread)
    if setting is None:
        return Check(
            "SKIP",
            name,
            f"k8s-watcher is not deployed as a Deployment in {deployed_in}: "
            "COMMAND_NAMESPACES not read",
        )
    allowed = {part.strip() for part in setting.split(",") if part.strip()}
    used = (
        ", ".join(f"{ns} ({'+'.join(sorted(kinds))})" for ns, kinds in sorted(in_use.items()))
        or "none"
    )
    if not allowed:
        return Check("OK", name, f"unset: commands act in every namespace; in use: {used}")
    outside = {ns: kinds for ns, kinds in in_use.items() if ns not in allowed}
    if outside:
        listed = "; ".join(f"{ns} ({'+'.join(sorted(k))})" for ns, k in sorted(outside.items()))
        return Check(
            "FAIL",
            name,
            f"COMMAND_NAMESPACES={','.join(sorted(allowed))} leaves out {listed}: "
            "k8s-watcher refuses the commands acting there",
        )
    return Check("OK", name, f"COMMAND_NAMESPACES={','.join(sorted(allowed))} covers {used}")


# --- koord-scheduler ------------------------------------------------------------------------


def placer_scheduler_names(setting: str | None) -> tuple[str, ...]:
    """The schedulerNames topology-placer serves: its SCHEDULER_NAMES, else its default."""
    if setting:
        return tuple(part.strip() for part in setting.split(",") if part.strip())
    for info in msgspec.structs.fields(TopologyPlacerConfig):
        if info.name == "scheduler_names":
            default: tuple[str, ...] = info.default
            return default
    return ()


def lease_fresh(lease: Obj | None, now: float) -> bool:
    """Held, and renewed within its duration (a holder that stopped renewing leads no more)."""
    spec = (lease or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if not spec.get("holderIdentity") or renewed is None or not isinstance(duration, int | float):
        return False
    return now - renewed <= duration


def other_schedulers(
    deployments: Sequence[Obj], leases: Sequence[Obj], scheduler: str, now: float
) -> list[str]:
    """Schedulers other than topology-placer that serve `scheduler`: a Deployment of that
    name with a ready replica (Koordinator's is `koord-scheduler`), or a fresh leader Lease
    of that name (kube-scheduler's leader election, which Koordinator's keeps)."""
    found = set()
    for deployment in deployments:
        if (
            _name(deployment) == scheduler
            and ((deployment.get("status") or {}).get("readyReplicas") or 0) > 0
        ):
            found.add(f"Deployment {_meta(deployment).get('namespace')}/{scheduler}")
    for lease in leases:
        if _name(lease) == scheduler and lease_fresh(lease, now):
            found.add(f"Lease {_meta(lease).get('namespace')}/{scheduler}")
    return sorted(found)


def pending_pods(pods: Sequence[Obj], scheduler: str) -> list[str]:
    """ns/name of the pods that ask for `scheduler` and are not bound yet."""
    return sorted(
        f"{_meta(p).get('namespace')}/{_name(p)}"
        for p in pods
        if (p.get("spec") or {}).get("schedulerName") == scheduler
        and not (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase", "Pending") == "Pending"
        and not _meta(p).get("deletionTimestamp")
    )


def check_scheduler(
    pending: Sequence[str],
    placer_names: Sequence[str],
    placer_leads: bool,
    others: Sequence[str],
    scheduler: str = KOORD_SCHEDULER,
    unread: str = "",
) -> Check:
    """Rule: exactly one scheduler serves `scheduler`. Two (topology-placer and Koordinator's
    own, say) race to bind the same pods and break a gang's all-or-nothing (FAIL); none
    while pods wait for it leaves them pending (FAIL), and with no pod waiting (WARN)."""
    name = f"scheduler {scheduler}"
    if unread:
        return Check("SKIP", name, unread)
    servers = list(others)
    if scheduler in placer_names:
        servers.insert(0, PLACER if placer_leads else "")
    servers = [s for s in servers if s]
    waiting = f"{len(pending)} pod(s) pending" + (f" ({_names(pending)})" if pending else "")
    if len(servers) > 1:
        return Check(
            "FAIL",
            name,
            f"served by {len(servers)} schedulers ({', '.join(servers)}): they "
            f"race to bind the same pods; {waiting}",
        )
    if not servers:
        why = (
            f"{PLACER} serves it but has no fresh leader"
            if scheduler in placer_names
            else f"{PLACER} does not serve it (SCHEDULER_NAMES={','.join(placer_names)})"
        )
        return Check(
            "FAIL" if pending else "WARN", name, f"no scheduler serves it: {why}; {waiting}"
        )
    return Check("OK", name, f"served by {servers[0]}; {waiting}")


# --- Slurm ----------------------------------------------------------------------------------


def check_slurm(
    statuses: Sequence[SlurmClusterStatus] | None, now: float, skip: str
) -> list[Check]:
    """Rule: each Slurm cluster slurm-syncer reports was reached and read recently (FAIL:
    unreachable or stale, its node states then count as unknown) and names the slurmrestd
    API version it speaks (WARN: not negotiated yet). None: not read (SKIP `skip`)."""
    if statuses is None:
        return [Check("SKIP", "slurm", skip)]
    if not statuses:
        return [Check("WARN", "slurm", "no cluster reported by slurm-syncer (KV slurm_clusters)")]
    checks = []
    for status in sorted(statuses, key=lambda s: s.cluster):
        title = f"slurm {status.cluster}"
        api = (
            f"slurmrestd API {status.api_version}"
            if status.api_version
            else "API version not negotiated"
        )
        polled = f"last poll {_ago(now - status.last_poll_at)}"
        if not status.reachable:
            checks.append(
                Check(
                    "FAIL",
                    title,
                    f"unreachable: {status.error or 'no error given'}; {api}; {polled}",
                )
            )
        elif not status.fresh(now):
            last = _ago(now - status.last_success_at) if status.last_success_at else "never"
            checks.append(
                Check(
                    "FAIL",
                    title,
                    f"stale: last successful poll {last} (poll every "
                    f"{status.poll_interval_seconds:g}s): its node states count as unknown; {api}",
                )
            )
        elif not status.api_version:
            checks.append(Check("WARN", title, f"{api}; {polled}"))
        else:
            nodes = f", {status.nodes_listed} nodes" if status.nodes_listed >= 0 else ""
            checks.append(Check("OK", title, f"{api}; {polled}{nodes}"))
    return checks


# --- NATS -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamHealth:
    name: str
    found: bool
    leader: str = ""
    # Replicas (by server name) that are not current or are offline.
    lagging: tuple[str, ...] = ()
    clustered: bool = False


@dataclass(frozen=True)
class NatsFacts:
    server: str
    version: str
    cluster: str
    # JetStream account: None when the account info call failed (its error in `error`).
    streams: int | None
    consumers: int | None
    error: str = ""
    stream_health: tuple[StreamHealth, ...] = field(default_factory=tuple)


def check_nats(facts: NatsFacts | None, skip: str) -> list[Check]:
    """Rule: NATS answers and JetStream serves the account (FAIL otherwise); every declared
    stream exists (FAIL) with a leader (FAIL) and current replicas (WARN). None: not read."""
    if facts is None:
        return [Check("SKIP", "nats", skip), Check("SKIP", "nats streams", skip)]
    where = f"{facts.server} (nats-server {facts.version}" + (
        f", cluster {facts.cluster})" if facts.cluster else ")"
    )
    if facts.streams is None:
        return [Check("FAIL", "nats", f"{where}: JetStream does not answer: {facts.error}")]
    checks = [
        Check(
            "OK", "nats", f"{where}: JetStream {facts.streams} streams, {facts.consumers} consumers"
        )
    ]
    missing = [s.name for s in facts.stream_health if not s.found]
    leaderless = [s.name for s in facts.stream_health if s.found and s.clustered and not s.leader]
    lagging = [f"{s.name} ({', '.join(s.lagging)})" for s in facts.stream_health if s.lagging]
    if missing or leaderless:
        parts = []
        if missing:
            parts.append(f"missing: {_names(missing)}")
        if leaderless:
            parts.append(f"no leader: {_names(leaderless)}")
        checks.append(Check("FAIL", "nats streams", "; ".join(parts)))
    elif lagging:
        checks.append(Check("WARN", "nats streams", f"replicas not current: {_names(lagging)}"))
    else:
        checks.append(
            Check(
                "OK",
                "nats streams",
                f"all {len(facts.stream_health)} declared streams have a leader",
            )
        )
    return checks


# --- leaders and readiness ------------------------------------------------------------------


def check_leaders(
    leases: Sequence[Obj] | None, namespace: str, now: float, unread: str = ""
) -> list[Check]:
    """Rule: each service's leader Lease (named after its NATS lease) in `namespace` names
    a holder that renewed it within its duration (FAIL: missing, released, or stale: no
    replica leads, so nothing of that service acts). None: not read (SKIP, saying why)."""
    if leases is None:
        return [Check("SKIP", "leaders", unread or "the API server serves no Leases")]
    by_name = {_name(lease): lease for lease in leases}
    checks = []
    for service in SERVICES:
        for lease_name in lease_names(service):
            title = f"leader {lease_name}"
            lease = by_name.get(lease_name)
            if lease is None:
                checks.append(Check("FAIL", title, f"no Lease {namespace}/{lease_name}: no leader"))
                continue
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            renewed = parse_time(spec.get("renewTime"))
            duration = spec.get("leaseDurationSeconds")
            if not holder:
                checks.append(Check("FAIL", title, "released: no replica holds it"))
            elif not lease_fresh(lease, now):
                last = _ago(now - renewed) if renewed is not None else "never"
                checks.append(
                    Check(
                        "FAIL",
                        title,
                        f"stale: {holder} renewed it {last} (lease {duration}s): no replica leads",
                    )
                )
            else:
                assert renewed is not None
                checks.append(Check("OK", title, f"{holder}, renewed {_ago(now - renewed)}"))
    return checks


def check_readiness(
    deployments: Sequence[Obj] | None, namespace: str, unread: str = ""
) -> list[Check]:
    """Rule: each service's Deployment has every replica ready (WARN: some; FAIL: none or
    no Deployment). No service deployed as a Deployment (the local stack runs processes):
    one SKIP saying so, not a failure; the Deployments not read: one SKIP saying why."""
    if deployments is None and unread:
        return [Check("SKIP", "ready", unread)]
    by_name = {_name(d): d for d in deployments or []}
    if not any(service in by_name for service in SERVICES):
        return [Check("SKIP", "ready", f"not deployed as Deployments in {namespace}")]
    checks = []
    for service in SERVICES:
        title = f"ready {service}"
        deployment = by_name.get(service)
        if deployment is None:
            checks.append(Check("FAIL", title, f"no Deployment {namespace}/{service}"))
            continue
        wanted = (deployment.get("spec") or {}).get("replicas", 1)
        ready = (deployment.get("status") or {}).get("readyReplicas") or 0
        status: Status = "OK" if ready >= wanted else ("WARN" if ready else "FAIL")
        checks.append(Check(status, title, f"{ready}/{wanted} replicas ready"))
    return checks
