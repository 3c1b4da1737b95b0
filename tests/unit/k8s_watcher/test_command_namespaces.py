"""COMMAND_NAMESPACES in the pure policy: a namespaced object outside the configured set is
refused whoever sends the command; cluster-scoped objects and an empty set are unaffected."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.policy import Refused, authorize, command_namespace
from nodeflow_contracts.k8s import (
    CommandOperation,
    CordonNode,
    CreateObject,
    DeleteObject,
    EvictPod,
    K8sCommand,
    ObjectRef,
    RecordEvent,
)
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_runtime.config import load_config

NAMESPACES = st.sampled_from(["slurm", "gpu-jobs", "default", "kube-system", "payments"])
POD_OPERATIONS: list[CommandOperation] = [
    DeleteObject(),
    EvictPod(),
    RecordEvent(reason="R", message="m"),
    CreateObject(object={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
]


def admin_command(target: ObjectRef, operation: CommandOperation) -> K8sCommand:
    # The admin's policy allows every operation: only the namespace limit can refuse.
    return K8sCommand(
        idempotency_key="k",
        sender=ADMIN_USER,
        sent_at=1.0,
        target=target,
        operation=operation,
    )


def pod(namespace: str) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Pod", name="p", namespace=namespace)


@given(
    namespace=NAMESPACES,
    allowed=st.frozensets(NAMESPACES, min_size=1),
    operation=st.sampled_from(POD_OPERATIONS),
)
def test_commands_outside_command_namespaces_are_refused(
    namespace: str, allowed: frozenset[str], operation: CommandOperation
) -> None:
    cmd = admin_command(pod(namespace), operation)
    verdict = authorize(cmd, cmd.subject, allowed)
    if namespace in allowed:
        assert verdict == authorize(cmd, cmd.subject)
    else:
        assert isinstance(verdict, Refused)
        assert repr(namespace) in verdict.reason


def test_a_namespace_refusal_names_the_setting_to_change() -> None:
    """The sender only sees `forbidden`: the reason tells the operator what to change."""
    cmd = admin_command(pod("default"), POD_OPERATIONS[0])
    verdict = authorize(cmd, cmd.subject, {"slurm", "skyhook"})
    assert isinstance(verdict, Refused)
    assert "COMMAND_NAMESPACES=skyhook,slurm" in verdict.reason
    assert "k8sWatcher.commandNamespaces" in verdict.reason
    assert "empty" in verdict.reason


@given(allowed=st.frozensets(NAMESPACES))
def test_command_namespaces_leave_cluster_scoped_nodes_alone(allowed: frozenset[str]) -> None:
    cmd = admin_command(ObjectRef(api_version="v1", kind="Node", name="n1"), CordonNode())
    assert command_namespace(cmd) is None
    assert authorize(cmd, cmd.subject, allowed) == authorize(cmd, cmd.subject)


def test_command_namespaces_judge_a_create_where_its_object_is_written() -> None:
    smuggled = CreateObject(
        object={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"}}
    )
    cmd = admin_command(pod("slurm"), smuggled)
    assert command_namespace(cmd) == "x"
    assert isinstance(authorize(cmd, cmd.subject, {"slurm"}), Refused)
    defaulted = CreateObject(object={"apiVersion": "v1", "kind": "Pod", "metadata": {}})
    bare = admin_command(ObjectRef(api_version="v1", kind="Pod", name="p"), defaulted)
    assert command_namespace(bare) == "default"  # where commands.py would create it


def test_command_namespaces_setting_is_a_comma_list_empty_meaning_all() -> None:
    assert load_config(K8sWatcherConfig, {}).command_namespaces == ()
    config = load_config(K8sWatcherConfig, {"COMMAND_NAMESPACES": "slurm, gpu-jobs"})
    assert config.command_namespaces == ("slurm", "gpu-jobs")
