"""`python -m nodeset_controller.migrate slinky < nodesets.yaml > ours.yaml`: turn Slinky's
NodeSets (SchedMD's slurm-operator, `slinky.slurm.net/v1beta1` and `v1alpha1`) into ours.

Input: YAML documents (one or many, `---` separated, or a `List` such as `kubectl get
nodesets.slinky.slurm.net -A -o yaml` prints). Output: our NodeSets on stdout, one document
each. Every Slinky field is either carried over, made explicit where our default differs
(Slinky's `replicas` 1, `maxUnavailable` 25 %), or listed on stderr with what to do instead.

Exit status, so a pipeline into `kubectl apply` cannot change behaviour unseen:
  0  converted; stderr lists only notes (what was carried over differently, nothing lost).
  2  a field whose value would change behaviour has no equivalent here (a Slinky-made Slurm
     partition, per-pod volumes, a scheduled update, ...): nothing is written on stdout unless
     `--accept-changes` says the listed changes are understood, then it exits 0.
  1  the input cannot be converted (not YAML, a NodeSet without `controllerRef`, a value our
     schema refuses).

What Slinky's operator added to every slurmd pod by itself (the configless `--conf-server`,
the node's `--conf` with its NodeSet feature, the Slurm auth key volume, privileges, ports and
probes) becomes explicit in the template, since our controller runs the template as written.
The conversion is a pure function of the document and the options (`convert_slinky`); `main`
only reads, writes and exits.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TextIO

import yaml

from nodeflow_contracts.nodeset import (
    DEFAULT_WINDOW_MINUTES,
    RECURRING_RESERVATION_FLAGS,
    update_window,
)
from nodeflow_kube.fields import mapping, sequence
from nodeset_controller.spec import is_int

SLINKY_GROUP: Final = "slinky.slurm.net"
SLINKY_VERSIONS: Final = ("v1beta1", "v1alpha1")
OUR_API_VERSION: Final = "nodeflow.dev/v1alpha1"
SLURMCTLD_PORT: Final = 6817
SLURMD_PORT: Final = 6818
# Slinky's defaults (internal/defaults/nodeset.go; the v1alpha1 controller fell back to 1).
SLINKY_REPLICAS: Final = 1
SLINKY_MAX_UNAVAILABLE: Final[dict[str, int | str]] = {"v1beta1": "25%", "v1alpha1": 1}
# What Slinky's worker builder gives the slurmd container (workerbuilder/worker_app.go).
SLINKY_SLURMD_CAPABILITIES: Final = ("BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE")
SLURM_ETC_VOLUME: Final = "slurm-etc"
SLURM_KEY_FILE: Final = "slurm.key"
# Metadata the API server or a client owns: never carried to the new object.
_DROPPED_ANNOTATIONS: Final = ("kubectl.kubernetes.io/last-applied-configuration",)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PERCENT = re.compile(r"^(100|[1-9]?[0-9])%$")

Severity = Literal["note", "change", "error"]


@dataclass(frozen=True)
class Finding:
    """One thing the user must know: a note (carried over differently, nothing lost), a
    change (behaviour would differ: what to do instead), or an error (cannot convert)."""

    field: str
    severity: Severity
    message: str

    def describe(self, source: str) -> str:
        return f"{self.severity}: {source}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Options:
    # Our `slurmCluster` (slurm-syncer's name for the cluster); controllerRef's name if None.
    slurm_cluster: str | None = None
    # slurmctld for the configless slurmd, host:port; `<controllerRef>-controller.<ns>:6817`
    # (Slinky's Service for a Controller it runs) if None.
    conf_server: str | None = None
    # Secret (and key) with the Slurm auth key; the chart's `<controllerRef>-auth-slurm`,
    # key `slurm.key`, if None.
    slurm_key_secret: str | None = None
    slurm_key_key: str = SLURM_KEY_FILE


@dataclass
class Conversion:
    source: str
    nodeset: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)

    def add(self, path: str, severity: Severity, message: str) -> None:
        self.findings.append(Finding(path, severity, message))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def changes(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "change"]


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == {} or value == []


def _pruned(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` without its empty values (Helm renders many `{}`, `[]`, `""` and nulls; each
    means unset, so dropping them changes nothing)."""
    return {k: v for k, v in obj.items() if not _empty(v)}


def _hostname_prefix(hostname: str) -> str:
    """Slinky's NodeSet name from a template hostname (common.GetSlurmNodeSetName)."""
    first = hostname.split()[0] if hostname.split() else ""
    return first.strip("-")


def _parse_extra_conf(extra_conf: str) -> dict[str, list[str]] | None:
    """Slinky's `extraConf` (`Key=Value` pairs, values comma lists, keys title-cased) as its
    worker builder reads it; None when malformed."""
    parsed: dict[str, list[str]] = {}
    for item in extra_conf.split():
        key, sep, value = item.partition("=")
        if not sep:
            return None
        parsed.setdefault(key[:1].upper() + key[1:].lower(), []).extend(value.split(","))
    return parsed


def _slurmd_conf(feature: str, extra_conf: str, out: Conversion) -> str:
    """The `--conf` Slinky's operator gave slurmd: the NodeSet's feature (what its
    partitions select on) plus `extraConf`; `Topology` is left out (see the note)."""
    conf: dict[str, str] = {}
    features = [feature]
    if extra_conf:
        parsed = _parse_extra_conf(extra_conf)
        if parsed is None:
            out.add(
                "spec.extraConf",
                "error",
                f"{extra_conf!r} is not `Key=Value` pairs (Slinky ignored it): fix it first",
            )
        else:
            for key, values in parsed.items():
                if key in ("Feature", "Features"):
                    features.extend(values)
                else:
                    conf[key] = ",".join(values)
            out.add(
                "spec.extraConf",
                "note",
                "carried into the slurmd container's --conf argument, as Slinky passed it",
            )
    conf["Features"] = ",".join(sorted(set(features)))
    return " ".join(f"{key}={conf[key]}" for key in sorted(conf))


def _slurmd_container(
    slurmd: Mapping[str, Any],
    *,
    conf_server: str,
    conf: str,
    out: Conversion,
) -> dict[str, Any]:
    """Slinky's `spec.slurmd` as a container with what Slinky's builder added by itself."""
    container = {"name": "slurmd", **_pruned(slurmd)}
    container["name"] = "slurmd"
    if not container.get("image"):
        out.add("spec.slurmd.image", "error", "no slurmd image: set one")
    # Slinky put its own arguments first and appended the user's.
    own_args = ["-Z", "--conf-server", conf_server, "--conf", conf]
    container["args"] = own_args + [str(a) for a in sequence(slurmd.get("args"))]
    ports = list(sequence(container.get("ports")))
    if not any(mapping(p).get("containerPort") == SLURMD_PORT for p in ports):
        ports.insert(0, {"name": "slurmd", "containerPort": SLURMD_PORT, "protocol": "TCP"})
    container["ports"] = ports
    security = dict(mapping(container.get("securityContext")))
    security.setdefault("privileged", True)
    security.setdefault("capabilities", {"add": list(SLINKY_SLURMD_CAPABILITIES)})
    container["securityContext"] = security
    mounts = list(sequence(container.get("volumeMounts")))
    if not any(mapping(m).get("name") == SLURM_ETC_VOLUME for m in mounts):
        mounts.insert(0, {"name": SLURM_ETC_VOLUME, "mountPath": "/etc/slurm", "readOnly": True})
    container["volumeMounts"] = mounts
    return container


def _key_volume(secret: str, key: str) -> dict[str, Any]:
    return {
        "name": SLURM_ETC_VOLUME,
        "projected": {
            "defaultMode": 0o600,
            "sources": [
                {"secret": {"name": secret, "items": [{"key": key, "path": SLURM_KEY_FILE}]}}
            ],
        },
    }


def _replicas(spec: Mapping[str, Any], version: str, out: Conversion) -> int | None:
    mode = spec.get("scalingMode") if version == "v1beta1" else None
    replicas = spec.get("replicas")
    if mode == "DaemonSet":
        if replicas is not None:
            out.add(
                "spec.replicas",
                "note",
                "ignored in DaemonSet mode, as Slinky did: the NodeSet runs on every node it fits",
            )
        out.add(
            "spec.scalingMode",
            "note",
            "DaemonSet: `replicas` is left unset, so one pod runs on each node the template fits",
        )
        return None
    if mode not in (None, "", "StatefulSet"):
        out.add("spec.scalingMode", "error", f"unknown scaling mode {mode!r}")
        return None
    if replicas is None:
        out.add(
            "spec.replicas",
            "note",
            f"unset: written as {SLINKY_REPLICAS}, Slinky's default (unset, ours would run on "
            "every node)",
        )
        return SLINKY_REPLICAS
    if not is_int(replicas) or replicas < 0:
        out.add("spec.replicas", "error", f"{replicas!r} is not a count of pods")
        return None
    return int(replicas)


def _update_strategy(spec: Mapping[str, Any], version: str, out: Conversion) -> dict[str, Any]:
    strategy = mapping(spec.get("updateStrategy"))
    kind = strategy.get("type") or "RollingUpdate"
    if kind == "OnDelete":
        return {"type": "OnDelete"}
    scheduled: dict[str, Any] | None = None
    if kind == "ScheduledUpdate":
        scheduled = _scheduled_update(strategy, out)
    elif kind != "RollingUpdate":
        out.add("spec.updateStrategy.type", "error", f"unknown update strategy {kind!r}")
    raw = mapping(strategy.get("rollingUpdate")).get("maxUnavailable")
    if raw is None:
        raw = SLINKY_MAX_UNAVAILABLE[version]
        out.add(
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
            "note",
            f"unset: written as {raw}, Slinky's default (ours is 1)",
        )
    elif (is_int(raw) and raw < 1) or (
        not is_int(raw) and not (isinstance(raw, str) and _PERCENT.match(raw) and raw != "0%")
    ):
        out.add(
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
            "error",
            f"{raw!r}: ours takes a positive count or 1%..100% (0 would never replace a pod)",
        )
    if scheduled is not None:
        return {
            "type": "ScheduledUpdate",
            "scheduledUpdate": scheduled,
            "rollingUpdate": {"maxUnavailable": raw},
        }
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": raw}}


def _scheduled_update(strategy: Mapping[str, Any], out: Conversion) -> dict[str, Any] | None:
    """Slinky's `scheduledUpdate {startTime, duration, flags}` carried as is (the same fields
    and window); what differs is listed as notes: pods are replaced within maxUnavailable and
    only once their Slurm node runs no job, and the reservation also carries IGNORE_JOBS."""
    window = dict(mapping(strategy.get("scheduledUpdate")))
    window.setdefault("duration", f"{DEFAULT_WINDOW_MINUTES}m")
    if not window.get("flags"):
        window.pop("flags", None)
    checked = update_window("ns", "nodeset", {"scheduledUpdate": window})
    if isinstance(checked, str):
        out.add("spec.updateStrategy.scheduledUpdate", "error", checked)
        return None
    recurring = [flag for flag in checked.flags if flag in RECURRING_RESERVATION_FLAGS]
    if recurring:
        # Slinky replaces pods at every recurrence of its reservation; our window is one
        # [startTime, startTime + duration), its reservation deleted after: carried as is, the
        # NodeSet would silently update once instead of every period.
        # The NodeSet refuses such a flag; accepted, the change is a window that runs once.
        kept = [
            f for f in window.get("flags") or [] if f.upper() not in RECURRING_RESERVATION_FLAGS
        ]
        if kept:
            window["flags"] = kept
        else:
            window.pop("flags", None)
        out.add(
            "spec.updateStrategy.scheduledUpdate.flags",
            "change",
            f"{', '.join(recurring)}: the window would not recur (here it is one startTime + "
            "duration, its reservation deleted after it): the flag is dropped; set a new "
            "startTime for each window",
        )
    out.add(
        "spec.updateStrategy.scheduledUpdate",
        "note",
        "inside the window pods are replaced within rollingUpdate.maxUnavailable (Slinky "
        "replaced every pod under the reservation at once: set 100% for that pace), each once "
        "its Slurm node runs no job; the reservation carries IGNORE_JOBS besides MAINT; "
        "slurmrestd v0.0.43+ (Slurm 25.05+) is needed, as for Slinky",
    )
    return window


# Slinky fields with no equivalent here: (field, when it matters, what to do instead). A
# field whose value is its default is dropped without a word.
def _unsupported(spec: Mapping[str, Any], version: str, out: Conversion) -> None:
    ssh = mapping(spec.get("ssh"))
    if ssh.get("enabled"):
        out.add(
            "spec.ssh",
            "change",
            "sshd (and sssd) in the slurmd pods is not run: add your own sshd container to "
            "the template, or let users in through a login node",
        )
    partition = mapping(spec.get("partition"))
    # v1alpha1 made a partition unless told not to; v1beta1 only when enabled.
    if partition.get("enabled", version == "v1alpha1"):
        config = partition.get("config")
        out.add(
            "spec.partition",
            "change",
            "Slinky wrote a PartitionName line for this NodeSet into slurm.conf; Nodeflow does "
            "not write slurm.conf: keep that line in your slurm.conf (its nodes are the ones "
            "with this NodeSet's feature)" + (f", with {config!r}" if config else ""),
        )
    if sequence(spec.get("volumeClaimTemplates")):
        out.add(
            "spec.volumeClaimTemplates",
            "change",
            "no per-pod PersistentVolumeClaims: use a volume in the template (a hostPath or "
            "a shared claim) or create the claims yourself",
        )
    if spec.get("oversubscribeNode"):
        out.add(
            "spec.oversubscribeNode",
            "change",
            "we run one NodeSet pod per Kubernetes node: split the nodes into more NodeSets",
        )
    if spec.get("taintKubeNodes"):
        out.add(
            "spec.taintKubeNodes",
            "change",
            "nodes are not tainted for you: taint them yourself (the pods tolerate the lock "
            "taint only) or keep other pods away with their affinity",
        )
    if spec.get("pruneSlurmNodeRecords") not in (None, "", "Never", "NodeNotFound"):
        out.add(
            "spec.pruneSlurmNodeRecords",
            "error",
            f"{spec.get('pruneSlurmNodeRecords')!r}: Never or NodeNotFound",
        )
    if sequence(spec.get("volumeClaimTemplates")) and spec.get(
        "persistentVolumeClaimRetentionPolicy"
    ):
        out.add("spec.persistentVolumeClaimRetentionPolicy", "note", "dropped with the claims")
    if is_int(spec.get("ordinalPadding")) and spec.get("ordinalPadding"):
        out.add("spec.ordinalPadding", "note", "pod names come from their nodes, not ordinals")
    if spec.get("pinToNode"):
        out.add("spec.pinToNode", "note", "always so here: each pod is named from its node")
    if not _empty(spec.get("logfile")):
        out.add(
            "spec.logfile",
            "note",
            "no log sidecar is added: slurmd's log goes where slurm.conf's SlurmdLogFile says "
            "(unset: the container's output); add a container that tails the file if you set one",
        )


_KNOWN_FIELDS: Final = frozenset(
    {
        "controllerRef",
        "replicas",
        "scalingMode",
        "slurmd",
        "ssh",
        "logfile",
        "template",
        "extraConf",
        "partition",
        "volumeClaimTemplates",
        "updateStrategy",
        "revisionHistoryLimit",
        "persistentVolumeClaimRetentionPolicy",
        "minReadySeconds",
        "ordinalPadding",
        "pinToNode",
        "workloadDisruptionProtection",
        "pruneSlurmNodeRecords",
        "oversubscribeNode",
        "taintKubeNodes",
    }
)


def _carried_options(
    spec: Mapping[str, Any], replicas: int | None, out: Conversion
) -> dict[str, Any]:
    """Options both NodeSets have: `workloadDisruptionProtection` (on by default in both),
    `pruneSlurmNodeRecords` (Never by default in both), `minReadySeconds` (0 in both) and
    `revisionHistoryLimit` (carried when set; unset keeps ours, 10, where Slinky kept 0: more
    history to roll back to, no pod changes)."""
    carried: dict[str, Any] = {}
    minimum = spec.get("minReadySeconds")
    if is_int(minimum) and minimum > 0:
        carried["minReadySeconds"] = minimum
    history = spec.get("revisionHistoryLimit")
    if is_int(history) and history >= 0:
        carried["revisionHistoryLimit"] = history
    if spec.get("workloadDisruptionProtection") is False:
        carried["workloadDisruptionProtection"] = False
    if spec.get("pruneSlurmNodeRecords") == "NodeNotFound":
        if replicas is None:
            carried["pruneSlurmNodeRecords"] = "NodeNotFound"
            out.add(
                "spec.pruneSlurmNodeRecords",
                "note",
                "NodeNotFound: slurm-syncer deletes the record of a pod that is gone once Slurm "
                "reads it DOWN, or drained for the deletion, and idle",
            )
        else:
            # Slinky prunes in DaemonSet mode only; carrying it would start pruning here.
            out.add(
                "spec.pruneSlurmNodeRecords",
                "note",
                "NodeNotFound did nothing in Slinky's StatefulSet mode: left at Never; set "
                "NodeNotFound to have the records of gone pods deleted",
            )
    return carried


def _metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": meta.get("name")}
    if meta.get("namespace"):
        out["namespace"] = meta["namespace"]
    if mapping(meta.get("labels")):
        out["labels"] = dict(mapping(meta.get("labels")))
    annotations = {
        k: v for k, v in mapping(meta.get("annotations")).items() if k not in _DROPPED_ANNOTATIONS
    }
    if annotations:
        out["annotations"] = annotations
    return out


def _template(
    spec: Mapping[str, Any], slurmd: dict[str, Any], options: Options, ref: str, out: Conversion
) -> tuple[dict[str, Any], str | None]:
    """Our pod template and pod-name prefix (from Slinky's hostname prefix)."""
    template = mapping(spec.get("template"))
    pod_spec = _pruned(mapping(template.get("spec")))
    prefix: str | None = None
    hostname = pod_spec.pop("hostname", None)
    if isinstance(hostname, str) and hostname.strip():
        prefix = _hostname_prefix(hostname)
        if not _DNS_LABEL.match(prefix) or len(prefix) > 55:
            out.add("spec.template.spec.hostname", "error", f"{prefix!r} is no pod-name prefix")
    if pod_spec.get("hostNetwork"):
        out.add(
            "spec.template.spec.hostNetwork",
            "error",
            "slurmd must run in the pod's network (its hostname is its Slurm node name)",
        )
    others = [dict(mapping(c)) for c in sequence(pod_spec.get("containers"))]
    if any(c.get("name") == "slurmd" for c in others):
        out.add(
            "spec.template.spec.containers",
            "error",
            "the template already has a `slurmd` container beside spec.slurmd: merge them by hand",
        )
    pod_spec["containers"] = [slurmd, *others]
    volumes = [dict(mapping(v)) for v in sequence(pod_spec.get("volumes"))]
    if not any(v.get("name") == SLURM_ETC_VOLUME for v in volumes):
        secret = options.slurm_key_secret or f"{ref}-auth-slurm"
        volumes.insert(0, _key_volume(secret, options.slurm_key_key))
        out.add(
            "spec.template.spec.volumes",
            "note",
            f"the Slurm auth key is mounted from Secret {secret!r} key "
            f"{options.slurm_key_key!r} (the chart's default for Controller {ref!r}); if your "
            "Controller's spec.slurmKeyRef names another, pass --slurm-key-secret NAME/KEY",
        )
    pod_spec["volumes"] = volumes
    result: dict[str, Any] = {"spec": pod_spec}
    meta = _pruned(
        {
            "labels": dict(mapping(mapping(template.get("metadata")).get("labels"))),
            "annotations": dict(mapping(mapping(template.get("metadata")).get("annotations"))),
        }
    )
    if meta:
        result = {"metadata": meta, "spec": pod_spec}
    return result, prefix


def convert_slinky(doc: Mapping[str, Any], options: Options = Options()) -> Conversion:
    """One Slinky NodeSet as ours, with every finding."""
    meta = mapping(doc.get("metadata"))
    namespace = str(meta.get("namespace") or "default")
    source = f"NodeSet {namespace}/{meta.get('name')}"
    out = Conversion(source, None)
    group, _, version = str(doc.get("apiVersion") or "").partition("/")
    if group != SLINKY_GROUP or version not in SLINKY_VERSIONS or doc.get("kind") != "NodeSet":
        out.add("apiVersion", "error", f"not a Slinky NodeSet ({doc.get('apiVersion')})")
        return out
    if not meta.get("name"):
        out.add("metadata.name", "error", "missing")
        return out
    spec = mapping(doc.get("spec"))
    for unknown in sorted(set(spec) - _KNOWN_FIELDS):
        out.add(f"spec.{unknown}", "change", "not a field this converter knows: check it by hand")
    ref = str(mapping(spec.get("controllerRef")).get("name") or "")
    if not ref:
        out.add("spec.controllerRef", "error", "missing: it names the Slurm cluster")
        return out
    cluster = options.slurm_cluster or ref
    if not _DNS_LABEL.match(cluster) or len(cluster) > 63:
        out.add("spec.slurmCluster", "error", f"{cluster!r} is not a DNS label")
    out.add(
        "spec.controllerRef",
        "note",
        f"slurmCluster {cluster!r}: slurm-syncer's SLURM_CLUSTERS must name this cluster "
        "(--slurm-cluster picks another name)",
    )
    conf_server = options.conf_server or f"{ref}-controller.{namespace}:{SLURMCTLD_PORT}"
    if not options.conf_server:
        out.add(
            "spec.slurmd.args",
            "note",
            f"slurmd fetches its configuration from {conf_server} (Slinky's Service for "
            "Controller " + repr(ref) + "); for an external slurmctld pass --conf-server "
            "HOST:PORT",
        )
    hostname = mapping(mapping(spec.get("template")).get("spec")).get("hostname")
    feature = _hostname_prefix(hostname) if isinstance(hostname, str) and hostname.strip() else ""
    conf = _slurmd_conf(feature or str(meta["name"]), str(spec.get("extraConf") or ""), out)
    slurmd = _slurmd_container(
        mapping(spec.get("slurmd")), conf_server=conf_server, conf=conf, out=out
    )
    out.add(
        "spec.slurmd",
        "note",
        "Slinky's own slurmd settings not carried: its probes, its preStop (which set the node "
        "DOWN), POD_CPUS/POD_MEMORY and SLINKY_TOPOLOGY (the --conf Topology); Slurm node "
        "names become the pod names <prefix>-<octet3>-<octet4>",
    )
    template, prefix = _template(spec, slurmd, options, ref, out)
    replicas = _replicas(spec, version, out)
    strategy = _update_strategy(spec, version, out)
    _unsupported(spec, version, out)
    carried = _carried_options(spec, replicas, out)
    if out.errors:
        return out
    our_spec: dict[str, Any] = {"slurmCluster": cluster}
    if replicas is not None:
        our_spec["replicas"] = replicas
    if prefix:
        our_spec["podNamePrefix"] = prefix
    our_spec["updateStrategy"] = strategy
    our_spec.update(carried)
    our_spec["template"] = template
    out.nodeset = {
        "apiVersion": OUR_API_VERSION,
        "kind": "NodeSet",
        "metadata": _metadata(meta),
        "spec": our_spec,
    }
    return out


def _documents(stream: TextIO) -> Iterator[Mapping[str, Any]]:
    """The objects in the YAML stream, `List` items one by one."""
    for doc in yaml.safe_load_all(stream):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise ValueError(f"a YAML document is not an object: {doc!r:.60}")
        if str(doc.get("kind", "")).endswith("List") and "items" in doc:
            for item in sequence(doc.get("items")):
                yield mapping(item)
        else:
            yield doc


def _options(args: argparse.Namespace) -> Options:
    secret, _, key = (args.slurm_key_secret or "").partition("/")
    return Options(
        slurm_cluster=args.slurm_cluster,
        conf_server=args.conf_server,
        slurm_key_secret=secret or None,
        slurm_key_key=key or SLURM_KEY_FILE,
    )


def run(
    argv: Sequence[str],
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
    prog: str = "python -m nodeset_controller.migrate",
) -> int:
    """The command (also `kubectl nodeflow migrate`, which names itself by `prog`): 0 written,
    1 an error, 2 changes listed that alter behaviour and not accepted."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert another operator's NodeSets into Nodeflow's (YAML in, YAML out).",
    )
    parser.add_argument("source", choices=["slinky"], help="the operator the NodeSets are of")
    parser.add_argument("--slurm-cluster", help="our slurmCluster (default: controllerRef)")
    parser.add_argument("--conf-server", help="slurmctld HOST:PORT for the configless slurmd")
    parser.add_argument("--slurm-key-secret", help="Secret NAME[/KEY] of the Slurm auth key")
    parser.add_argument(
        "--accept-changes",
        action="store_true",
        help="write the NodeSets even when a listed change alters behaviour",
    )
    args = parser.parse_args(list(argv))
    options = _options(args)
    try:
        docs = list(_documents(stdin))
    except (yaml.YAMLError, ValueError) as error:
        print(f"error: input: {error}", file=stderr)
        return 1
    conversions: list[Conversion] = []
    for doc in docs:
        if doc.get("kind") != "NodeSet":
            name = mapping(doc.get("metadata")).get("name")
            print(f"skipped: {doc.get('kind')} {name}: not a NodeSet", file=stderr)
            continue
        conversions.append(convert_slinky(doc, options))
    for conversion in conversions:
        for finding in conversion.findings:
            print(finding.describe(conversion.source), file=stderr)
    if not conversions:
        print("error: input: no NodeSet found", file=stderr)
        return 1
    if any(c.errors for c in conversions):
        return 1
    if any(c.changes for c in conversions) and not args.accept_changes:
        print(
            "error: the changes listed above would alter behaviour: nothing written; handle "
            "them, or pass --accept-changes",
            file=stderr,
        )
        return 2
    yaml.safe_dump_all(
        [c.nodeset for c in conversions], stdout, sort_keys=False, default_flow_style=False
    )
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:], sys.stdin, sys.stdout, sys.stderr))


if __name__ == "__main__":
    main()
