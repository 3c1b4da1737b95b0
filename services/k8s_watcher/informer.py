"""List+watch of one kind (in one namespace, or all) into its KV bucket and event subjects.

The loop: list (paged) and publish what differs from the index of mirrored objects, then
watch from the list's resourceVersion with bookmarks. A watch that ends or drops resumes
from the last resourceVersion seen; 410 Gone relists, which publishes DELETED for every
object that vanished in the gap and MODIFIED only for objects whose resourceVersion moved.
The index is only updated after JetStream acknowledged the messages, so a failed publish is
repaired by the next relist: no change is lost.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from k8s_watcher.kinds import KindInfo
from k8s_watcher.kube import (
    ApiResponse,
    ApiStatusError,
    ApiUnavailable,
    KubeClient,
    WatchExpired,
)
from k8s_watcher.sync import (
    Change,
    Stamp,
    apply_to_index,
    list_page_changes,
    messages_of,
    placeholder,
    vanished_keys,
    watch_changes,
    watch_error,
)
from nodeflow_bus import Backoff, Bus, BusError
from nodeflow_contracts import codec

log = structlog.get_logger("k8s_watcher.informer")

PUBLISH_WINDOW = 1024
# How often a kind whose CRD is not installed is listed again (to see it installed).
NOT_SERVED_RECHECK_SECONDS = 30.0


class KindNotServed(Exception):
    """The API server does not serve the kind (404 on the list): its CRD is not installed, or
    it is an alpha API the cluster does not enable."""


class Informer:
    def __init__(
        self,
        *,
        kube: KubeClient,
        bus: Bus,
        kind: KindInfo,
        namespace: str | None,
        label_selector: str,
        index: dict[str, Stamp],
        page_size: int = 500,
        watch_timeout: float = 300.0,
        backoff: Backoff | None = None,
        not_served_recheck: float | None = None,
    ) -> None:
        self.kube = kube
        self.bus = bus
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.bucket = kind.bucket
        self.index = index
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff(initial=0.2, maximum=30.0)
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.not_served_recheck = (
            NOT_SERVED_RECHECK_SECONDS if not_served_recheck is None else not_served_recheck
        )
        # Why the kind is not served ("" while it is): an optional kind without its CRD.
        self.not_served = ""
        self.relists = 0
        self.watches = 0
        self.published_changes = 0
        self._kv: KeyValue | None = None
        self._log = log.bind(kind=kind.kind, namespace=namespace or "*")

    @property
    def name(self) -> str:
        return f"{self.kind.kind}/{self.namespace or '*'}"

    async def run(self) -> None:
        need_list = True
        attempt = 0
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                    self.synced.set()
                started = time.monotonic()
                received = await self.watch_once()
                if received or time.monotonic() - started > 1.0:
                    attempt = 0
                    continue
                # A watch that ends at once with nothing: do not spin on a sick server.
                attempt += 1
                await asyncio.sleep(self.backoff.delay(attempt))
            except WatchExpired as exc:
                self._log.info("informer.expired", error=str(exc))
                need_list = True
            except KindNotServed as exc:
                await self._wait_until_served(exc, attempt := attempt + 1)
            except (ApiUnavailable, ApiStatusError) as exc:
                attempt += 1
                delay = self.backoff.delay(attempt)
                self._log.warning(
                    "informer.api_error", error=str(exc), attempt=attempt, retry_in=delay
                )
                await asyncio.sleep(delay)
            except (BusError, nats.errors.Error) as exc:
                # What the watch delivered may be unpublished: a relist repairs it.
                attempt += 1
                delay = self.backoff.delay(attempt)
                self._log.warning(
                    "informer.publish_failed", error=str(exc), attempt=attempt, retry_in=delay
                )
                need_list = True
                await asyncio.sleep(delay)

    async def _wait_until_served(self, exc: KindNotServed, attempt: int) -> None:
        """An optional kind that is not served (its CRD not installed, as on a cluster without
        that operator) has no objects: synced with none, listed again every
        `not_served_recheck` seconds. But when objects of it were mirrored, a 404 is no proof
        they are gone (deleting a CRD deletes its objects first, and their DELETED events
        come through the watch): fail closed, keep them, and retry with backoff."""
        if self.index:
            delay = self.backoff.delay(attempt)
            self._log.warning(
                "informer.kind_not_served_objects_kept",
                error=str(exc),
                objects=len(self.index),
                attempt=attempt,
                retry_in=delay,
            )
            await asyncio.sleep(delay)
            return
        if self.not_served != str(exc):
            self._log.warning(
                "informer.kind_not_served", error=str(exc), recheck=self.not_served_recheck
            )
        self.not_served = str(exc)
        self.synced.set()
        await asyncio.sleep(self.not_served_recheck)

    # --- list --------------------------------------------------------------------------------

    def _selector_query(self) -> list[tuple[str, Any]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []

    async def relist(self) -> None:
        """List every page, publish what differs from the index, then the deletions."""
        path = self.kind.collection_path(self.namespace)
        listed: set[str] = set()
        continue_token = ""
        resource_version = ""
        changed = 0
        started = time.monotonic()
        while True:
            query = [("limit", self.page_size), *self._selector_query()]
            if continue_token:
                query.append(("continue", continue_token))
            response = await self.kube.request("GET", path, query=query)
            if response.status == 410:
                raise WatchExpired(f"list continue token expired: {response.message}")
            if response.status == 404 and self.kind.optional and not continue_token:
                why = (
                    f"the CustomResourceDefinition {self.kind.plural}.{self.kind.group} is not "
                    "installed"
                    if self.kind.served_by_crd
                    else f"an alpha API the cluster does not enable (kube-apiserver "
                    f"--runtime-config={self.kind.api_version}=true)"
                )
                what = f"{self.kind.api_version} {self.kind.plural}"
                raise KindNotServed(f"{what} is not served: {why}")
            if not response.ok:
                raise ApiStatusError(response)
            body = response.body
            meta = body.get("metadata") or {}
            resource_version = str(meta.get("resourceVersion") or resource_version)
            changes, keys = list_page_changes(self.kind, self.index, body.get("items") or [])
            listed.update(keys)
            await self._publish(await self._with_stored_objects(changes))
            changed += len(changes)
            continue_token = str(meta.get("continue") or "")
            if not continue_token:
                break
        gone = vanished_keys(self.index, listed)
        deletions = [Change("DELETED", key, await self._stored_object(key)) for key in gone]
        await self._publish(deletions)
        self.resource_version = resource_version
        self.relists += 1
        if self.not_served:
            self._log.info("informer.kind_served", was=self.not_served)
            self.not_served = ""
        self._log.info(
            "informer.listed",
            objects=len(listed),
            changed=changed,
            deleted=len(deletions),
            resource_version=resource_version,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _with_stored_objects(self, changes: list[Change]) -> list[Change]:
        """Replace the placeholder of a recreated object's old incarnation by its stored copy."""
        if not any(change.type == "DELETED" for change in changes):
            return changes
        filled: list[Change] = []
        for change in changes:
            if change.type == "DELETED":
                change = Change("DELETED", change.key, await self._stored_object(change.key))
            filled.append(change)
        return filled

    async def _stored_object(self, key: str) -> dict[str, Any]:
        """The last mirrored state of `key`, for the DELETED event of an object that vanished."""
        stamp = self.index.get(key, Stamp("", ""))
        try:
            if self._kv is None:
                self._kv = await self.bus.js.key_value(self.bucket)
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return placeholder(self.kind, key, stamp)
        if not entry.value:
            return placeholder(self.kind, key, stamp)
        obj: dict[str, Any] = codec.decode(dict, entry.value, subject=key)
        return obj

    # --- watch -------------------------------------------------------------------------------

    async def watch_once(self) -> int:
        """Watch from the last resourceVersion until the stream ends; returns events seen."""
        timeout = int(self.watch_timeout * (1 + random.random()))
        query: list[tuple[str, Any]] = [
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout),
            *self._selector_query(),
        ]
        if self.resource_version:
            query.append(("resourceVersion", self.resource_version))
        path = self.kind.collection_path(self.namespace)
        self.watches += 1
        received = 0
        try:
            async for batch in self.kube.watch(path, query, read_timeout=timeout + 30.0):
                received += len(batch)
                await self._handle_batch(batch)
        except ApiStatusError as exc:
            if exc.response.status == 410:
                raise WatchExpired(exc.response.message) from exc
            raise
        return received

    async def _handle_batch(self, batch: list[dict[str, Any]]) -> None:
        changes, last_rv = watch_changes(self.kind, self.index, batch)
        await self._publish(changes)
        if last_rv:
            self.resource_version = last_rv
        error = watch_error(batch)
        if error is not None:
            code = int(error.get("code") or 500)
            message = str(error.get("message") or "")
            if code == 410:
                raise WatchExpired(message)
            raise ApiStatusError(ApiResponse(code, dict(error)))

    # --- publish -----------------------------------------------------------------------------

    async def _publish(self, changes: list[Change]) -> None:
        if not changes:
            return
        messages = messages_of(self.kind, self.bucket, changes)
        await self.bus.publish_batch(messages, max_in_flight=PUBLISH_WINDOW)
        apply_to_index(self.index, changes)
        self.published_changes += len(changes)
