"""`python -m topology_placer`: run the topology-placer service."""

from nodeflow_runtime.service import run_main
from topology_placer import SERVICE
from topology_placer.config import TopologyPlacerConfig
from topology_placer.service import setup


def main() -> None:
    run_main(SERVICE, TopologyPlacerConfig, setup)


if __name__ == "__main__":
    main()
