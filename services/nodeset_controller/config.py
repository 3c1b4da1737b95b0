"""nodeset-controller settings (environment variables of the same name, upper case)."""

from __future__ import annotations

from nodeflow_contracts.pod_protocol import DEFAULT_LOCK_TOLERATION_KEY
from nodeflow_runtime.config import ServiceConfig
from nodeset_controller.commands import COMMAND_LIFETIME_SECONDS
from nodeset_controller.spec import Defaults


class NodeSetControllerConfig(ServiceConfig, kw_only=True):
    # Service-wide NodeSet options of the reference; each NodeSet may override them.
    scale_down_priority_ordering: bool = True
    force_scaling_delete_known_condition_timeout: float = 0.0
    force_scaling_delete_unknown_condition_timeout: float = 0.0
    # Slurm states older than this are unknown (fail closed); 0: the number of poll
    # intervals the cluster's status names (STALE_AFTER_POLLS x its poll interval).
    slurm_state_max_age_seconds: float = 0.0
    # A pod whose Slurm node has been absent from every successful poll of its (fresh,
    # reachable) cluster for this long runs no job, and may be deleted without a drain.
    slurm_absence_grace_seconds: float = 300.0
    # An unbound pod Pending this long on a node that no longer fits it (others took its
    # room) is replaced on a free feasible node, if there is one.
    pending_pod_replace_seconds: float = 120.0
    # The taint key NodeSet pods tolerate (the reference's, unless a cluster needs another).
    lock_toleration_key: str = DEFAULT_LOCK_TOLERATION_KEY
    # One active replica: the others wait on this lease.
    leader_lease_ttl_seconds: float = 15.0
    # Every NodeSet is re-planned at least this often even when nothing changed.
    resync_seconds: float = 30.0
    # Changes arriving within this window are planned together.
    debounce_seconds: float = 0.05
    # An applied command whose effect KV has not shown for this long frees its slot (one not
    # applied holds it until it can no longer land: the command ledger, docs/protocols.md).
    # At least command_lifetime_seconds: a view may lag that long behind a reconnect.
    in_flight_timeout_seconds: float = 20.0
    # How long a command of ours may be applied (its expires_at). The command ledger holds a
    # command's slots until this plus the landing margin has passed unless its outcome frees
    # them earlier; a new leader rebuilds the ledger before it plans (docs/protocols.md).
    command_lifetime_seconds: float = COMMAND_LIFETIME_SECONDS
    # Most commands published in one batch (JetStream acks outstanding).
    publish_window: int = 512
    # Most pod and claim changes (claims, releases, creates, SlurmDelete set or removed,
    # deletes) sent and not yet visible in KV, over all NodeSets. Like the DaemonSet
    # controller's burst of creates per sync: it keeps the command queue short (about a
    # second of k8s-watcher's writes at 1000 QPS), so a status update never waits behind
    # thousands of commands; a plan turns only this many actions into commands and the rest
    # follow as earlier ones land. Each round re-plans the whole NodeSet, so a smaller window
    # costs more rounds: at 4,000 pods, 256 took 224 plans and 26-29 s where 1024 took 174
    # and 22-23 s (make bench BENCH=nodeset_controller).
    max_commands_in_flight: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "force_scaling_delete_known_condition_timeout",
            "force_scaling_delete_unknown_condition_timeout",
            "slurm_state_max_age_seconds",
            "slurm_absence_grace_seconds",
            "pending_pod_replace_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        for name in (
            "leader_lease_ttl_seconds",
            "resync_seconds",
            "in_flight_timeout_seconds",
            "command_lifetime_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.in_flight_timeout_seconds < self.command_lifetime_seconds:
            # A hold shorter than a command's life frees a slot while the command's effect may
            # still be on its way to the view: the plan would spend the slot twice.
            raise ValueError(
                f"in_flight_timeout_seconds ({self.in_flight_timeout_seconds:g}) must be at "
                f"least command_lifetime_seconds ({self.command_lifetime_seconds:g})"
            )
        if self.debounce_seconds < 0:
            raise ValueError("debounce_seconds must not be negative")
        if self.publish_window < 1:
            raise ValueError("publish_window must be at least 1")
        if self.max_commands_in_flight < 1:
            raise ValueError("max_commands_in_flight must be at least 1")
        if not self.lock_toleration_key:
            raise ValueError("lock_toleration_key must not be empty")

    @property
    def defaults(self) -> Defaults:
        return Defaults(
            scale_down_priority_ordering=self.scale_down_priority_ordering,
            force_delete_known_timeout=self.force_scaling_delete_known_condition_timeout,
            force_delete_unknown_timeout=self.force_scaling_delete_unknown_condition_timeout,
            lock_toleration_key=self.lock_toleration_key,
        )
