"""Slinky's own example NodeSets, converted by `python -m nodeset_controller.migrate slinky`,
apply through kubectl to the API server with our NodeSet CRD installed (its schema validates
them: on the emulator and, with NODEFLOW_CONFORMANCE_KUBECONFIG, on a real kube-apiserver), and
read back as written. A converted NodeSet that our schema refuses fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.k8s.conftest import Kube
from tests.conformance.k8s.test_k8s_crd_rules import _install, _project_crd
from tests.conformance.k8s.test_kubectl import KUBECTL, kubectl

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slinky"


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def migrated(path: Path, namespace: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "nodeset_controller.migrate", "slinky"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    for doc in docs:
        # The test's own namespace (the examples name `slurm`).
        doc["metadata"]["namespace"] = namespace
    return docs


async def test_rule_migrated_slinky_examples_apply_with_our_crd(kube: Kube) -> None:
    await _install(kube, _project_crd("nodesets.nodeflow.dev.yaml"))
    for path in sorted(FIXTURES.glob("*.yaml")):
        docs = migrated(path, kube.namespace)
        applied = await kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
        for doc in docs:
            name = doc["metadata"]["name"]
            assert f"nodeset.nodeflow.dev/{name} created" in applied, applied
            stored = json.loads(
                await kubectl(kube, "get", "nodesets.nodeflow.dev", name, "-o", "json")
            )
            assert stored["spec"]["replicas"] == doc["spec"]["replicas"]
            assert stored["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "25%"
            container = stored["spec"]["template"]["spec"]["containers"][0]
            assert container["name"] == "slurmd" and container["args"][0] == "-Z"


async def test_rule_migrated_options_apply_with_our_crd(kube: Kube, tmp_path: Path) -> None:
    """A DaemonSet-mode NodeSet with pruning on and protection off: both carried, both taken
    by our schema (an enum and a boolean), and a value outside the enum refused."""
    await _install(kube, _project_crd("nodesets.nodeflow.dev.yaml"))
    slinky = yaml.safe_load((FIXTURES / "chart-default.yaml").read_text())
    slinky["spec"].update(
        scalingMode="DaemonSet",
        pruneSlurmNodeRecords="NodeNotFound",
        workloadDisruptionProtection=False,
    )
    source = tmp_path / "slinky.yaml"
    source.write_text(yaml.safe_dump(slinky))
    (ours,) = migrated(source, kube.namespace)
    await kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump(ours))
    name = ours["metadata"]["name"]
    stored = json.loads(await kubectl(kube, "get", "nodesets.nodeflow.dev", name, "-o", "json"))
    assert stored["spec"]["pruneSlurmNodeRecords"] == "NodeNotFound"
    assert stored["spec"]["workloadDisruptionProtection"] is False
    assert "replicas" not in stored["spec"]
    ours["spec"]["pruneSlurmNodeRecords"] = "Sometimes"
    refused = await kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump(ours), check=False)
    assert "Unsupported value" in refused or "Invalid value" in refused, refused
