"""`kubectl nodeflow migrate` (issue #35): the converter of docs/migration.md behind the
plugin, the same output and exit codes as `python -m nodeset_controller.migrate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.nodeset_controller.test_migrate import SLINKY_EXAMPLES


def run(*argv: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_rule_kubectl_nodeflow_migrate_slinky_writes_what_the_converter_writes() -> None:
    example: Path = SLINKY_EXAMPLES[0]
    plugin = run("-m", "nodeflow_cli.main", "migrate", "slinky", stdin=example.read_text())
    converter = run("-m", "nodeset_controller.migrate", "slinky", stdin=example.read_text())
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout == converter.stdout and plugin.stderr == converter.stderr
    assert [d["kind"] for d in yaml.safe_load_all(plugin.stdout) if d]


def test_rule_kubectl_nodeflow_migrate_keeps_the_converters_options_and_exit_codes() -> None:
    example = SLINKY_EXAMPLES[0].read_text()
    named = run(
        "-m", "nodeflow_cli.main", "migrate", "slinky", "--slurm-cluster", "main", stdin=example
    )
    assert named.returncode == 0, named.stderr
    assert {d["spec"]["slurmCluster"] for d in yaml.safe_load_all(named.stdout) if d} == {"main"}
    refused = run("-m", "nodeflow_cli.main", "migrate", "slinky", stdin="kind: Service\n")
    assert refused.returncode == 1
    assert "error: input: no NodeSet found" in refused.stderr
    usage = run("-m", "nodeflow_cli.main", "migrate", "slinky", "--help", stdin="")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: kubectl nodeflow migrate")
