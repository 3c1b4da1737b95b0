"""`python -m maintenance_scheduler`: run the maintenance-scheduler service."""

from maintenance_scheduler import SERVICE
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.service import setup
from nodeflow_runtime.service import run_main


def main() -> None:
    run_main(SERVICE, MaintenanceSchedulerConfig, setup)


if __name__ == "__main__":
    main()
