"""The k8s-watcher service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "k8s-watcher"
