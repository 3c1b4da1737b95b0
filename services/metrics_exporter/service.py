"""The metrics-exporter service: its configuration and its setup under the runtime."""

from __future__ import annotations

from prometheus_client import REGISTRY

from metrics_exporter.exporter import Exporter
from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import ServiceContext


class ExporterConfig(ServiceConfig, kw_only=True):
    # Most distinct values one free label (decision kind or reason) may take; later new
    # values are counted as `other` so that no series set grows without bound.
    label_value_limit: int = 100
    # Most Slurm clusters whose poll results are tracked.
    max_slurm_clusters: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.label_value_limit < 1:
            raise ValueError("LABEL_VALUE_LIMIT must be at least 1")
        if self.max_slurm_clusters < 1:
            raise ValueError("MAX_SLURM_CLUSTERS must be at least 1")


async def setup(ctx: ServiceContext[ExporterConfig]) -> None:
    """Start the exporter; its metrics join the runtime's /metrics (the global REGISTRY)."""
    exporter = Exporter(
        ctx.bus,
        REGISTRY,
        label_value_limit=ctx.config.label_value_limit,
        max_slurm_clusters=ctx.config.max_slurm_clusters,
    )
    ctx.health.add_check("kv-views", exporter.not_ready_reason)
    await exporter.start()
    ctx.on_stop(exporter.stop)
