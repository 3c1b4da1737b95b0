"""`make image`: one multi-arch image (linux/amd64 and linux/arm64) with docker buildx or podman,
this machine's architecture alone, said so, with a docker that has no buildx.

No container engine runs here, so the engines are stand-ins on a PATH of their own that record
the commands the Makefile gives them (and answer `docker buildx version` as told): what is
held is the Makefile's choice and its commands, not a build.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
IMAGE = "registry.example.com/nodeflow:9.9.9"

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def engine(bin_dir: Path, name: str, *, buildx: bool = True) -> None:
    """A stand-in `name` that appends its arguments to calls.log; without buildx, `docker
    buildx version` fails (and is not recorded)."""
    script = bin_dir / name
    refuse = "" if buildx else 'if [ "$1 $2" = "buildx version" ]; then exit 1; fi\n'
    script.write_text(
        f'#!/bin/bash\n{refuse}echo "{name} $*" >> "{bin_dir.parent / "calls.log"}"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def make_image(tmp_path: Path, *engines: tuple[str, bool]) -> tuple[int, str, list[str]]:
    """`make image` with only the given engines (and uname) on PATH: exit code, output, and
    the engine commands it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, buildx in engines:
        engine(bin_dir, name, buildx=buildx)
    uname = shutil.which("uname")
    assert uname is not None
    (bin_dir / "uname").symlink_to(uname)
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "--no-print-directory", "-C", str(ROOT), "image", f"IMAGE={IMAGE}"],
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=False,
    )
    log = tmp_path / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, calls


def test_docker_with_buildx_builds_and_pushes_one_image_for_amd64_and_arm64(
    tmp_path: Path,
) -> None:
    code, _, calls = make_image(tmp_path, ("docker", True))
    assert code == 0
    assert calls == [
        "docker buildx version",
        f"docker buildx build --platform linux/amd64,linux/arm64 --target runtime -t {IMAGE} "
        "--push .",
    ]


def test_podman_builds_a_manifest_list_for_both_architectures_and_pushes_all_of_it(
    tmp_path: Path,
) -> None:
    code, _, calls = make_image(tmp_path, ("podman", True))
    assert code == 0
    assert calls == [
        f"podman manifest rm {IMAGE}",
        f"podman build --platform linux/amd64,linux/arm64 --target runtime --manifest {IMAGE} .",
        f"podman manifest push --all {IMAGE} docker://{IMAGE}",
    ]


def test_podman_is_preferred_to_a_docker_without_buildx(tmp_path: Path) -> None:
    code, _, calls = make_image(tmp_path, ("docker", False), ("podman", True))
    assert code == 0
    assert any(call.startswith("podman build --platform linux/amd64,linux/arm64") for call in calls)
    assert not any(call.startswith("docker build") for call in calls)


def test_docker_without_buildx_builds_this_architecture_only_and_says_so(tmp_path: Path) -> None:
    code, output, calls = make_image(tmp_path, ("docker", False))
    assert code == 0
    assert "docker buildx not found" in output
    assert "this machine's architecture only" in output
    assert calls == [
        f"docker build --target runtime -t {IMAGE} .",
        f"docker push {IMAGE}",
    ]


def test_no_engine_fails_with_a_message(tmp_path: Path) -> None:
    code, output, calls = make_image(tmp_path)
    assert code != 0
    assert "neither docker nor podman found" in output
    assert calls == []
