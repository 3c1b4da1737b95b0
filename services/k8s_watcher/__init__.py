"""The k8s-watcher service (see docs/k8s-watcher.md for the rules it implements)."""

SERVICE = "k8s-watcher"
