"""Tests of the real control plane (`make test-real-kube`, tools/kube/real_kube.sh): marked
``real_kube``, they run where NODEFLOW_KUBE_KUBECONFIG names it and are deselected elsewhere
(they do not apply to the emulator, so they are not skips)."""

from __future__ import annotations

import os

import pytest

KUBECONFIG_ENV = "NODEFLOW_KUBE_KUBECONFIG"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_kube: needs the real control plane of tools/kube")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(KUBECONFIG_ENV):
        return
    deselected = [item for item in items if "real_kube" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "real_kube" not in item.keywords]
