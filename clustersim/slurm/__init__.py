"""Emulated slurmrestd of Slurm 24.11 (API v0.0.41-v0.0.42) or 26.05 (v0.0.42-v0.0.45) for
tests and the local stack."""

from clustersim.slurm.auth import mint_token, verify_token, write_key_file
from clustersim.slurm.clock import Clock, ManualClock, SystemClock
from clustersim.slurm.errors import SlurmError
from clustersim.slurm.model import JobRequest, Partition, SlurmCluster
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION, SLURM_RELEASES, SlurmRelease
from clustersim.slurm.server import Faults, RunningSlurm, SlurmEmulator, run_slurm_emulator

__all__ = [
    "DEFAULT_SLURM_VERSION",
    "SLURM_RELEASES",
    "Clock",
    "Faults",
    "JobRequest",
    "ManualClock",
    "Partition",
    "RunningSlurm",
    "SlurmCluster",
    "SlurmEmulator",
    "SlurmError",
    "SlurmRelease",
    "SystemClock",
    "mint_token",
    "run_slurm_emulator",
    "verify_token",
    "write_key_file",
]
