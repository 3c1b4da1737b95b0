"""`python -m nodeset_controller`: run the nodeset-controller service."""

from nodeflow_runtime.service import run_main
from nodeset_controller import SERVICE
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import setup


def main() -> None:
    run_main(SERVICE, NodeSetControllerConfig, setup)


if __name__ == "__main__":
    main()
