"""topology-placer settings (environment variables of the same name, upper case)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from nodeflow_runtime.config import ServiceConfig


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
    # A command is not sent again for this long unless the state it was based on changes.
    in_flight_timeout_seconds: Annotated[float, Meta(gt=0)] = 20.0
    # Most commands published in one batch (JetStream acks outstanding).
    publish_window: Annotated[int, Meta(ge=1)] = 512
