"""The launcher starts the simulator as the Slurm release asked for (`--slurm-version`), and
the simulator's own default, the newest release, otherwise (what `make run` gets)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from clustersim.__main__ import build_parser, config_from_args
from nodeflow_runtime.launcher import simulator_argv


def test_launcher_passes_slurm_version_to_the_simulator(tmp_path: Path) -> None:
    args = argparse.Namespace(nodes=4, topology="", slurm_version="24.11")
    argv = simulator_argv(args, tmp_path, None)
    assert argv[argv.index("--slurm-version") + 1] == "24.11"
    simulator = config_from_args(build_parser().parse_args(argv[3:]))
    assert simulator.slurm_version == "24.11"


def test_without_slurm_version_the_simulator_emulates_the_newest(tmp_path: Path) -> None:
    args = argparse.Namespace(nodes=4, topology="", slurm_version=None)
    argv = simulator_argv(args, tmp_path, None)
    assert "--slurm-version" not in argv
    assert config_from_args(build_parser().parse_args(argv[3:])).slurm_version == "26.05"


def test_the_simulator_refuses_a_release_it_does_not_emulate() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--slurm-version", "23.11"])
