"""`python -m k8s_watcher`: run the k8s-watcher service."""

from k8s_watcher import SERVICE
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import setup
from nodeflow_runtime.service import run_main


def main() -> None:
    run_main(SERVICE, K8sWatcherConfig, setup)


if __name__ == "__main__":
    main()
