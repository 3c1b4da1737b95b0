"""The metrics-exporter service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "metrics-exporter"
