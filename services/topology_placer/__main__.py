"""`python -m topology_placer`: run the topology-placer service."""

from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import run_main, runtime_only
from topology_placer import SERVICE


def main() -> None:
    run_main(SERVICE, ServiceConfig, runtime_only)


if __name__ == "__main__":
    main()
