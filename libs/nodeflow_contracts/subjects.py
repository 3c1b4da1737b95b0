"""Every NATS subject and KV key the project uses, built here and nowhere else.

Kubernetes and Slurm names may contain characters that have a meaning in a NATS subject
('.' separates tokens, '*' and '>' are wildcards), so every variable token goes through
`token()`, a reversible percent-encoding. KV keys allow '.', so they keep names as they are.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

VERSION = "v1"

_UNSAFE_IN_TOKEN = re.compile(r"[%.*>\s]")
_KV_KEY_SAFE = re.compile(r"^[-/_=.a-zA-Z0-9]+$")

CLUSTER_SCOPED = "_"


def token(value: str) -> str:
    """Encode one value as a single subject token (reversible with `untoken`)."""
    if not value:
        raise ValueError("a subject token cannot be empty")
    return _UNSAFE_IN_TOKEN.sub(
        lambda m: "".join(f"%{byte:02X}" for byte in m.group(0).encode()), value
    )


def untoken(encoded: str) -> str:
    # '%' itself is always escaped, so every '%XX' is an escape of one UTF-8 byte.
    return unquote(encoded, errors="strict")


def namespace_token(namespace: str | None) -> str:
    return token(namespace) if namespace else CLUSTER_SCOPED


# --- KV keys --------------------------------------------------------------------------------


def object_key(namespace: str | None, name: str) -> str:
    """KV key of a Kubernetes object: `<namespace>.<name>`, `_.<name>` when cluster-scoped.

    A namespace is a DNS label (no dots), so the first '.' always separates the two parts.
    """
    key = f"{namespace or CLUSTER_SCOPED}.{name}"
    if not _KV_KEY_SAFE.match(key):
        raise ValueError(f"object name {name!r} cannot be a KV key")
    return key


def split_object_key(key: str) -> tuple[str | None, str]:
    namespace, _, name = key.partition(".")
    return (None if namespace == CLUSTER_SCOPED else namespace), name


def slurm_node_key(cluster: str, node: str) -> str:
    key = f"{cluster}.{node}"
    if not _KV_KEY_SAFE.match(key):
        raise ValueError(f"slurm node {cluster}/{node} cannot be a KV key")
    return key


def slurm_cluster_key(cluster: str) -> str:
    if not _KV_KEY_SAFE.match(cluster):
        raise ValueError(f"slurm cluster {cluster!r} cannot be a KV key")
    return cluster


def kv_entry(bucket: str, key: str) -> str:
    """The subject a KV put is a publish to; batch writers publish here directly."""
    return f"$KV.{bucket}.{key}"


def k8s_bucket(kind: str) -> str:
    """KV bucket holding the latest object of one Kubernetes kind, e.g. `k8s_pods`."""
    return f"k8s_{plural(kind)}"


def plural(kind: str) -> str:
    lowered = kind.lower()
    if lowered.endswith("y"):
        return lowered[:-1] + "ies"
    if lowered.endswith("s"):
        return lowered + "es"
    return lowered + "s"


# --- Kubernetes events and commands ----------------------------------------------------------

K8S_EVENTS = f"k8s.{VERSION}.>"
K8S_COMMANDS = f"cmd.k8s.{VERSION}.>"
K8S_OUTCOMES = f"outcome.k8s.{VERSION}.>"


def k8s_object_event(kind: str, namespace: str | None, name: str) -> str:
    return f"k8s.{VERSION}.{token(kind.lower())}.{namespace_token(namespace)}.{token(name)}"


def k8s_kind_events(kind: str) -> str:
    """Wildcard for every change of one kind."""
    return f"k8s.{VERSION}.{token(kind.lower())}.>"


def k8s_command(sender: str, op: str) -> str:
    """`cmd.k8s.v1.<sender>.<op>`: the sending service is part of the subject, so NATS
    permissions can let each service publish under its own prefix only."""
    return f"cmd.k8s.{VERSION}.{token(sender)}.{token(op)}"


def k8s_sender_commands(sender: str) -> str:
    """Wildcard for every command one service may send."""
    return f"cmd.k8s.{VERSION}.{token(sender)}.>"


def parse_k8s_command(subject: str) -> tuple[str, str] | None:
    """(sender, op) of a `cmd.k8s.v1.<sender>.<op>` subject, None for any other subject."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[:3] != ["cmd", "k8s", VERSION]:
        return None
    try:
        return untoken(parts[3]), untoken(parts[4])
    except UnicodeDecodeError:
        return None


# What each controller's k8s-watcher commands hold (nodeflow_contracts.ledger), per ledger.
COMMAND_LEDGER = f"ledger.k8s.{VERSION}.>"


def command_ledger(ledger: str) -> str:
    """`ledger.k8s.v1.<ledger>`: the records of one controller's command ledger."""
    return f"ledger.k8s.{VERSION}.{token(ledger)}"


def k8s_command_outcome(op: str) -> str:
    return f"outcome.k8s.{VERSION}.{token(op)}"


# --- Slurm ---------------------------------------------------------------------------------

SLURM_EVENTS = f"slurm.{VERSION}.>"
SLURM_COMMANDS = f"cmd.slurm.{VERSION}.>"
SLURM_NODE_EVENTS = f"slurm.{VERSION}.*.node.*"
SLURM_POLLS = f"slurm.{VERSION}.*.poll"


def slurm_node_event(cluster: str, node: str) -> str:
    return f"slurm.{VERSION}.{token(cluster)}.node.{token(node)}"


def slurm_poll_event(cluster: str) -> str:
    return f"slurm.{VERSION}.{token(cluster)}.poll"


def slurm_command(cluster: str, op: str) -> str:
    return f"cmd.slurm.{VERSION}.{token(cluster)}.{token(op)}"


# --- Decisions -------------------------------------------------------------------------------

DECISIONS = ("nodeset.v1.>", "maintenance.v1.>", "placement.v1.>")
NODESET_DECISIONS = f"nodeset.{VERSION}.*.*.decision"


def nodeset_decision(namespace: str, name: str) -> str:
    return f"nodeset.{VERSION}.{token(namespace)}.{token(name)}.decision"


# NodeMaintenance decisions carry five tokens and Skyhook decisions four, so neither wildcard
# matches the other's subjects, whatever a namespace is called.
MAINTENANCE_DECISIONS = f"maintenance.{VERSION}.nodemaintenance.*.*.decision"
SKYHOOK_DECISIONS = f"maintenance.{VERSION}.skyhook.*.decision"


def maintenance_decision(namespace: str, name: str) -> str:
    """maintenance-scheduler's decision about one NodeMaintenance."""
    return f"maintenance.{VERSION}.nodemaintenance.{token(namespace)}.{token(name)}.decision"


def skyhook_decision(skyhook: str) -> str:
    """The Skyhook controller's decision about one Skyhook (cluster-scoped: no namespace)."""
    return f"maintenance.{VERSION}.skyhook.{token(skyhook)}.decision"


PLACEMENT_DECISIONS = f"placement.{VERSION}.*.*.decision"


def placement_decision(namespace: str, group: str) -> str:
    """topology-placer's decision about the GangGroup named by one of its PodGroups."""
    return f"placement.{VERSION}.{token(namespace)}.{token(group)}.decision"


# --- Dead letters ----------------------------------------------------------------------------

DEAD_LETTERS = "dlq.>"
_DLQ_PREFIX = "dlq."


def dead_letter(original_subject: str) -> str:
    return _DLQ_PREFIX + original_subject


def original_of_dead_letter(subject: str) -> str:
    if not subject.startswith(_DLQ_PREFIX):
        raise ValueError(f"{subject!r} is not a dead-letter subject")
    return subject[len(_DLQ_PREFIX) :]
