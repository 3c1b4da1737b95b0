"""`python -m metrics_exporter`: run the metrics-exporter service."""

from metrics_exporter import SERVICE
from metrics_exporter.service import ExporterConfig, setup
from nodeflow_runtime.service import run_main


def main() -> None:
    run_main(SERVICE, ExporterConfig, setup)


if __name__ == "__main__":
    main()
