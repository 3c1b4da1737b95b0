"""`python -m nodeset_controller`: run the nodeset-controller service."""

from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import run_main, runtime_only
from nodeset_controller import SERVICE


def main() -> None:
    run_main(SERVICE, ServiceConfig, runtime_only)


if __name__ == "__main__":
    main()
