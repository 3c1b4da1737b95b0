"""The maintenance-scheduler service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "maintenance-scheduler"
