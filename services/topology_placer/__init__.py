"""The topology-placer service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "topology-placer"
