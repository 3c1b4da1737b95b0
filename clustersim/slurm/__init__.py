"""Emulated slurmrestd v0.0.41 (Slurm 24.11) for tests and the local stack."""

from clustersim.slurm.auth import mint_token, verify_token, write_key_file
from clustersim.slurm.clock import Clock, ManualClock, SystemClock
from clustersim.slurm.errors import SlurmError
from clustersim.slurm.model import JobRequest, Partition, SlurmCluster
from clustersim.slurm.server import Faults, RunningSlurm, SlurmEmulator, run_slurm_emulator

__all__ = [
    "Clock",
    "Faults",
    "JobRequest",
    "ManualClock",
    "Partition",
    "RunningSlurm",
    "SlurmCluster",
    "SlurmEmulator",
    "SlurmError",
    "SystemClock",
    "mint_token",
    "run_slurm_emulator",
    "verify_token",
    "write_key_file",
]
