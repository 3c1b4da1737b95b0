"""`python -m slurm_syncer`: run the slurm-syncer service."""

from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import run_main, runtime_only
from slurm_syncer import SERVICE


def main() -> None:
    run_main(SERVICE, ServiceConfig, runtime_only)


if __name__ == "__main__":
    main()
