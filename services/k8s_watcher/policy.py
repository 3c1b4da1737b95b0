"""Pure: whether k8s-watcher may carry out a command, judged by its subject, its deadline and
the sender's policy (nodeflow_contracts.permissions.COMMAND_POLICY).

NATS lets each service publish only under `cmd.k8s.v1.<its name>.>`; the subject therefore
names the sender, and a payload that claims another sender or another operation than its
subject is refused. The policy then says which operations on which kinds, touching which
fields, that sender may ask for. When k8s-watcher is limited to some namespaces
(COMMAND_NAMESPACES), a command on a namespaced object outside them is refused whoever sends it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from k8s_watcher.kinds import SKYHOOK_NAMESPACE_KINDS, resolve_kind
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CreateObject, K8sCommand, PatchObject
from nodeflow_contracts.permissions import (
    ADMIN_USER,
    COMMAND_POLICY,
    CommandGrant,
    field_allowed,
    touched_fields,
)
from nodeflow_contracts.pod_protocol import protection_budget_problem
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE


@dataclass(frozen=True)
class Allowed:
    """The command may go ahead; when `required_label` is set, only if the object it acts on
    carries that label, and when `forbidden_label` is set, only if it does not (the executor
    reads the object to know)."""

    required_label: str | None = None
    forbidden_label: str | None = None
    # Only if the object carries one of these labels (several grants, each its own label).
    required_any: tuple[str, ...] = ()

    @property
    def reads_target(self) -> bool:
        return (
            self.required_label is not None
            or self.forbidden_label is not None
            or bool(self.required_any)
        )


@dataclass(frozen=True)
class Refused:
    reason: str


def target_kind(cmd: K8sCommand) -> str:
    """The kind the command acts on: a create names it in the object it makes."""
    operation = cmd.operation
    if isinstance(operation, CreateObject):
        kind = operation.object.get("kind")
        return str(kind) if kind else cmd.target.kind
    return cmd.target.kind


def target_name(cmd: K8sCommand) -> str:
    """The name of the object the command acts on: a create names it in the object it makes."""
    operation = cmd.operation
    if isinstance(operation, CreateObject):
        metadata = operation.object.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        return str(name) if name else cmd.target.name
    return cmd.target.name


def command_namespace(cmd: K8sCommand) -> str | None:
    """The namespace the command writes in (None: a cluster-scoped object), as commands.py
    builds the call: a create in its object's namespace, else the target's, else `default`."""
    operation = cmd.operation
    if isinstance(operation, CreateObject):
        obj = operation.object
        kind = resolve_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        if kind is not None and not kind.namespaced:
            return None
        metadata = obj.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
        return str(namespace or cmd.target.namespace or "default")
    return cmd.target.namespace


def authorize(
    cmd: K8sCommand,
    subject: str,
    command_namespaces: Collection[str] = (),
    skyhook_namespace: str = DEFAULT_SKYHOOK_NAMESPACE,
) -> Allowed | Refused:
    """Subject against payload, then the namespace limits (COMMAND_NAMESPACES, empty: none;
    SKYHOOK_NAMESPACE for the kinds written there only), then the sender's policy."""
    parsed = subjects.parse_k8s_command(subject)
    if parsed is None:
        return Refused(f"{subject!r} is not a cmd.k8s.v1.<sender>.<op> subject")
    subject_sender, subject_op = parsed
    if subject_op != cmd.op:
        return Refused(f"subject names operation {subject_op!r}, the payload is {cmd.op!r}")
    if subject_sender != cmd.sender:
        return Refused(
            f"subject names sender {subject_sender!r}, the payload claims {cmd.sender!r}",
        )
    kind = target_kind(cmd)
    # A leader's Lease lives in the install namespace, where k8s-watcher's own Role (not the
    # workload RBAC that COMMAND_NAMESPACES mirrors) grants it; the grant pins its name.
    if command_namespaces and kind != "Lease":
        namespace = command_namespace(cmd)
        if namespace is not None and namespace not in command_namespaces:
            # The refusal names the setting to change (and its Helm values key): the sender
            # sees only `forbidden` otherwise, and the fix is the operator's, not the sender's.
            return Refused(
                f"namespace {namespace!r} is outside the namespaces k8s-watcher acts in "
                f"(COMMAND_NAMESPACES={','.join(sorted(command_namespaces))}): add it there "
                f"(Helm: k8sWatcher.commandNamespaces, with the RBAC to match) or leave the "
                f"setting empty to act in every namespace"
            )
    if kind in SKYHOOK_NAMESPACE_KINDS:
        namespace = command_namespace(cmd)
        if namespace != skyhook_namespace:
            return Refused(
                f"{kind} objects are written in the Skyhook namespace only "
                f"(SKYHOOK_NAMESPACE={skyhook_namespace}), not in {namespace!r}"
            )
    grants = COMMAND_POLICY.get(cmd.sender)
    if grants is None:
        return Refused(f"{cmd.sender!r} has no command policy")
    if cmd.expires_at is None and cmd.sender != ADMIN_USER:
        # A service's decision holds for a while only; without a deadline a command held by
        # a crashed executor would be applied however late (operators' tools are exempt).
        return Refused(f"a command of {cmd.sender} must carry a deadline (expires_at)")
    candidates = [g for g in grants if g.op == cmd.op and kind in g.kinds]
    if not candidates:
        return Refused(f"{cmd.sender} may not {cmd.op} {kind} objects")
    name = target_name(cmd)
    named = [g for g in candidates if not g.names or name in g.names]
    if not named:
        allowed_names = sorted({n for g in candidates for n in g.names})
        return Refused(f"{cmd.sender} may {cmd.op} only the {kind} objects named {allowed_names}")
    candidates = named
    operation = cmd.operation
    if isinstance(operation, PatchObject):
        return _authorize_patch(cmd.sender, kind, operation, candidates)
    grant = candidates[0]
    if isinstance(operation, CreateObject):
        # Any one grant suffices (a Skyhook's Job carries its label, a NodeWright's its own);
        # refused, the first grant's reason is told.
        verdicts = [_authorize_create(cmd.sender, kind, operation, g) for g in candidates]
        return next((v for v in verdicts if isinstance(v, Allowed)), verdicts[0])
    labels = {g.required_label for g in candidates}
    if (
        len(candidates) > 1
        and None not in labels
        and not any(g.forbidden_label for g in candidates)
    ):
        # Any one grant suffices (a Skyhook's ConfigMap carries its label, a NodeWright's its
        # own): the object must carry one of their labels.
        return Allowed(required_any=tuple(sorted(label for label in labels if label)))
    return Allowed(grant.required_label, grant.forbidden_label)


def _authorize_create(
    sender: str, kind: str, operation: CreateObject, grant: CommandGrant
) -> Allowed | Refused:
    labels = (operation.object.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, dict):
        labels = {}
    if grant.required_label and grant.required_label not in labels:
        return Refused(f"{sender} may create only {kind} objects labelled {grant.required_label}")
    if grant.forbidden_label and grant.forbidden_label in labels:
        return Refused(f"{sender} may not create {kind} objects labelled {grant.forbidden_label}")
    if grant.protection_budget:
        problem = protection_budget_problem(operation.object)
        if problem is not None:
            return Refused(f"{sender} may create only protection budgets: {problem}")
    return Allowed()


def _authorize_patch(
    sender: str, kind: str, operation: PatchObject, candidates: list[CommandGrant]
) -> Allowed | Refused:
    fields = touched_fields(operation.patch_type, operation.patch)
    if fields is None:
        return Refused(f"a {operation.patch_type} patch of this shape is not judged")
    where = f"the {operation.subresource} of " if operation.subresource else ""
    for grant in candidates:
        if grant.subresource != operation.subresource:
            continue
        outside = [field for field in fields if not field_allowed(field, grant.fields)]
        if not outside:
            return Allowed(grant.required_label, grant.forbidden_label)
    allowed = sorted(
        {f for g in candidates if g.subresource == operation.subresource for f in g.fields}
    )
    touched = sorted(set(fields))
    return Refused(
        f"{sender} may not patch {where}{kind} fields {touched} (allowed: {allowed or 'none'})",
    )
