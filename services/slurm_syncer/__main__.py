"""`python -m slurm_syncer`: run the slurm-syncer service."""

from nodeflow_runtime.service import run_main
from slurm_syncer import SERVICE
from slurm_syncer.service import setup
from slurm_syncer.settings import SlurmSyncerConfig


def main() -> None:
    run_main(SERVICE, SlurmSyncerConfig, setup)


if __name__ == "__main__":
    main()
