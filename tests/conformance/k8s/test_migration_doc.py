"""docs/migration.md's Slinky steps, run as written: every `sh` block of its Slinky section in
bash (`set -euo pipefail`), in order, against an API server that holds Slinky's own example
NodeSets (tests/fixtures/slinky) under a stand-in for Slinky's CRD, and our NodeSet CRD. The
steps must export them, convert them with `python -m nodeset_controller.migrate slinky`, pass
a server-side dry run and create our NodeSets, one per Slinky NodeSet."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.k8s.conftest import Kube
from tests.conformance.k8s.test_k8s_crd_rules import _install, _project_crd
from tests.conformance.k8s.test_kubectl import KUBECTL, kubectl

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "migration.md"
SECTION = "## Slinky (slurm-operator) → Nodeflow"
FIXTURES = ROOT / "tests" / "fixtures" / "slinky"


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def slinky_blocks() -> list[str]:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.DOTALL)


def slinky_crd() -> dict[str, Any]:
    """A stand-in for Slinky's NodeSet CRD: its group, version and names, any spec (the test
    is about our side of the move, not about Slinky's schema)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "nodesets.slinky.slurm.net"},
        "spec": {
            "group": "slinky.slurm.net",
            "scope": "Namespaced",
            "names": {"plural": "nodesets", "singular": "nodeset", "kind": "NodeSet"},
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def test_the_doc_has_the_slinky_steps() -> None:
    blocks = slinky_blocks()
    assert len(blocks) == 3
    assert "python -m nodeset_controller.migrate slinky" in blocks[0]
    assert "--dry-run=server" in blocks[1] and "kubectl apply -f" in blocks[2]


async def bash(script: str, workdir: Path, kube: Kube) -> str:
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "KUBECACHEDIR": str(kube.kubeconfig.parent / "cache"),
        # `python` is the one the project's packages are installed for.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"set -euo pipefail\n{script}",
        cwd=workdir,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    text = output.decode(errors="replace")
    assert process.returncode == 0, f"{script}\n---\n{text}"
    return text


async def test_rule_the_slinky_steps_of_the_migration_doc_run_as_written(
    kube: Kube, tmp_path: Path
) -> None:
    await _install(kube, slinky_crd())
    await _install(kube, _project_crd("nodesets.nodeflow.dev.yaml"))
    names = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc["metadata"]["namespace"] = kube.namespace
            await kubectl(kube, "create", "-f", "-", stdin=yaml.safe_dump(doc))
            names.append(doc["metadata"]["name"])
    for block in slinky_blocks():
        await bash(block, tmp_path, kube)
    ours = json.loads(await kubectl(kube, "get", "nodesets.nodeflow.dev", "-o", "json"))
    assert sorted(item["metadata"]["name"] for item in ours["items"]) == sorted(names)
    for item in ours["items"]:
        assert item["spec"]["slurmCluster"] == "slurm"
        assert item["spec"]["template"]["spec"]["containers"][0]["name"] == "slurmd"
