"""k8s-watcher as a process on the real API server, authenticated as its own ServiceAccount
with exactly the RBAC of k8s/rbac, on a real nats-server with per-service users: it mirrors
pods, nodes and NodeSets into KV and applies create, patch and delete commands, so that RBAC
is enough for everything it does; a verb it does not hold is refused and never reported as a
success."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import pytest
from kubernetes_asyncio import client

from k8s_watcher.kinds import (
    CREATABLE_KINDS,
    DELETABLE_KINDS,
    KNOWN_KINDS,
    PATCHABLE_KINDS,
    SKYHOOK_NAMESPACE_KINDS,
    STATUS_PATCHABLE_KINDS,
)
from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import (
    CommandOperation,
    CommandOutcome,
    CreateObject,
    DeleteObject,
    K8sCommand,
    ObjectRef,
    PatchObject,
)
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS, WATCHED_KINDS
from nodeflow_runtime.natsd import (
    NatsServerProcess,
    free_port,
    generate_users,
    user_credentials,
    write_password_files,
)
from nodeset_controller.commands import to_outgoing
from nodeset_controller.history import CreateRevision, DeleteRevision, revision_name
from nodeset_controller.podspec import revision_hash
from nodeset_controller.spec import Defaults, parse
from tests.e2e.processes import TEST_TIMINGS, stop_processes, wait_ready
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.realkube.support import STEP_TIMEOUT, api_client, kubectl, until
from tests.realkube.watcher_identity import watcher_kubeconfig

pytestmark = pytest.mark.real_kube

NODESET = {
    "apiVersion": "nodeflow.dev/v1alpha1",
    "kind": "NodeSet",
    "metadata": {"name": "mirrored"},
    "spec": {
        "replicas": 0,
        "slurmCluster": "sim",
        "template": {
            "metadata": {"labels": {"nodeflow.dev/nodeset": "mirrored"}},
            "spec": {"containers": [{"name": "slurmd", "image": "busybox"}]},
        },
    },
}


def pod_body(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


@dataclass
class RunningWatcher:
    bus: Bus
    namespace: str
    kubeconfig: Path
    outcomes: list[CommandOutcome]

    async def kv_get(self, kind: str, key: str) -> dict[str, Any] | None:
        kv = await self.bus.js.key_value(subjects.k8s_bucket(kind))
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        value: dict[str, Any] | None = msgspec.json.decode(entry.value) if entry.value else None
        return value

    async def send(self, target: ObjectRef, operation: CommandOperation) -> K8sCommand:
        cmd = K8sCommand(
            idempotency_key=uuid.uuid4().hex,
            sender=ADMIN_USER,
            sent_at=time.time(),
            target=target,
            operation=operation,
            reason="realkube test",
        )
        await self.bus.publish(cmd.subject, cmd, msg_id=cmd.idempotency_key)
        return cmd

    async def final_outcome(self, cmd: K8sCommand) -> CommandOutcome:
        async def final() -> CommandOutcome | None:
            return next(
                (
                    o
                    for o in self.outcomes
                    if o.idempotency_key == cmd.idempotency_key and o.outcome != "retrying"
                ),
                None,
            )

        outcome: CommandOutcome = await until(final, f"an outcome of {cmd.op}")
        return outcome


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"rk-watcher-{uuid.uuid4().hex[:8]}"
    await kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        await kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
async def running_watcher(tmp_path: Path, namespace: str) -> AsyncIterator[RunningWatcher]:
    """`python -m k8s_watcher` as its ServiceAccount, on a nats-server with authorization on;
    the test's own bus is the admin's, with every outcome collected."""
    kubeconfig = await watcher_kubeconfig(tmp_path)
    users = generate_users()
    passwords = write_password_files(tmp_path / "credentials", users)
    server = NatsServerProcess(tmp_path / "nats", users=users)
    await server.start()
    process = None
    bus: Bus | None = None
    log_file = tmp_path / "k8s-watcher.log"
    try:
        bus = await Bus.connect(
            server.url,
            credentials=user_credentials(users, ADMIN_USER),
            options=TEST_BUS_OPTIONS,
        )
        await ensure_topology(
            bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["k8s-watcher"]
        )
        outcomes: list[CommandOutcome] = []

        async def collect(msg: Any) -> None:
            outcomes.append(msgspec.json.decode(msg.data, type=CommandOutcome))

        await bus.js.subscribe(subjects.K8S_OUTCOMES, cb=collect, ordered_consumer=True)
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("NATS_")},
            "NATS_URL": server.url,
            "NATS_USER": "k8s-watcher",
            "NATS_PASSWORD_FILE": str(passwords["k8s-watcher"]),
            "KUBECONFIG": str(kubeconfig),
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": str(port),
            "INSTANCE_ID": "realkube",
            **TEST_TIMINGS,
            "LOG_LEVEL": "info",
        }
        with log_file.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "k8s_watcher", env=env, stdout=log, stderr=log
            )
        try:
            # Ready once every kind's first list is done: all of them, as its ServiceAccount.
            await wait_ready(port, "k8s-watcher", timeout=STEP_TIMEOUT)
        except AssertionError:
            raise AssertionError(log_file.read_text(errors="replace")[-4000:]) from None
        yield RunningWatcher(bus=bus, namespace=namespace, kubeconfig=kubeconfig, outcomes=outcomes)
        # Its RBAC was enough for every list and watch: the API server refused it nothing.
        assert "Forbidden" not in log_file.read_text(errors="replace")
    finally:
        await stop_processes(process)
        if bus is not None:
            await bus.close()
        await server.kill()


async def test_k8s_watcher_as_its_service_account_mirrors_pods_nodes_and_nodesets(
    running_watcher: RunningWatcher,
) -> None:
    ns = running_watcher.namespace
    await kubectl("-n", ns, "create", "-f", "-", stdin=msgspec.json.encode(NODESET).decode())
    await kubectl(
        "-n", ns, "create", "-f", "-", stdin=msgspec.json.encode(pod_body("seen", ns)).decode()
    )
    _, node_names, _ = await kubectl("get", "nodes", "-o", "name")
    node = node_names.split()[0].removeprefix("node/")

    async def mirrored() -> bool:
        return all(
            [
                await running_watcher.kv_get("NodeSet", subjects.object_key(ns, "mirrored")),
                await running_watcher.kv_get("Pod", subjects.object_key(ns, "seen")),
                await running_watcher.kv_get("Node", subjects.object_key(None, node)),
            ]
        )

    await until(mirrored, "the NodeSet, the Pod and a Node in KV")
    nodeset = await running_watcher.kv_get("NodeSet", subjects.object_key(ns, "mirrored"))
    assert nodeset is not None
    assert nodeset["spec"]["slurmCluster"] == "sim"


async def test_k8s_watcher_as_its_service_account_creates_patches_and_deletes_a_pod(
    running_watcher: RunningWatcher,
) -> None:
    ns = running_watcher.namespace
    target = ObjectRef(api_version="v1", kind="Pod", name="commanded", namespace=ns)
    created = await running_watcher.send(target, CreateObject(object=pod_body("commanded", ns)))
    assert (await running_watcher.final_outcome(created)).outcome == "applied"
    patched = await running_watcher.send(
        target,
        PatchObject(patch_type="merge", patch={"metadata": {"labels": {"patched": "yes"}}}),
    )
    assert (await running_watcher.final_outcome(patched)).outcome == "applied"
    _, label, _ = await kubectl(
        "-n", ns, "get", "pod", "commanded", "-o", "jsonpath={.metadata.labels.patched}"
    )
    assert label == "yes"

    deleted = await running_watcher.send(target, DeleteObject(grace_period_seconds=0))
    assert (await running_watcher.final_outcome(deleted)).outcome == "applied"

    async def gone() -> bool:
        code, _, _ = await kubectl("-n", ns, "get", "pod", "commanded", check=False)
        return code != 0

    await until(gone, "the commanded pod deleted")


async def test_a_verb_k8s_watcher_does_not_hold_is_refused_and_never_reported_applied(
    running_watcher: RunningWatcher,
) -> None:
    ns = running_watcher.namespace
    # Through NATS: a command to delete a Namespace is not applied, whatever the sender.
    cmd = await running_watcher.send(
        ObjectRef(api_version="v1", kind="Namespace", name=ns), DeleteObject()
    )
    outcome = await running_watcher.final_outcome(cmd)
    assert outcome.outcome not in ("applied", "already-applied")
    _, phase, _ = await kubectl("get", "namespace", ns, "-o", "jsonpath={.status.phase}")
    assert phase == "Active"
    # With k8s-watcher's own credentials, the API server itself refuses such verbs: the
    # local refusal above is not the only thing standing between it and them.
    as_watcher = running_watcher.kubeconfig
    for refused in (
        ("delete", "namespace", ns),
        ("create", "clusterrole", "escalate", "--verb=*", "--resource=*"),
        ("-n", ns, "create", "secret", "generic", "stolen", "--from-literal=a=b"),
        ("-n", ns, "create", "serviceaccount", "sneaky"),
        # ConfigMaps only in the Skyhook namespace (a Skyhook package pod's), never elsewhere.
        ("-n", ns, "create", "configmap", "sneaky", "--from-literal=a=b"),
        ("-n", "kube-system", "get", "configmaps"),
    ):
        code, _, err = await kubectl(*refused, kubeconfig=as_watcher, check=False)
        assert code != 0
        # RBAC's refusal (403), not some other error.
        assert 'User "system:serviceaccount:nodeflow-system:k8s-watcher" cannot' in err, err


def granted_verbs() -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every request k8s-watcher's code may make: list and watch
    of each kind it mirrors, and the writes its commands may carry (kinds.py)."""
    wanted: set[tuple[str, str, str]] = set()
    mirrored = {(watched.group, watched.kind) for watched in WATCHED_KINDS}
    for info in KNOWN_KINDS:
        # Events and Leases are written, never mirrored: no list or watch.
        if (info.group, info.kind) in mirrored:
            wanted |= {("list", info.group, info.plural), ("watch", info.group, info.plural)}
        if info.read_only:  # never written (a kind name another group serves writable)
            continue
        if info.kind in CREATABLE_KINDS:
            wanted.add(("create", info.group, info.plural))
        if info.kind in DELETABLE_KINDS:
            wanted.add(("delete", info.group, info.plural))
        if info.kind in PATCHABLE_KINDS:
            wanted.add(("patch", info.group, info.plural))
        if info.kind in STATUS_PATCHABLE_KINDS:
            wanted.add(("patch", info.group, f"{info.plural}/status"))
    wanted |= {
        ("get", "", "pods"),  # a create answered AlreadyExists: was it ours?
        ("create", "", "pods/eviction"),
        ("create", "", "pods/binding"),
    }
    return wanted


async def test_rbac_of_k8s_rbac_grants_every_request_k8s_watchers_code_makes(
    tmp_path: Path,
) -> None:
    """A SelfSubjectAccessReview per request kind, as k8s-watcher's ServiceAccount."""
    kubeconfig = await watcher_kubeconfig(tmp_path)
    async with api_client(kubeconfig) as api:
        authorization = client.AuthorizationV1Api(api)

        async def allowed(verb: str, group: str, resource: str, namespace: str = "default") -> bool:
            plural, _, subresource = resource.partition("/")
            review = await authorization.create_self_subject_access_review(
                client.V1SelfSubjectAccessReview(
                    spec=client.V1SelfSubjectAccessReviewSpec(
                        resource_attributes=client.V1ResourceAttributes(
                            verb=verb,
                            group=group,
                            resource=plural,
                            subresource=subresource,
                            namespace=namespace,
                        )
                    )
                )
            )
            return bool(review.status.allowed)

        # The kinds k8s-watcher reads and writes in the Skyhook namespace only (its ConfigMaps)
        # are asked there, and must be refused anywhere else.
        skyhook_only = {
            (info.group, info.plural)
            for info in KNOWN_KINDS
            if info.kind in SKYHOOK_NAMESPACE_KINDS
        }
        wanted = sorted(
            (verb, group, resource, DEFAULT_SKYHOOK_NAMESPACE)
            if (group, resource) in skyhook_only
            else (verb, group, resource, "default")
            for verb, group, resource in granted_verbs()
        )
        answers = await asyncio.gather(*(allowed(*request) for request in wanted))
        missing = [request for request, ok in zip(wanted, answers, strict=True) if not ok]
        assert missing == []
        assert skyhook_only
        for verb, group, resource, namespace in wanted:
            if namespace == DEFAULT_SKYHOOK_NAMESPACE:
                for elsewhere in ("default", "kube-system"):
                    assert not await allowed(verb, group, resource, elsewhere), (verb, elsewhere)
        # And no more than it needs where it matters most.
        for request in (
            ("update", "", "pods"),
            ("get", "", "secrets"),
            ("delete", "", "nodes"),
            # Volumes are only read (topology-placer's volume topology).
            ("delete", "", "persistentvolumeclaims"),
            ("patch", "", "persistentvolumes"),
            ("patch", "storage.k8s.io", "storageclasses"),
            ("create", "rbac.authorization.k8s.io", "clusterroles"),
        ):
            assert not await allowed(*request), request


async def test_k8s_watcher_mirrors_nodeset_revisions_and_applies_their_commands(
    running_watcher: RunningWatcher,
) -> None:
    """Rule 7e's writes on the real API server, as nodeset-controller builds them
    (nodeset_controller.commands): a NodeSet's ControllerRevision is created, and on a
    rollback deleted (uid and resourceVersion preconditions) and made again as the newest;
    k8s-watcher mirrors only ControllerRevisions labelled with a NodeSet. Why not a patch of
    its `revision`, as Kubernetes' controllers update it: kube-apiserver refuses any change of
    a revision whose stored `data` bytes are not its own encoding (k8s-watcher's client
    writes JSON with spaces), as `data` would change."""
    ns = running_watcher.namespace
    await kubectl("-n", ns, "create", "-f", "-", stdin=msgspec.json.encode(NODESET).decode())
    _, raw, _ = await kubectl("-n", ns, "get", "nodeset", "mirrored", "-o", "json")
    spec = parse(msgspec.json.decode(raw), Defaults())
    hash_ = revision_hash(spec.template_spec)
    name = revision_name(spec.name, hash_)
    key = subjects.object_key(ns, name)
    # Another controller's revision (no NodeSet label) is not mirrored.
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": "not-a-nodeset"},
        "data": {"spec": {}},
        "revision": 1,
    }
    await kubectl("-n", ns, "create", "-f", "-", stdin=msgspec.json.encode(foreign).decode())

    async def create(number: int) -> dict[str, Any]:
        command = to_outgoing(spec, CreateRevision(name, hash_, number, "t"), 0.0).command
        sent = await running_watcher.send(command.target, command.operation)
        assert (await running_watcher.final_outcome(sent)).outcome == "applied"

        async def mirrored() -> dict[str, Any] | None:
            found = await running_watcher.kv_get("ControllerRevision", key)
            return found if found is not None and found.get("revision") == number else None

        stored: dict[str, Any] = await until(mirrored, f"revision {number} in KV")
        return stored

    stored = await create(1)
    assert (
        await running_watcher.kv_get("ControllerRevision", subjects.object_key(ns, "not-a-nodeset"))
        is None
    )
    assert stored["data"]["spec"]["template"] == spec.template
    assert stored["metadata"]["ownerReferences"][0]["uid"] == spec.uid
    assert stored["metadata"]["labels"]["controller-revision-hash"] == hash_

    # kube-apiserver refuses to raise its `revision` by a patch: `data` would change.
    code, _, err = await kubectl(
        "-n", ns, "patch", "controllerrevision", name, "--type=merge", "-p", '{"revision": 3}',
        check=False,
    )  # fmt: skip
    assert code != 0 and "immutable" in err, err

    # The rollback: deleted with its uid and resourceVersion, then made again as revision 3.
    meta = stored["metadata"]
    delete = to_outgoing(
        spec, DeleteRevision(name, meta["uid"], meta["resourceVersion"], "t"), 0.0
    ).command
    deleted = await running_watcher.send(delete.target, delete.operation)
    assert (await running_watcher.final_outcome(deleted)).outcome == "applied"

    async def gone() -> bool:
        return await running_watcher.kv_get("ControllerRevision", key) is None

    await until(gone, "the revision gone from KV")
    remade = await create(3)
    assert remade["metadata"]["uid"] != meta["uid"]
