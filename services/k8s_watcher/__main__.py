"""`python -m k8s_watcher`: run the k8s-watcher service."""

from k8s_watcher import SERVICE
from nodeflow_runtime.config import ServiceConfig
from nodeflow_runtime.service import run_main, runtime_only


def main() -> None:
    run_main(SERVICE, ServiceConfig, runtime_only)


if __name__ == "__main__":
    main()
