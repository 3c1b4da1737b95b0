"""maintenance-scheduler settings (environment variables of the same name, upper case)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE
from nodeflow_runtime.config import ServiceConfig


class MaintenanceSchedulerConfig(ServiceConfig, kw_only=True):
    # Namespace of the MaintenanceOperatorConfig named `default` that the service honours.
    operator_namespace: str = "nodeflow-system"
    # One active replica: the others wait on this lease.
    leader_lease_ttl_seconds: Annotated[float, Meta(gt=0)] = 15.0
    # Everything is looked at again at least this often, even when nothing changed.
    resync_seconds: Annotated[float, Meta(gt=0)] = 10.0
    # Changes arriving within this window are handled together.
    debounce_seconds: Annotated[float, Meta(ge=0)] = 0.05
    # A command with no visible effect for this long may be sent again.
    in_flight_timeout_seconds: Annotated[float, Meta(gt=0)] = 30.0
    # An eviction that failed (a PodDisruptionBudget held it past k8s-watcher's retries) is
    # sent again after this, doubling up to the maximum.
    eviction_retry_initial_seconds: Annotated[float, Meta(gt=0)] = 5.0
    eviction_retry_max_seconds: Annotated[float, Meta(gt=0)] = 120.0
    # Slurm states older than this (seconds since slurm-syncer's last successful poll of the
    # cluster) count as unknown; 0 uses slurm-syncer's own staleness rule.
    slurm_state_max_age_seconds: Annotated[float, Meta(ge=0)] = 0.0
    # A node absent from the k8s_nodes view counts as gone (its requests free their slot and
    # lose their finalizer) only once it has been absent this long: the view can lack a live
    # node (k8s-watcher's label selector drops a node whose labels stop matching).
    node_gone_grace_seconds: Annotated[float, Meta(ge=0)] = 300.0
    # Most messages published in one batch (JetStream acks outstanding).
    publish_window: Annotated[int, Meta(ge=1)] = 256
    # The Skyhook controller (skyhook.nvidia.com): node packages as batch/v1 Jobs.
    skyhook_enabled: bool = True
    # Namespace of the stage Jobs and of the NodeMaintenance requests of interrupts: stages
    # change the host, so their pods must be allowed to be privileged, which the services'
    # own namespace (Pod Security `restricted`) refuses.
    # k8s-watcher's SKYHOOK_NAMESPACE must be the same: it mirrors the ConfigMaps the
    # controller writes from there only.
    skyhook_namespace: str = DEFAULT_SKYHOOK_NAMESPACE
    # A stage whose image has not pulled (ErrImagePull/ImagePullBackOff) this long after its
    # pod was created is failed, and its package marked erroring, naming the image.
    skyhook_image_pull_grace_seconds: Annotated[float, Meta(ge=0)] = 120.0
    # activeDeadlineSeconds of a stage Job when its package sets no stageTimeout; 0: none.
    skyhook_stage_timeout_seconds: Annotated[int, Meta(ge=0)] = 3600
    # drainSpec.timeoutSeconds of the NodeMaintenance an interrupt requests.
    skyhook_drain_timeout_seconds: Annotated[int, Meta(ge=0)] = 600
    # The package pod contract, as upstream's operator settings of the same name without the
    # SKYHOOK_ prefix (AGENT_IMAGE, COPY_DIR_ROOT, AGENT_LOG_ROOT, IMAGE_PULL_SECRET,
    # RUNTIME_REQUIRED_TAINT). The agent image runs every stage (with a tag, as upstream
    # requires); a package's agentImageOverride replaces it.
    skyhook_agent_image: Annotated[str, Meta(pattern=r"^[^\s]+:[^\s/]+$")] = (
        "nvcr.io/nvidia/skyhook/agent:v6.4.1"
    )
    # Where a package's files are copied on the host: <root>/<skyhook>/<pkg>-<version>-...
    skyhook_copy_dir_root: Annotated[str, Meta(pattern=r"^/")] = "/var/lib/skyhook"
    # SKYHOOK_LOG_DIR of the agent: <root>/<skyhook>.
    skyhook_agent_log_root: Annotated[str, Meta(pattern=r"^/")] = "/var/log/skyhook"
    # A Secret in SKYHOOK_NAMESPACE the package pods pull their images with; empty: none.
    skyhook_image_pull_secret: str = ""
    # The taint a runtime-required Skyhook's nodes carry; package pods tolerate it.
    skyhook_runtime_required_taint: Annotated[
        str, Meta(pattern=r"^[^=:\s]+(=[^=:\s]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$")
    ] = "skyhook.nvidia.com=runtime-required:NoSchedule"
    # A NodeWright's (nodewright.nvidia.com/v1alpha1) runtime-required taint: the renamed
    # release's own key, so the two kinds never clear each other's taint.
    skyhook_nodewright_runtime_required_taint: Annotated[
        str, Meta(pattern=r"^[^=:\s]+(=[^=:\s]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$")
    ] = "nodewright.nvidia.com=runtime-required:NoSchedule"
