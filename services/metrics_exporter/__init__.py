"""The metrics-exporter service (see ../shared/DESIGN.md for what it owns): the Prometheus view
of the whole control plane, rendered from KV views and event streams."""

SERVICE = "metrics-exporter"
