"""The Slurm releases the emulator can be, and the slurmrestd API versions each serves.

Facts of the real releases: slurmrestd 24.11 loads data_parser v0.0.40, v0.0.41 and v0.0.42;
26.05 loads v0.0.42 to v0.0.45. The emulator serves the versions Nodeflow speaks
(nodeflow_contracts.slurm_api), so 24.11 is served without v0.0.40.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.slurm import errors as e
from nodeflow_contracts.slurm_api import API_VERSIONS, SlurmApiVersion


@dataclass(frozen=True)
class SlurmRelease:
    name: str  # "26.05", what --slurm-version takes
    release: str  # "26.05.2", what `meta.slurm.release` says
    api_versions: tuple[SlurmApiVersion, ...]  # served, oldest first
    # slurmctld's error for a RESUME of a node neither drained nor down (seen on each release).
    invalid_resume_error: int

    @property
    def version_parts(self) -> tuple[str, str, str]:
        major, minor, micro = self.release.split(".")
        return major, minor, micro

    @property
    def newest(self) -> SlurmApiVersion:
        return self.api_versions[-1]


def _versions(*names: str) -> tuple[SlurmApiVersion, ...]:
    return tuple(API_VERSIONS[name] for name in names)


SLURM_RELEASES: Mapping[str, SlurmRelease] = {
    release.name: release
    for release in (
        SlurmRelease(
            "24.11", "24.11.5", _versions("v0.0.41", "v0.0.42"), e.ESLURM_INVALID_NODE_STATE
        ),
        SlurmRelease(
            "26.05",
            "26.05.5",
            _versions("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
            e.ESLURM_INVALID_NODE_STATE_TRANSITION,
        ),
    )
}
DEFAULT_SLURM_VERSION = "26.05"


def slurm_release(name: str) -> SlurmRelease:
    release = SLURM_RELEASES.get(name)
    if release is None:
        raise ValueError(
            f"the emulator has no Slurm {name!r} (it emulates: {', '.join(SLURM_RELEASES)})"
        )
    return release
