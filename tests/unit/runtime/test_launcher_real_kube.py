"""The launcher's part of `make run KUBE=real`: the settings it gives tools/kube/real_kube.sh
and how it reads what the script prints."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nodeflow_runtime.launcher import exported, real_kube_environment


def test_real_kube_gets_the_whole_control_plane_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What `make test-real-kube` exports for the conformance suite's bare control plane.
    for name in ("KUBE_NODES", "KUBE_SCHEDULER", "KUBE_CRDS", "KUBE_POD_STAGES"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("KUBE_STATE", "/elsewhere")
    env = real_kube_environment(tmp_path, argparse.Namespace(nodes=8, topology="spines=1"))
    assert env["KUBE_STATE"] == str(tmp_path / "real-kube")
    assert (env["KUBE_NODES"], env["KUBE_TOPOLOGY"]) == ("8", "spines=1")
    assert env["KUBE_SCHEDULER"] == env["KUBE_CRDS"] == env["KUBE_POD_STAGES"] == "1"


def test_exported_reads_the_export_lines_of_real_kube_start() -> None:
    printed = (
        "export NODEFLOW_KUBE_KUBECONFIG=/run/real-kube/kubeconfig\n"
        "export NODEFLOW_KUBE_URL=https://127.0.0.1:6443\n"
        "not an export=line\n"
    )
    assert exported(printed) == {
        "NODEFLOW_KUBE_KUBECONFIG": "/run/real-kube/kubeconfig",
        "NODEFLOW_KUBE_URL": "https://127.0.0.1:6443",
    }
