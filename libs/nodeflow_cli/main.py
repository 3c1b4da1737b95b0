"""`kubectl nodeflow`: why an object is where it is, the decisions, the dead letters (`dlq
list|show|replay`, `dead-letters` = `dlq list`), and a NodeSet's rollout history and rollback
(`rollout history|undo nodeset NAME`), `release-claim NODE` (a deleted NodeSet's node claim,
removed when safe), and `doctor`: what Nodeflow needs, checked.

kubectl runs `kubectl-nodeflow` from the PATH as `kubectl nodeflow ...` (a plugin). It reads
the Kubernetes API through the kubeconfig (`--kubeconfig`, else `KUBECONFIG`, else
`~/.kube/config`) and NATS through `--nats URL` (else `NATS_URL`) with the operators'
credentials from the environment (`NATS_USER` + `NATS_PASSWORD[_FILE]`, `NATS_TOKEN[_FILE]`,
`NATS_CREDS_FILE`, as every service reads them). Without a NATS URL, the commands port-forward
by themselves to the Service `nats` (nodeflow_cli.portforward) as the operators' user of the
admin Secret; with no such Service either, `why` answers from Kubernetes alone and says so,
`decisions` and `dlq` need one, `doctor` skips its NATS checks. The verdicts, the dead
letters' formats and replay plan, and doctor's checks are pure (nodeflow_cli.verdicts,
nodeflow_cli.dlq, nodeflow_cli.doctor); this module only fetches what they read and does what
a replay plans.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import msgspec
import structlog
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from nats.errors import Error as NatsError
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from nodeflow_bus import Bus, BusOptions, Credentials, NatsTls, Secret
from nodeflow_bus.errors import PublishError
from nodeflow_bus.kube_lease import DEFAULT_LEASE_NAMESPACE
from nodeflow_cli import (
    claims,
    dlq,
    doctor,
    portforward,
    rollout,
    skyhook,
    skyhook_status,
    verdicts,
)
from nodeflow_cli.verdicts import Decision, Obj
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import SERVICES, lease_names
from nodeflow_contracts.pod_protocol import NODESET_LABEL, SLURM_CLUSTER_LABEL
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK, SkyhookNames, flavor_by_kind
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import (
    ADMIN_USER,
    SLURM_CLUSTERS_BUCKET,
    SLURM_NODES_BUCKET,
    STREAMS,
)
from nodeset_controller import migrate

# Where each `why` kind lives in the API.
KINDS: dict[str, tuple[str, str]] = {
    # kind: (collection path with {ns}, the Kind decisions name it by)
    "pod": ("/api/v1/namespaces/{ns}/pods", "Pod"),
    "nodeset": ("/apis/nodeflow.dev/v1alpha1/namespaces/{ns}/nodesets", "NodeSet"),
    "gang": ("/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/podgroups", "PodGroup"),
    "nodemaintenance": (
        "/apis/maintenance.nvidia.com/v1alpha1/namespaces/{ns}/nodemaintenances",
        "NodeMaintenance",
    ),
    "skyhook": (SKYHOOK.collection_path, SKYHOOK.kind),
    "nodewright": (NODEWRIGHT.collection_path, NODEWRIGHT.kind),
}
# The kinds `why` reads cluster-wide (no namespace).
CLUSTER_SCOPED_KINDS = ("skyhook", "nodewright")
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """Something the user must fix (an object not found, NATS unreachable): printed, exit 1."""


class NatsNotGiven(CliError):
    """No --nats, no NATS_URL, and no Service `nats` to port-forward to."""


class ApiStatusError(CliError):
    """The API server answered with an error status (403: the caller may not read it)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- Kubernetes -----------------------------------------------------------------------------


class Kube:
    def __init__(self, api: k8s_client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: str, context: str) -> Kube:
        configuration = k8s_client.Configuration()
        await k8s_config.load_kube_config(
            config_file=kubeconfig or None,
            context=context or None,
            client_configuration=configuration,
        )
        return cls(k8s_client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def get(self, path: str) -> Obj | None:
        """The object at `path`, None when the API server answers 404."""
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
                path,
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=15,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CliError(f"the Kubernetes API did not answer GET {path}: {exc}") from exc
        try:
            raw = await response.read()
        finally:
            response.release()
        if response.status == 404:
            return None
        if response.status >= 400:
            raise ApiStatusError(
                f"GET {path}: HTTP {response.status}: {raw.decode(errors='replace')}",
                response.status,
            )
        found: Obj = msgspec.json.decode(raw)
        return found

    async def patch(self, path: str, body: Any, content_type: str) -> Obj:
        """PATCH `path` with `body` (of `content_type`); the object as patched."""
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
                path,
                "PATCH",
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=15,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CliError(f"the Kubernetes API did not answer PATCH {path}: {exc}") from exc
        try:
            raw = await response.read()
        finally:
            response.release()
        if response.status >= 400:
            raise ApiStatusError(
                f"PATCH {path}: HTTP {response.status}: {raw.decode(errors='replace')}",
                response.status,
            )
        found: Obj = msgspec.json.decode(raw)
        return found

    async def stream_text(self, path: str, *, follow: bool = False) -> AsyncIterator[bytes]:
        """The body at `path` (a pod's log) as it comes; with `follow` no timeout, so a
        followed log streams until the container ends or the user stops it."""
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
                path,
                "GET",
                header_params={"Accept": "*/*"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=None if follow else 15,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CliError(f"the Kubernetes API did not answer GET {path}: {exc}") from exc
        try:
            if response.status >= 400:
                raw = await response.read()
                raise ApiStatusError(
                    f"GET {path}: HTTP {response.status}: {raw.decode(errors='replace')}",
                    response.status,
                )
            async for chunk in response.content.iter_any():
                yield chunk
        finally:
            response.release()


# --- NATS -----------------------------------------------------------------------------------


async def connect_nats(
    url: str, credentials: Credentials | None = None, tls: NatsTls | None = None
) -> Bus:
    try:
        return await Bus.connect(
            [part for part in url.split(",") if part],
            credentials=credentials or Credentials.from_env(),
            options=BusOptions(name="kubectl-nodeflow", initial_connect_deadline=5.0),
            tls=tls,
        )
    except Exception as exc:
        raise CliError(f"NATS at {url} not reached: {type(exc).__name__}: {exc}") from exc


# Without --nats: the chart's Service `nats` (its port `client`) in the services' namespace,
# reached through the CLI's own port-forward, as the operators' user with the password of the
# admin Secret the chart generates (charts/nodeflow/templates/nats-credentials.yaml).
NATS_SERVICE = "nats"
NATS_CLIENT_PORT = "client"
ADMIN_SECRET = f"{ADMIN_USER}-nats"
ADMIN_SECRET_KEY = "password"
NO_NATS_HINT = "give --nats URL (or NATS_URL)"


def nats_tls_from_env() -> NatsTls:
    """Client TLS as the services read it (NATS_TLS_CA_FILE, NATS_TLS_CERT_FILE,
    NATS_TLS_KEY_FILE, NATS_TLS_SERVER_NAME)."""
    return NatsTls.from_paths(
        ca_file=os.environ.get("NATS_TLS_CA_FILE", ""),
        cert_file=os.environ.get("NATS_TLS_CERT_FILE", ""),
        key_file=os.environ.get("NATS_TLS_KEY_FILE", ""),
        server_name=os.environ.get("NATS_TLS_SERVER_NAME", ""),
    )


async def start_nats_forward(kube: Kube, namespace: str) -> portforward.PortForward:
    """The port-forward to a Ready pod behind the Service `nats` (its `client` port)."""
    ns = quote(namespace, safe="")
    service = await kube.get(f"/api/v1/namespaces/{ns}/services/{NATS_SERVICE}")
    if service is None:
        raise NatsNotGiven(
            f"NATS not given (--nats URL or NATS_URL) and no Service {NATS_SERVICE} in "
            f"namespace {namespace} (--system-namespace) to port-forward to"
        )
    selector = portforward.selector_query(service)
    if not selector:
        raise CliError(f"Service {namespace}/{NATS_SERVICE} selects no pods: {NO_NATS_HINT}")
    listed = await kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(selector)}")
    pod = portforward.ready_pod((listed or {}).get("items") or [])
    if pod is None:
        raise CliError(
            f"no Ready pod behind Service {namespace}/{NATS_SERVICE} ({selector}) to "
            f"port-forward to: {NO_NATS_HINT}"
        )
    try:
        port = portforward.target_port(service, pod, NATS_CLIENT_PORT)
    except portforward.ForwardError as exc:
        raise CliError(f"{exc}: {NO_NATS_HINT}") from exc
    name = pod["metadata"]["name"]
    headers: dict[str, str] = {}
    # The kubeconfig's bearer token, as every other request carries it; its client
    # certificate and CA are in the session's TLS context.
    await kube.api.update_params_for_auth(headers, [], ["BearerToken"])
    api_server: str = kube.api.configuration.host or ""
    forward = portforward.PortForward(
        session=kube.api.rest_client.pool_manager,
        url=portforward.websocket_url(
            api_server, portforward.port_forward_path(namespace, name, port)
        ),
        headers=headers,
        port=port,
        pod=f"{namespace}/{name}",
    )
    await forward.start()
    return forward


async def server_info(forward: portforward.PortForward, local_port: int) -> Obj:
    """The NATS server's INFO, read through the forward: whether it requires TLS, and a
    clear error naming the pod and port when nothing answers behind them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", local_port)
    try:
        line = await asyncio.wait_for(reader.readline(), timeout=15)
    except TimeoutError:
        line = b""
    finally:
        writer.close()
    if not line.startswith(b"INFO "):
        why = "; ".join(forward.errors) or (
            f"no NATS INFO came back ({line[:80]!r})" if line else "the connection closed"
        )
        raise CliError(f"port-forward to {forward.what} (Service {NATS_SERVICE}) failed: {why}")
    try:
        info: Obj = json.loads(line[5:])
    except ValueError as exc:
        raise CliError(f"port-forward to {forward.what}: NATS sent a bad INFO: {exc}") from exc
    return info


async def admin_credentials(kube: Kube, namespace: str) -> Credentials:
    """The operators' user with the password of the chart's admin Secret."""
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets/{ADMIN_SECRET}"
    try:
        secret = await kube.get(path)
    except ApiStatusError as exc:
        raise CliError(
            f"the NATS password of {ADMIN_USER} is not readable (Secret {namespace}/"
            f"{ADMIN_SECRET}: HTTP {exc.status}): set NATS_USER and NATS_PASSWORD[_FILE]"
        ) from exc
    encoded = ((secret or {}).get("data") or {}).get(ADMIN_SECRET_KEY)
    if not encoded:
        raise CliError(
            f"no Secret {namespace}/{ADMIN_SECRET} with a key {ADMIN_SECRET_KEY} (the "
            f"{ADMIN_USER} password the chart generates): set NATS_USER and "
            "NATS_PASSWORD[_FILE]"
        )
    try:
        password = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise CliError(
            f"Secret {namespace}/{ADMIN_SECRET}: {ADMIN_SECRET_KEY} is not base64"
        ) from exc
    return Credentials(user=ADMIN_USER, password=Secret(password))


@contextlib.asynccontextmanager
async def open_nats(args: argparse.Namespace) -> AsyncIterator[Bus]:
    """NATS at --nats; without it, through the CLI's own port-forward to the Service `nats`
    of the services' namespace, as the environment's NATS user or else the operators' user
    of the admin Secret. The forward lives as long as the connection."""
    if args.nats:
        bus = await connect_nats(args.nats)
        try:
            yield bus
        finally:
            await bus.close()
        return
    namespace = args.system_namespace
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        forward = await start_nats_forward(kube, namespace)
        try:
            assert forward.local_port is not None
            info = await server_info(forward, forward.local_port)
            tls = nats_tls_from_env()
            if info.get("tls_required") and not (tls.configured and tls.server_name):
                raise CliError(
                    f"NATS behind {forward.what} requires TLS (the chart's nats.tls.enabled): "
                    "set NATS_TLS_CA_FILE to the CA of its certificate (ca.crt of the Secret "
                    f"nats.tls.secretName) and NATS_TLS_SERVER_NAME to a name the certificate "
                    f"carries (e.g. {NATS_SERVICE}.{namespace}.svc); the forward reaches it as "
                    "127.0.0.1"
                )
            scheme = "tls" if info.get("tls_required") else "nats"
            env_credentials = Credentials.from_env()
            credentials = (
                env_credentials
                if env_credentials.kind != "none"
                else await admin_credentials(kube, namespace)
            )
            try:
                bus = await connect_nats(
                    f"{scheme}://127.0.0.1:{forward.local_port}", credentials, tls
                )
            except CliError as exc:
                raise CliError(
                    f"{exc} (through the port-forward to {forward.what}"
                    + (f": {'; '.join(forward.errors)})" if forward.errors else ")")
                ) from exc
            try:
                yield bus
            finally:
                await bus.close()
        finally:
            await forward.close()
    finally:
        await kube.close()


async def stream_messages(
    bus: Bus,
    filters: Sequence[str],
    *,
    follow: bool,
    idle: float = 1.0,
    stream: str | None = None,
) -> AsyncIterator[Any]:
    """Every stored message on `filters` (one ordered consumer each, oldest first per
    filter), then with `follow` the new ones as they come. Without it the read ends once
    each consumer has nothing pending (or has been idle for `idle` seconds). `stream` named:
    no lookup of the stream by subject (an API a service's NATS user may not call)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    caught_up: set[int] = set()
    subscriptions = []
    for index, subject in enumerate(filters):

        async def on_message(msg: Any, index: int = index) -> None:
            await queue.put(msg)
            if msg.metadata.num_pending == 0:
                caught_up.add(index)

        subscriptions.append(
            await bus.js.subscribe(
                subject,
                stream=stream,
                cb=on_message,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
        )
    try:
        while True:
            try:
                msg = await asyncio.wait_for(queue.get(), timeout=idle)
            except TimeoutError:
                if follow:
                    continue
                return
            yield msg
            if not follow and queue.empty() and len(caught_up) == len(filters):
                return
    finally:
        for subscription in subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def read_decisions(bus: Bus, *, follow: bool) -> AsyncIterator[Decision]:
    async for msg in stream_messages(bus, subjects.DECISIONS, follow=follow):
        try:
            payload = msgspec.json.decode(msg.data)
        except msgspec.DecodeError:
            continue
        if isinstance(payload, dict):
            decision = verdicts.decision_of(msg.subject, payload)
            if decision is not None:
                yield decision


async def slurm_node(bus: Bus, cluster: str, name: str) -> Obj | None:
    try:
        kv = await bus.js.key_value(SLURM_NODES_BUCKET)
        entry = await kv.get(subjects.slurm_node_key(cluster, name))
    except Exception:
        return None
    if not entry.value:
        return None
    found: Obj = msgspec.json.decode(entry.value)
    return found


# --- commands -------------------------------------------------------------------------------


async def why(args: argparse.Namespace) -> str:
    collection, kind_name = KINDS[args.kind]
    path = f"{collection.format(ns=quote(args.namespace, safe=''))}/{quote(args.name, safe='')}"
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        obj = await kube.get(path)
        if obj is None:
            where = "" if args.kind in CLUSTER_SCOPED_KINDS else f" in namespace {args.namespace}"
            raise CliError(f"{kind_name} {args.name} not found{where}")
        nodeset: Obj | None = None
        if args.kind == "pod":
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(NODESET_LABEL):
                nodeset = await kube.get(
                    f"{KINDS['nodeset'][0].format(ns=quote(args.namespace, safe=''))}/"
                    f"{quote(labels[NODESET_LABEL], safe='')}"
                )
    finally:
        await kube.close()
    decisions: list[Decision] = []
    slurm: Obj | None = None
    cluster = ""
    note = ""
    try:
        async with open_nats(args) as bus:
            decisions = [d async for d in read_decisions(bus, follow=False)]
            if args.kind == "pod":
                labels = (obj.get("metadata") or {}).get("labels") or {}
                cluster = labels.get(SLURM_CLUSTER_LABEL) or str(
                    ((nodeset or {}).get("spec") or {}).get("slurmCluster") or ""
                )
                if cluster:
                    slurm = await slurm_node(bus, cluster, args.name)
    except NatsNotGiven as exc:
        note = f"\n({exc}; decisions and Slurm state not read)"
    if args.kind == "nodemaintenance":
        about = verdicts.decisions_about(decisions, f"NodeMaintenance {args.namespace}/{args.name}")
        return verdicts.why_nodemaintenance(obj, about) + note
    if args.kind == "nodeset":
        about = verdicts.decisions_about(decisions, f"NodeSet {args.namespace}/{args.name}")
        return verdicts.why_nodeset(obj, about) + note
    if args.kind == "gang":
        about = verdicts.decisions_about(decisions, f"PodGroup {args.namespace}/{args.name}")
        return verdicts.why_gang(obj, about) + note
    if args.kind in CLUSTER_SCOPED_KINDS:
        # Both kinds' decisions go to maintenance.v1.skyhook.<name>.decision; each says
        # which kind it is about.
        about = verdicts.decisions_about(decisions, f"{kind_name} {args.name}")
        return verdicts.why_skyhook(obj, about) + note
    labels = (obj.get("metadata") or {}).get("labels") or {}
    about = verdicts.decisions_about(
        decisions, f"NodeSet {args.namespace}/{labels.get(NODESET_LABEL, '')}"
    )
    return verdicts.why_pod(obj, slurm, cluster, [d for d in about if d.pod == args.name]) + note


async def decisions(args: argparse.Namespace) -> None:
    async with open_nats(args) as bus:
        async for decision in read_decisions(bus, follow=args.follow):
            if verdicts.decision_matches(decision, service=args.service, about=args.object):
                print(verdicts.format_decision(decision), flush=True)


def _dead_letter_of(msg: Any) -> dlq.DeadLetter:
    """A delivered message of DEAD_LETTERS (an ordered consumer's)."""
    return dlq.DeadLetter(
        sequence=msg.metadata.sequence.stream,
        time=msg.metadata.timestamp,
        subject=msg.subject,
        headers=dict(msg.headers or {}),
        data=msg.data,
    )


async def read_dead_letters(bus: Bus, subject: str) -> AsyncIterator[dlq.DeadLetter]:
    """Every dead letter of `subject` (`--subject`: empty for all), oldest first."""
    filters = (dlq.subject_filter(subject),)
    try:
        async for msg in stream_messages(bus, filters, follow=False, stream=dlq.STREAM):
            yield _dead_letter_of(msg)
    except (NatsError, TimeoutError) as exc:
        raise CliError(
            f"dead letters not read from {dlq.STREAM}: {type(exc).__name__}: {exc}"
        ) from exc


async def get_dead_letter(bus: Bus, sequence: int) -> dlq.DeadLetter | None:
    """The dead letter at `sequence` of DEAD_LETTERS; None when there is none (never was,
    replayed, or aged out)."""
    try:
        raw = await bus.js.get_msg(dlq.STREAM, seq=sequence)
    except NotFoundError:
        return None
    except Exception as exc:
        raise CliError(f"dead letter {sequence} not read from {dlq.STREAM}: {exc}") from exc
    return dlq.DeadLetter(
        sequence=sequence,
        time=raw.time,
        subject=raw.subject or "",
        headers=dict(raw.headers or {}),
        data=raw.data or b"",
    )


async def dlq_list(args: argparse.Namespace) -> None:
    shown: collections.deque[dlq.DeadLetter] = collections.deque(
        maxlen=args.limit if args.limit > 0 else None
    )
    count = 0
    async with open_nats(args) as bus:
        async for letter in read_dead_letters(bus, args.subject):
            shown.append(letter)
            count += 1
    for line in dlq.format_list(list(shown)):
        print(line)
    newest = f" (the newest {len(shown)} shown)" if len(shown) < count else ""
    print(f"{count} dead letters{newest}")


async def dlq_show(args: argparse.Namespace) -> None:
    async with open_nats(args) as bus:
        letter = await get_dead_letter(bus, args.sequence)
    if letter is None:
        raise CliError(f"no dead letter {args.sequence} in {dlq.STREAM}")
    print(dlq.format_show(letter))


# Who may replay: publishing to any service's subject and deleting from DEAD_LETTERS are
# the operators' user's rights; no service's NATS user has them (nodeflow_contracts.permissions).
PERMISSION_HINT = (
    f"replay publishes to the original subject and deletes from {dlq.STREAM}: run it with "
    f"the operators' NATS user ({ADMIN_USER}); a service's user may do neither"
)


async def replay_one(bus: Bus, sequence: int, *, dry_run: bool) -> tuple[bool, str]:
    """Replay the dead letter at `sequence`: (done, the line that reports it). The dead
    letter is deleted only once the publish is acknowledged."""
    letter = await get_dead_letter(bus, sequence)
    if letter is None:
        return False, f"{sequence}: no such dead letter in {dlq.STREAM} (replayed or removed?)"
    try:
        replay = dlq.plan_replay(letter)
    except dlq.ReplayRefused as exc:
        return False, f"{sequence} {letter.subject}: refused: {exc}"
    where = f"{sequence} {letter.subject} -> {replay.subject}"
    if dry_run:
        return True, f"{where}: would be replayed ({len(letter.data)} bytes, id {replay.msg_id})"
    try:
        ack = await bus.publish(
            replay.subject, letter.data, msg_id=replay.msg_id, headers=replay.headers
        )
    except PublishError as exc:
        return False, f"{where}: not replayed: {exc} ({PERMISSION_HINT})"
    if ack.duplicate:
        done = f"already replayed as {ack.stream} {ack.seq}, not delivered again"
    else:
        done = f"replayed as {ack.stream} {ack.seq}"
    try:
        await bus.js.delete_msg(dlq.STREAM, sequence)
    except Exception as exc:
        return False, (
            f"{where}: {done}, but the dead letter was not removed: {type(exc).__name__}: "
            f"{exc} ({PERMISSION_HINT}); replaying it again within {ack.stream}'s duplicate "
            "window does not deliver it twice"
        )
    return True, f"{where}: {done}; dead letter removed"


async def dlq_replay(args: argparse.Namespace) -> bool:
    """Every dead letter named (or with --all, each of --subject); False if any failed."""
    if args.all == bool(args.sequences):
        raise CliError("name the dead letters to replay (SEQ...) or give --all, not both")
    if args.subject and not args.all:
        raise CliError("--subject selects what --all replays; it does not go with SEQ...")
    done_count = 0
    async with open_nats(args) as bus:
        sequences = list(args.sequences)
        if args.all:
            sequences = [letter.sequence async for letter in read_dead_letters(bus, args.subject)]
        for sequence in sequences:
            done, line = await replay_one(bus, sequence, dry_run=args.dry_run)
            done_count += done
            print(line, flush=True)
    verb = "would be replayed" if args.dry_run else "replayed"
    print(f"{done_count} of {len(sequences)} dead letters {verb}")
    return done_count == len(sequences)


async def rollout_command(args: argparse.Namespace) -> str:
    """`rollout history|undo nodeset NAME`: the NodeSet's ControllerRevisions, or the patch
    that puts an earlier revision's template back (see nodeflow_cli.rollout)."""
    namespace = quote(args.namespace, safe="")
    path = f"{KINDS['nodeset'][0].format(ns=namespace)}/{quote(args.name, safe='')}"
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        nodeset = await kube.get(path)
        if nodeset is None:
            raise CliError(f"NodeSet {args.name} not found in namespace {args.namespace}")
        listed = await kube.get(
            f"{rollout.REVISIONS_PATH.format(ns=namespace)}?{rollout.revisions_query(args.name)}"
        )
        items = (listed or {}).get("items") or []
        history = rollout.owned_history(nodeset, [i for i in items if isinstance(i, dict)])
        try:
            if args.action == "history":
                return rollout.format_history(nodeset, history, args.revision)
            undo = rollout.plan_undo(nodeset, history, args.to_revision)
        except rollout.RolloutError as exc:
            raise CliError(str(exc)) from exc
        title = f"nodeset.nodeflow.dev/{args.name}"
        if undo.patch is None:
            return (
                f"{title} skipped rollback (current template already matches revision "
                f"{undo.revision})"
            )
        await kube.patch(path, undo.patch, "application/json-patch+json")
        return f"{title} rolled back to revision {undo.revision}"
    finally:
        await kube.close()


# --- release-claim --------------------------------------------------------------------------


async def release_claim_command(args: argparse.Namespace) -> str:
    """`release-claim NODE [--force]`: remove a NodeSet's claim from the node when it is safe
    (see nodeflow_cli.claims), with the node as read as the patch's precondition."""
    path = f"/api/v1/nodes/{quote(args.node, safe='')}"
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        node = await kube.get(path)
        if node is None:
            raise CliError(f"node {args.node} not found")
        claim = claims.claim_of(node)
        nodeset_exists = True
        target = claims.claiming_nodeset(claim) if claim else None
        if target is not None:
            namespace, name = (quote(part, safe="") for part in target)
            found = await kube.get(f"{KINDS['nodeset'][0].format(ns=namespace)}/{name}")
            nodeset_exists = found is not None
        listed = await kube.get(f"/api/v1/pods?labelSelector={quote(NODESET_LABEL, safe='')}")
        pods = [p for p in (listed or {}).get("items") or [] if isinstance(p, dict)]
        release = claims.plan_release(
            node,
            nodeset_exists=nodeset_exists,
            pods_on_node=claims.nodeset_pods_on(args.node, pods),
            force=args.force,
        )
        if release.refused:
            raise CliError(release.message)
        if release.warning:
            print(release.warning, file=sys.stderr)
        if release.patch is not None:
            try:
                await kube.patch(path, release.patch, "application/json-patch+json")
            except ApiStatusError as exc:
                if exc.status not in (409, 422):
                    raise
                raise CliError(
                    f"node/{args.node} not released: it changed since it was read (a new "
                    f"claim, or another write); nothing was changed, run the command again"
                ) from exc
        return release.message
    finally:
        await kube.close()


# --- Skyhook verbs --------------------------------------------------------------------------


def ask(question: str) -> bool:
    """A verb's confirmation on the terminal: only `y` or `yes` goes on (no input: no)."""
    print(f"{question} [y/N]: ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def warn(line: str) -> None:
    print(line, file=sys.stderr)


def write_out(chunk: bytes) -> None:
    """A log as it comes, byte for byte."""
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()


async def skyhook_command(args: argparse.Namespace) -> bool:
    """`skyhook|nodewright VERB ...` (nodeflow_cli.skyhook), for that group's objects."""
    names = flavor_by_kind(args.command)
    assert names is not None
    confirm = None if getattr(args, "confirm", True) else ask
    dry_run = getattr(args, "dry_run", False)
    if args.verb == "version" and args.client_only:
        return await skyhook_status.run_read_only(None, names, args, say=print, warn=warn)
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        verb = args.verb
        if skyhook_status.is_read_only(args):
            return await skyhook_status.run_read_only(kube, names, args, say=print, warn=warn)
        if verb in skyhook.LIFECYCLE:
            return await skyhook.lifecycle(
                kube, names, verb, args.name, dry_run=dry_run, confirm=confirm, say=print
            )
        if verb == "reset":
            return await skyhook.reset(
                kube,
                names,
                args.name,
                batches=not args.skip_batch_reset,
                dry_run=dry_run,
                confirm=confirm,
                say=print,
            )
        if verb == "deployment-policy":
            return await skyhook.policy_reset(
                kube, names, args.name, dry_run=dry_run, confirm=confirm, say=print
            )
        if verb == "package" and args.action == "rerun":
            return await skyhook.package_rerun(
                kube,
                names,
                args.package,
                args.owner,
                args.node,
                stage=args.stage,
                dry_run=dry_run,
                confirm=confirm,
                say=print,
            )
        if verb == "package":
            return await skyhook.package_logs(
                kube,
                names,
                args.package,
                args.owner,
                args.namespace,
                args.node,
                stage=args.stage,
                tail=args.tail,
                follow=args.follow,
                write=write_out,
                say=lambda line: print(line, flush=True),
            )
        if args.action == "reset":
            return await skyhook.node_reset(
                kube, names, args.owner, args.nodes, dry_run=dry_run, confirm=confirm, say=print
            )
        return await skyhook.node_ignore(
            kube, names, args.nodes, ignore=args.action == "ignore", dry_run=dry_run, say=print
        )
    except skyhook.VerbError as exc:
        raise CliError(str(exc)) from exc
    finally:
        await kube.close()


if TYPE_CHECKING:
    # The subcommands of one parser (generic only to the type checker).
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def add_skyhook_verbs(commands: Subcommands) -> None:
    """`skyhook VERB` and `nodewright VERB`: upstream `kubectl skyhook`'s verbs, each group
    acting on its own objects with its own keys."""
    for names in (SKYHOOK, NODEWRIGHT):
        kind, flag = names.kind, f"--{names.singular}"
        owner_flags = (flag,) if names is SKYHOOK else (flag, "--skyhook")
        group = commands.add_parser(
            names.singular,
            help=f"{kind} verbs ({names.group}) as `kubectl skyhook`'s: pause, resume, "
            "disable, enable, reset, version, package status|rerun|logs, "
            "node list|status|ignore|unignore|reset",
        )
        verbs = group.add_subparsers(dest="verb", required=True)
        _add_object_verbs(verbs, names)
        skyhook_status.add_version_verb(verbs)
        _add_package_verbs(verbs, kind, owner_flags)
        _add_node_verbs(verbs, names, owner_flags)


def _mutating(parser: argparse.ArgumentParser, *, ask_first: bool = True) -> None:
    """The flags of a verb that changes something."""
    if ask_first:
        parser.add_argument(
            "-y", "--confirm", action="store_true", help="do not ask before changing"
        )
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would change, change nothing"
    )


def _add_object_verbs(verbs: Subcommands, names: SkyhookNames) -> None:
    """pause, resume, disable, enable, reset and deployment-policy reset of one object."""
    kind = names.kind
    for verb, (attribute, value, done) in skyhook.LIFECYCLE.items():
        sub = verbs.add_parser(
            verb,
            help=f"{'set' if value else 'remove'} the {getattr(names, attribute)} "
            f"annotation ({kind} {done})",
        )
        sub.add_argument("name")
        _mutating(sub)
    reset_parser = verbs.add_parser(
        "reset",
        help=f"remove the {kind}'s state from every node (all its packages run again) "
        "and reset its batch state",
    )
    reset_parser.add_argument("name")
    reset_parser.add_argument(
        "--skip-batch-reset", action="store_true", help="keep the rollout's batch state"
    )
    _mutating(reset_parser)
    policy = verbs.add_parser("deployment-policy", aliases=["dp"], help="the rollout's batch state")
    policy.set_defaults(verb="deployment-policy")
    policy_actions = policy.add_subparsers(dest="action", required=True)
    policy_reset = policy_actions.add_parser("reset", help="the rollout starts again from batch 1")
    policy_reset.add_argument("name")
    _mutating(policy_reset)


def _add_package_verbs(verbs: Subcommands, kind: str, owner_flags: tuple[str, ...]) -> None:
    """package status, rerun and logs."""
    package = verbs.add_parser("package", help=f"one package of the {kind}: status, rerun, logs")
    package_actions = package.add_subparsers(dest="action", required=True)
    skyhook_status.add_package_status_verb(package_actions, kind, owner_flags)
    rerun = package_actions.add_parser(
        "rerun", help="remove the package's state on the nodes named, so it runs again"
    )
    logs = package_actions.add_parser("logs", help="the logs of the package's stage pods")
    for sub in (rerun, logs):
        sub.add_argument("package")
        sub.add_argument(*owner_flags, dest="owner", required=True, help=f"the {kind}")
        sub.add_argument(
            "--stage",
            choices=skyhook.STAGES,
            help="rerun: run again from this stage; logs: only this stage's pods",
        )
    rerun.add_argument(
        "--node",
        action="append",
        required=True,
        help="a node name or a regular expression (repeatable)",
    )
    _mutating(rerun)
    logs.add_argument(
        "--node", action="append", default=[], help="a node name or a regular expression"
    )
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--tail", type=int, default=None, help="the last N lines of each")
    logs.add_argument(
        "-n",
        "--namespace",
        default="skyhook",
        help="where the controller runs the stage pods (SKYHOOK_NAMESPACE; default skyhook)",
    )


def _add_node_verbs(verbs: Subcommands, names: SkyhookNames, owner_flags: tuple[str, ...]) -> None:
    """node list, status, ignore, unignore and reset."""
    kind = names.kind
    node = verbs.add_parser("node", help="nodes: list, status, ignore, unignore, reset")
    node_actions = node.add_subparsers(dest="action", required=True)
    skyhook_status.add_node_read_verbs(node_actions, kind, owner_flags)
    for action, about in (
        ("ignore", f"set the {names.ignore_label} label: nothing runs there"),
        ("unignore", f"remove the {names.ignore_label} label"),
        ("reset", f"remove the {kind}'s state from the nodes: all its packages run again"),
    ):
        sub = node_actions.add_parser(action, help=about)
        sub.add_argument("nodes", nargs="+", metavar="NODE", help="a name or a regex")
        if action == "reset":
            sub.add_argument(*owner_flags, dest="owner", required=True, help=f"the {kind}")
        _mutating(sub, ask_first=action == "reset")


# --- doctor ---------------------------------------------------------------------------------


async def list_items(kube: Kube, path: str) -> list[Obj] | None:
    """The items of the list at `path`; None when the API server does not serve it (404)."""
    listed = await kube.get(path)
    if listed is None:
        return None
    return [item for item in listed.get("items") or [] if isinstance(item, dict)]


async def read_list(kube: Kube, path: str, what: str) -> tuple[list[Obj] | None, str]:
    """The list at `path` (None: not served) and, when the caller may not list it, why: each
    check it feeds then says SKIP with that reason instead of stopping doctor."""
    try:
        items = await list_items(kube, path)
    except ApiStatusError as exc:
        if exc.status not in (401, 403):
            raise
        return None, f"{what} not read: the caller may not list them (HTTP {exc.status})"
    return items, ""


async def nats_facts(bus: Bus) -> doctor.NatsFacts:
    """The server NATS connected to, its JetStream account, each declared stream's leader."""
    info: dict[str, Any] = getattr(bus.nc, "_server_info", None) or {}
    server = str(bus.nc.connected_url.netloc if bus.nc.connected_url else "")
    version, cluster = str(info.get("version", "")), str(info.get("cluster", ""))
    try:
        account = await bus.js.account_info()
    except Exception as exc:
        return doctor.NatsFacts(
            server, version, cluster, None, None, error=f"{type(exc).__name__}: {exc}"
        )
    health = []
    for spec in STREAMS:
        try:
            stream = await bus.js.stream_info(spec.name)
        except NotFoundError:
            health.append(doctor.StreamHealth(spec.name, found=False))
            continue
        replicas = (stream.cluster.replicas if stream.cluster else None) or []
        health.append(
            doctor.StreamHealth(
                spec.name,
                found=True,
                leader=str(stream.cluster.leader or "") if stream.cluster else "",
                lagging=tuple(
                    str(peer.name) for peer in replicas if peer.offline or not peer.current
                ),
                clustered=stream.cluster is not None,
            )
        )
    return doctor.NatsFacts(
        server,
        version,
        cluster,
        account.streams,
        account.consumers,
        stream_health=tuple(health),
    )


async def slurm_statuses(bus: Bus) -> list[SlurmClusterStatus]:
    """Every cluster's SlurmClusterStatus in KV slurm_clusters (slurm-syncer's)."""
    kv = await bus.js.key_value(SLURM_CLUSTERS_BUCKET)
    statuses = []
    try:
        keys = await kv.keys()
    except NatsError:  # nats-py raises NoKeysError for an empty bucket
        return []
    for key in keys:
        entry = await kv.get(key)
        if entry.value:
            statuses.append(msgspec.json.decode(entry.value, type=SlurmClusterStatus))
    return statuses


@dataclass
class _DoctorReads:
    """What `doctor` reads from the API server: each list None (and its `*_unread` saying
    why) when the caller may not read it."""

    namespace: str
    all_deployments: list[Obj] | None = None
    deployments_unread: str = ""
    secrets: list[Obj] | None = None
    secrets_unread: str = ""
    crds: list[Obj] | None = None
    crds_unread: str = ""
    leases: list[Obj] | None = None
    leases_unread: str = ""
    # The NodeSets and PodGroups in use, by kind.
    in_use: dict[str, list[Obj]] = field(default_factory=dict)
    in_use_unread: str = ""
    pods: list[Obj] | None = None
    pods_unread: str = ""
    # The ConfigMaps k8s-watcher's and the placer's env reads settings from.
    configmaps: dict[str, Obj] = field(default_factory=dict)
    configmaps_unread: str = ""

    @property
    def deployments(self) -> list[Obj]:
        """The Deployments in the system namespace."""
        return [
            d
            for d in self.all_deployments or []
            if d.get("metadata", {}).get("namespace") == self.namespace
        ]

    def deployment(self, name: str) -> Obj | None:
        return next(
            (d for d in self.deployments if d.get("metadata", {}).get("name") == name), None
        )

    @property
    def system_leases(self) -> list[Obj]:
        return [
            lease
            for lease in self.leases or []
            if lease.get("metadata", {}).get("namespace") == self.namespace
        ]


async def _read_for_doctor(args: argparse.Namespace) -> _DoctorReads:
    """Phase 1 of `doctor`: every API-server read its checks need."""
    reads = _DoctorReads(args.system_namespace)
    ns = quote(reads.namespace, safe="")
    kube = await Kube.connect(args.kubeconfig, args.context)
    try:
        reads.all_deployments, reads.deployments_unread = await read_list(
            kube, "/apis/apps/v1/deployments", "Deployments"
        )
        reads.secrets, reads.secrets_unread = await read_list(
            kube, f"/api/v1/namespaces/{ns}/secrets", f"Secrets in {reads.namespace}"
        )
        reads.crds, reads.crds_unread = await read_list(
            kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "CRDs"
        )
        reads.leases, reads.leases_unread = await read_list(
            kube, "/apis/coordination.k8s.io/v1/leases", "Leases"
        )
        for key, kind in (("nodeset", "NodeSet"), ("gang", "PodGroup")):
            items, unread = await read_list(
                kube, KINDS[key][0].replace("/namespaces/{ns}", ""), f"{kind}s"
            )
            reads.in_use[kind] = items or []
            reads.in_use_unread = reads.in_use_unread or unread
        selector = quote(f"spec.schedulerName={doctor.KOORD_SCHEDULER}")
        reads.pods, reads.pods_unread = await read_list(
            kube, f"/api/v1/pods?fieldSelector={selector}", "Pods"
        )
        for workload in (reads.deployment("k8s-watcher"), reads.deployment(doctor.PLACER)):
            for name in doctor.env_configmaps(workload or {}):
                path = f"/api/v1/namespaces/{ns}/configmaps/{quote(name, safe='')}"
                try:
                    found = await kube.get(path)
                except ApiStatusError as exc:
                    if exc.status not in (401, 403):
                        raise
                    reads.configmaps_unread = (
                        f"ConfigMap {reads.namespace}/{name} not read: the caller may not get "
                        f"it (HTTP {exc.status})"
                    )
                    continue
                if found is not None:
                    reads.configmaps[name] = found
    finally:
        await kube.close()
    return reads


def _cluster_checks(reads: _DoctorReads, now: float) -> list[doctor.Check]:
    """Phase 2: Secrets, CRDs, COMMAND_NAMESPACES and the scheduler, from the API reads."""
    scheduler = doctor.KOORD_SCHEDULER
    watcher, placer = reads.deployment("k8s-watcher"), reads.deployment(doctor.PLACER)
    ours = [d for d in reads.deployments if d.get("metadata", {}).get("name") in SERVICES]
    placer_leads = any(
        doctor.lease_fresh(lease, now)
        for lease in reads.system_leases
        if lease.get("metadata", {}).get("name") in lease_names(doctor.PLACER)
    )
    checks = doctor.check_secrets(
        doctor.referenced_secrets(ours) if ours else doctor.default_secrets(),
        reads.secrets,
        reads.namespace,
        reads.secrets_unread,
        deployed=bool(ours),
    )
    checks += doctor.check_crds(reads.crds, reads.crds_unread)
    checks.append(
        doctor.check_command_namespaces(
            None
            if watcher is None
            else doctor.env_setting(watcher, "COMMAND_NAMESPACES", reads.configmaps) or "",
            doctor.namespaces_in_use(reads.in_use),
            reads.namespace,
            reads.deployments_unread or reads.in_use_unread or reads.configmaps_unread,
        )
    )
    placer_setting = (
        doctor.env_setting(placer, "SCHEDULER_NAMES", reads.configmaps)
        if placer is not None
        else None
    )
    checks.append(
        doctor.check_scheduler(
            doctor.pending_pods(reads.pods or [], scheduler),
            doctor.placer_scheduler_names(placer_setting),
            placer_leads,
            doctor.other_schedulers(
                reads.all_deployments or [], reads.leases or [], scheduler, now
            ),
            scheduler,
            unread=reads.pods_unread or reads.leases_unread,
        )
    )
    return checks


async def _bus_checks(args: argparse.Namespace) -> list[doctor.Check]:
    """Phase 3: NATS cluster health and each Slurm cluster's status, read over NATS."""
    checks: list[doctor.Check] = []
    facts: doctor.NatsFacts | None = None
    statuses: list[SlurmClusterStatus] | None = None
    skip = ""
    connected = unreachable = False
    try:
        async with open_nats(args) as bus:
            connected = True
            facts = await nats_facts(bus)
            try:
                statuses = await slurm_statuses(bus)
            except Exception as exc:
                skip = f"KV {SLURM_CLUSTERS_BUCKET} not read: {type(exc).__name__}: {exc}"
    except NatsNotGiven as exc:
        skip = str(exc)
    except CliError as exc:
        if connected:
            raise
        # --nats, or the port-forward, given and not reached: one FAIL saying why.
        skip, unreachable = str(exc), True
        checks.append(doctor.Check("FAIL", "nats", skip))
    if not unreachable:
        checks += doctor.check_nats(facts, skip)
    checks += doctor.check_slurm(statuses, time.time(), skip)
    return checks


async def doctor_checks(args: argparse.Namespace) -> list[doctor.Check]:
    """Read the API server, then NATS, then run the checks: the cluster's, the bus's, then
    each service's leader and readiness."""
    reads = await _read_for_doctor(args)
    now = time.time()
    checks = _cluster_checks(reads, now)
    checks += await _bus_checks(args)
    checks += doctor.check_leaders(
        None if reads.leases is None else reads.system_leases,
        reads.namespace,
        now,
        reads.leases_unread,
    )
    checks += doctor.check_readiness(
        None if reads.all_deployments is None else reads.deployments,
        reads.namespace,
        reads.deployments_unread,
    )
    return checks


async def doctor_command(args: argparse.Namespace) -> bool:
    checks = await doctor_checks(args)
    for line in doctor.format_checks(checks):
        print(line)
    return not doctor.failed(checks)


def add_system_namespace(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--system-namespace",
        default=os.environ.get("KUBE_LEASE_NAMESPACE") or DEFAULT_LEASE_NAMESPACE,
        help="where the services, their Secrets and Leases, and NATS live (default: "
        "KUBE_LEASE_NAMESPACE, else nodeflow-system)",
    )


# Each command with what it prints (`kubectl nodeflow --help`; docs/cli.md has them whole).
HELP_EXAMPLES = """\
examples (each command, then the start of what it prints):
  $ kubectl nodeflow why nodemaintenance second
  NodeMaintenance default/second (node sim-002, requestor ops.example.com): Pending: waiting \
for a slot: 1 of 1 maxParallelOperations in progress
  $ kubectl nodeflow why pod gpu-012-002
  Pod default/gpu-012-002 (Running, on node-000)
  marked for deletion: SlurmDelete=True ScalingDeleteScheduled: scale down to 2: rank 7: ...
  Slurm node sim/gpu-012-002: Mixed+Drain; busy: 1 of 60 CPUs allocated to jobs 4211 as of \
2026-11-28T03:33:09Z (not deleted while it runs a job); ...
  $ kubectl nodeflow why nodeset gpu
  NodeSet default/gpu: 2 replicas wanted; 4 pods, 4 ready, 4 updated, 2 draining, 0 unavailable
  ScaleDownWaiting=True PodsBusy: 2 pods wait: gpu-012-002 (node busy with jobs, draining), ...
  $ kubectl nodeflow why gang big
  PodGroup default/big: Pending; 0 scheduled, 0 running of minMember 4
  ... MustGather BlockLayer: no BlockLayer domain offers 4 slots ...
  $ kubectl nodeflow why skyhook gpu-init      (or: why nodewright NAME)
  Skyhook gpu-init: in_progress (paused); 0 nodes in progress, 3/16 complete
  $ kubectl nodeflow decisions --object default/second
  2026-11-28T03:21:07Z  maintenance-scheduler  NodeMaintenance default/second (node sim-002)  \
no-slot: waiting for a slot: 1 of 1 maxParallelOperations in progress
  $ kubectl nodeflow dlq list
  SEQ  TIME                  SUBJECT   KIND    ERROR  PAYLOAD
  2    2026-11-28T06:41:07Z  work.bad  decode  ContractDecodeError: cannot decode message ...
  $ kubectl nodeflow dead-letters --limit 1    (dlq list's first name)
  SEQ  TIME                  SUBJECT   KIND    ERROR  PAYLOAD
  $ kubectl nodeflow dlq show 2
  dead letter 2 of DEAD_LETTERS, stored 2026-11-28T06:41:07Z
  $ kubectl nodeflow dlq replay 2
  2 dlq.work.bad -> work.bad: replayed as TEST_WORK 3; dead letter removed
  $ kubectl nodeflow doctor
  OK    secret nodeflow-system/nodeflow-admin-nats  present (password, user)
  OK    slurm sim  slurmrestd API v0.0.45; last poll 4s ago, 0 nodes
  OK    leader k8s-watcher  vm-18188-ed09784a, renewed 2s ago
  $ kubectl nodeflow rollout undo nodeset gpu  (also: rollout history nodeset gpu)
  nodeset.nodeflow.dev/gpu rolled back to revision 1
  $ kubectl nodeflow release-claim gpu-1
  node/gpu-1 claim released (was NodeSet slurm/gpu; NodeSet slurm/gpu no longer exists; no \
NodeSet pod on the node)
  $ kubectl nodeflow migrate slinky < theirs.yaml > ours.yaml
  note: NodeSet slurm/slurm-worker-slinky: spec.controllerRef: slurmCluster 'slurm': ...
  $ kubectl nodeflow skyhook pause gpu-init -y (and: resume, disable, enable, reset, package \
rerun|logs|status, node ignore|unignore|reset|list|status, version)
  skyhook.skyhook.nvidia.com/gpu-init paused
  $ kubectl nodeflow nodewright node status --skyhook nodewright-sample   (the same verbs)
  NODE       SKYHOOK             STATUS     PACKAGES
  node-014   nodewright-sample   complete   1/1
"""


def add_why(commands: Subcommands) -> None:
    """`why KIND NAME`."""
    why_parser = commands.add_parser(
        "why",
        help="one verdict joining the object's state, its Slurm node and the latest decisions",
    )
    why_parser.add_argument("kind", choices=sorted(KINDS))
    why_parser.add_argument("name")
    why_parser.add_argument("-n", "--namespace", default="default")
    add_system_namespace(why_parser)


def add_decisions(commands: Subcommands) -> None:
    """`decisions [-f] [--service S] [--object O]`."""
    decisions_parser = commands.add_parser("decisions", help="the controllers' decisions")
    decisions_parser.add_argument("-f", "--follow", action="store_true")
    add_system_namespace(decisions_parser)
    decisions_parser.add_argument(
        "--service", default="", choices=["", *sorted(set(verdicts.DECISION_SERVICES.values()))]
    )
    decisions_parser.add_argument(
        "--object", default="", help="a name, ns/name or 'Kind ns/name' (or a node or pod)"
    )


def add_dlq(commands: Subcommands) -> None:
    """`dlq list|show|replay` (and `dead-letters`, the first name of `dlq list`)."""
    dlq_parser = commands.add_parser(
        "dlq", help="the dead letters (messages given up on): list, show, replay after a fix"
    )
    dlq_actions = dlq_parser.add_subparsers(dest="action", required=True)
    list_parsers = [
        dlq_actions.add_parser("list", help="one line per dead letter, oldest first"),
        # The first name of `dlq list`, kept: docs and runbooks say it.
        commands.add_parser("dead-letters", help="the same as `dlq list`"),
    ]
    for list_parser in list_parsers:
        list_parser.set_defaults(command="dlq", action="list")
        list_parser.add_argument(
            "--subject", default="", help="only these original subjects (wildcards allowed)"
        )
        list_parser.add_argument(
            "--limit", type=int, default=0, help="only the newest N (default: all)"
        )
        add_system_namespace(list_parser)
    show_parser = dlq_actions.add_parser("show", help="one dead letter: headers and payload")
    show_parser.add_argument("sequence", type=int, help="its sequence in DEAD_LETTERS")
    add_system_namespace(show_parser)
    replay_parser = dlq_actions.add_parser(
        "replay",
        help="publish dead letters again to their original subject, then remove them",
    )
    replay_parser.add_argument("sequences", type=int, nargs="*", metavar="SEQ")
    replay_parser.add_argument("--all", action="store_true", help="every dead letter")
    replay_parser.add_argument("--subject", default="", help="with --all: only these")
    replay_parser.add_argument(
        "--dry-run", action="store_true", help="say what would be replayed, publish nothing"
    )
    add_system_namespace(replay_parser)


def add_doctor(commands: Subcommands) -> None:
    """`doctor`."""
    doctor_parser = commands.add_parser(
        "doctor",
        help="check what Nodeflow needs: Secrets, CRDs, COMMAND_NAMESPACES, the "
        "koord-scheduler, Slurm, NATS, each service's leader and readiness",
    )
    add_system_namespace(doctor_parser)


def add_rollout(commands: Subcommands) -> None:
    """`rollout history|undo nodeset NAME`."""
    rollout_parser = commands.add_parser(
        "rollout", help="a NodeSet's revision history and rollback, as kubectl rollout"
    )
    actions = rollout_parser.add_subparsers(dest="action", required=True)
    history_parser = actions.add_parser("history", help="the NodeSet's ControllerRevisions")
    history_parser.add_argument("--revision", type=int, default=0, help="show this one's template")
    undo_parser = actions.add_parser(
        "undo", help="put an earlier revision's template back (default: the one before)"
    )
    undo_parser.add_argument("--to-revision", type=int, default=0)
    for sub in (history_parser, undo_parser):
        sub.add_argument("kind", choices=["nodeset", "nodesets"])
        sub.add_argument("name")
        sub.add_argument("-n", "--namespace", default="default")


def add_release_claim(commands: Subcommands) -> None:
    """`release-claim NODE [--force]`."""
    release_parser = commands.add_parser(
        "release-claim",
        help="remove a deleted NodeSet's claim from a node (only with no NodeSet pod on it)",
    )
    release_parser.add_argument("node")
    release_parser.add_argument(
        "--force",
        action="store_true",
        help="release even though the claiming NodeSet still exists (it may claim it again)",
    )


def add_migrate(commands: Subcommands) -> None:
    """`migrate slinky ...`."""
    # The converter of docs/migration.md (nodeset_controller.migrate), its arguments as they
    # are: `kubectl nodeflow migrate slinky [--slurm-cluster ...] < theirs.yaml > ours.yaml`.
    migrate_parser = commands.add_parser(
        "migrate",
        help="convert another operator's NodeSets into Nodeflow's (YAML on stdin, ours on "
        "stdout): migrate slinky [--slurm-cluster C] [--conf-server HOST:PORT] "
        "[--slurm-key-secret NAME[/KEY]] [--accept-changes]",
        add_help=False,
    )
    migrate_parser.add_argument("migrate_args", nargs=argparse.REMAINDER)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl nodeflow",
        description="Why Nodeflow holds an object where it is, its decisions, its dead letters "
        "(list, show, replay after a fix), a NodeSet's rollout history and rollback, and a "
        "doctor that checks what Nodeflow needs.",
        epilog=HELP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    top.add_argument("--context", default="")
    top.add_argument(
        "--nats",
        default=os.environ.get("NATS_URL", ""),
        help="NATS URL(s), comma-separated (default: NATS_URL; without either: a port-forward "
        "of its own to the Service nats of --system-namespace); credentials from NATS_USER "
        "and NATS_PASSWORD[_FILE] (or NATS_TOKEN[_FILE], NATS_CREDS_FILE), else, through the "
        "port-forward, nodeflow-admin's from the Secret nodeflow-admin-nats",
    )
    commands = top.add_subparsers(dest="command", required=True)
    for add in (
        add_why,
        add_decisions,
        add_dlq,
        add_doctor,
        add_rollout,
        add_release_claim,
        add_migrate,
        add_skyhook_verbs,
    ):
        add(commands)
    return top


async def run(args: argparse.Namespace) -> bool:
    """Run the command; False when it did not do all it was asked (exit 1)."""
    if args.command == "why":
        print(await why(args))
    elif args.command == "decisions":
        await decisions(args)
    elif args.command == "rollout":
        print(await rollout_command(args))
    elif args.command == "release-claim":
        print(await release_claim_command(args))
    elif args.command == "doctor":
        return await doctor_command(args)
    elif args.command in (SKYHOOK.singular, NODEWRIGHT.singular):
        return await skyhook_command(args)
    elif args.action == "list":
        await dlq_list(args)
    elif args.action == "show":
        await dlq_show(args)
    else:
        return await dlq_replay(args)
    return True


def quiet_logs() -> None:
    """The libraries' structured logs are for services: a command prints its answer on
    stdout, and only warnings (a reconnect, ...) on stderr."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_logs()
    if args.command == "migrate":
        # Its own exit codes (2: changes that alter behaviour, not accepted).
        return migrate.run(
            args.migrate_args, sys.stdin, sys.stdout, sys.stderr, prog="kubectl nodeflow migrate"
        )
    try:
        if not asyncio.run(run(args)):
            return EXIT_FAILED
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
