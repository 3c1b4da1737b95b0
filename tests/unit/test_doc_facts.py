"""Facts the README, k8s/README and docs/configuration.md state about the repository agree with
it: the third-party CRDs `k8s/third-party-crds/` installs, the name of slurmrestd's JWT signing
key file (the one real Slurm is configured with, `AuthAltParameters=jwt_key=...`), and every
setting each service reads."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import msgspec
import yaml

from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.launcher import SERVICES

ROOT = Path(__file__).resolve().parents[2]
OUR_GROUP = "nodeflow.dev"
NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def third_party_crds() -> dict[str, str]:
    """Every CRD in k8s/crds that is not ours, name -> kind: what k8s/third-party-crds
    installs (its kustomization takes ../crds and deletes our two). A kind may come in two
    groups (DeploymentPolicy: skyhook.nvidia.com's and nodewright.nvidia.com's)."""
    crds = {}
    for path in (ROOT / "k8s/crds").glob("*.yaml"):
        document = yaml.safe_load(path.read_text())
        if document.get("kind") != "CustomResourceDefinition":
            continue
        if document["spec"]["group"] != OUR_GROUP:
            crds[document["metadata"]["name"]] = document["spec"]["names"]["kind"]
    return crds


def table_row(page: Path, first_cell: str) -> str:
    (row,) = [line for line in page.read_text().splitlines() if line.startswith(f"| {first_cell}")]
    return row


def test_the_third_party_crds_the_readmes_list_are_those_k8s_third_party_crds_installs() -> None:
    crds = third_party_crds()
    kinds = set(crds.values())
    ours = yaml.safe_load((ROOT / "k8s/third-party-crds/kustomization.yaml").read_text())
    assert len(ours["patches"]) == 2, "k8s/third-party-crds drops exactly our two CRDs"
    count = NUMBERS[len(crds)]
    for page, cell in (
        (ROOT / "README.md", "`k8s/third-party-crds/`"),
        (ROOT / "k8s/README.md", "`third-party-crds/`"),
    ):
        row = table_row(page, cell)
        named = set(re.findall(r"\b[A-Z][A-Za-z]+\b", row)) & kinds
        assert named == kinds, (str(page), kinds - named)
        assert f"the {count} third-party CRDs" in row, (str(page), row)


def slurm_key_file_name() -> str:
    """The file name real Slurm's slurm.conf gives the JWT key (tools/slurm/real_slurm.sh)."""
    script = (ROOT / "tools/slurm/real_slurm.sh").read_text()
    # AuthAltParameters is a comma list (jwt_key=...,jwks=...): take the jwt_key option.
    paths: list[str] = re.findall(
        r"^AuthAltParameters=(?:\S*,)?jwt_key=([^,\s]+)", script, re.MULTILINE
    )
    (path,) = paths
    return path.rsplit("/", 1)[-1]


def test_the_readme_and_the_manifests_name_the_slurm_jwt_key_file_as_slurm_does() -> None:
    name = slurm_key_file_name()
    assert name == "jwt_hs256.key"
    pages = [ROOT / "README.md", *sorted((ROOT / "k8s").rglob("*.yaml")), ROOT / "k8s/README.md"]
    key_files = re.compile(r"\bjwt[\w.-]*\.key\b")
    named = {
        (page.relative_to(ROOT).as_posix(), found)
        for page in pages
        for found in key_files.findall(page.read_text())
    }
    assert named, "nothing names the key file: the check would hold nothing"
    assert {found for _, found in named} == {name}, sorted(named)


SERVICE_CONFIGS = {
    "k8s-watcher": "k8s_watcher.config:K8sWatcherConfig",
    "slurm-syncer": "slurm_syncer.settings:SlurmSyncerConfig",
    "nodeset-controller": "nodeset_controller.config:NodeSetControllerConfig",
    "maintenance-scheduler": "maintenance_scheduler.config:MaintenanceSchedulerConfig",
    "topology-placer": "topology_placer.config:TopologyPlacerConfig",
    "metrics-exporter": "metrics_exporter.service:ExporterConfig",
}


def section(text: str, heading: str) -> str:
    """A `## heading` section of a page, up to the next `## `."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def setting_names(config: type[ServiceConfig]) -> set[str]:
    return {field.name.upper() for field in msgspec.structs.fields(config)}


def test_every_setting_of_every_service_is_documented_where_the_readme_points() -> None:
    """The settings every service shares in the README's Configuration section, each service's
    own in its section of docs/configuration.md, each as `NAME`: a setting a service reads
    that no table names (or a table naming one in the wrong place) fails here."""
    assert set(SERVICE_CONFIGS) == {service for service, _ in SERVICES}
    shared = setting_names(ServiceConfig)
    readme = section((ROOT / "README.md").read_text(), "Configuration")
    assert {name for name in shared if f"`{name}`" not in readme} == set()
    assert "docs/configuration.md" in readme
    page = (ROOT / "docs" / "configuration.md").read_text()
    for service, where in SERVICE_CONFIGS.items():
        module, name = where.split(":")
        config = getattr(importlib.import_module(module), name)
        own = section(page, service)
        missing = {s for s in setting_names(config) - shared if f"`{s}`" not in own}
        assert missing == set(), (service, sorted(missing))
