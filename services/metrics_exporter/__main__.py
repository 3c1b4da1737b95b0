"""`python -m metrics_exporter`: run the metrics-exporter service."""

from metrics_exporter import SERVICE
from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import run_main, runtime_only


def main() -> None:
    run_main(SERVICE, ServiceConfig, runtime_only)


if __name__ == "__main__":
    main()
