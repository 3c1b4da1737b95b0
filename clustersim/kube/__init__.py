"""Kubernetes API emulator: an in-memory store (``store``) and its HTTP server (``server``)."""
