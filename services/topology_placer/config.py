"""topology-placer settings (environment variables of the same name, upper case)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from nodeflow_runtime.config import ServiceConfig
from topology_placer.commands import COMMAND_LIFETIME_SECONDS


class TopologyPlacerConfig(ServiceConfig, kw_only=True):
    # Pods whose spec.schedulerName is one of these are placed by this service (comma list).
    scheduler_names: Annotated[tuple[str, ...], Meta(min_length=1)] = (
        "koord-scheduler",
        "nodeflow-placer",
    )
    # One active replica: the others wait on this lease.
    leader_lease_ttl_seconds: Annotated[float, Meta(gt=0)] = 15.0
    # Every gang is re-planned at least this often even when nothing changed (timeouts).
    resync_seconds: Annotated[float, Meta(gt=0)] = 5.0
    # Changes arriving within this window are planned together.
    debounce_seconds: Annotated[float, Meta(ge=0)] = 0.05
    # An applied command whose effect KV has not shown for this long frees its pod (one not
    # applied holds it until it can no longer land: the command ledger, docs/protocols.md).
    # At least the command lifetime (30 s): a view may lag that long behind a reconnect.
    in_flight_timeout_seconds: Annotated[float, Meta(gt=0)] = COMMAND_LIFETIME_SECONDS
    # Most commands published in one batch (JetStream acks outstanding).
    publish_window: Annotated[int, Meta(ge=1)] = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.in_flight_timeout_seconds < COMMAND_LIFETIME_SECONDS:
            # A hold shorter than a command's life frees a pod while the command's effect may
            # still be on its way to the view: the next pass would nominate on a stale view.
            raise ValueError(
                f"in_flight_timeout_seconds ({self.in_flight_timeout_seconds:g}) must be at "
                f"least the command lifetime ({COMMAND_LIFETIME_SECONDS:g})"
            )
