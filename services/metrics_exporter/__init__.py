"""The metrics-exporter service (see docs/metrics-exporter.md): the Prometheus view
of the whole control plane, rendered from KV views and event streams."""

SERVICE = "metrics-exporter"
