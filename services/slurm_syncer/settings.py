"""Configuration of slurm-syncer: the shared settings, then one block per Slurm cluster.

Clusters are listed in SLURM_CLUSTERS (comma separated). Each cluster's settings come from
`SLURM_<CLUSTER>_<SETTING>` (the cluster name upper-cased, non-alphanumerics as `_`, which is
what the simulator writes to .run/env, e.g. SLURM_SIM_URL), falling back to the cluster-less
`SLURM_<SETTING>`: URL, TOKEN, TOKEN_FILE, JWT_KEY_FILE, USER, CA_FILE, API_VERSION. A cluster
authenticates with a static token (TOKEN or TOKEN_FILE) or with a signing key (JWT_KEY_FILE)
from which the syncer mints its own short-lived tokens; a signing key wins when both are
given, since it never expires. An `https://` URL is verified against CA_FILE when set, else
the system trust store; a CA_FILE with a plain `http://` URL is refused (the operator meant
TLS and would not get it). API_VERSION (e.g. v0.0.42) names the slurmrestd API version to
speak instead of the newest one both sides speak (client.SlurmClient.negotiate); one we do not
speak is refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeflow_contracts.pod_protocol import DEFAULT_DRAIN_REASON_PREFIX
from nodeflow_contracts.slurm_api import api_version
from nodeflow_runtime.config import ConfigError, ServiceConfig
from slurm_syncer.nodestate import DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS

PER_CLUSTER_SETTINGS = (
    "URL",
    "TOKEN",
    "TOKEN_FILE",
    "JWT_KEY_FILE",
    "USER",
    "CA_FILE",
    "API_VERSION",
)


class SlurmSyncerConfig(ServiceConfig, kw_only=True):
    """Every field is read from the environment variable of the same name in upper case."""

    slurm_clusters: tuple[str, ...] = ()
    slurm_poll_interval_seconds: float = 5.0
    slurm_request_timeout_seconds: float = 10.0
    # Attempts per Slurm call (connection failures, timeouts and 5xx answers are retried).
    slurm_request_attempts: int = 3
    slurm_retry_initial_seconds: float = 0.2
    slurm_retry_max_seconds: float = 2.0
    # Lifetime of a minted token, and how long before its expiry a new one is minted.
    slurm_token_lifespan_seconds: int = 1800
    slurm_token_refresh_margin_seconds: int = 300
    # Slurm calls (drains, undrains, reads after them) run at most this many at once.
    slurm_max_concurrent_updates: int = 16
    # NOT_RESPONDING counts once seen this long: slurmctld shows it for a moment after every
    # UNDRAIN/RESUME, until slurmd answers its ping (nodestate.settle_not_responding).
    slurm_not_responding_confirm_seconds: float = DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS
    # Drain reasons we write start with this; reasons with it (or the `nodeflow:` of earlier
    # versions) are ours, any other is external and never touched (reasons.py).
    drain_reason_prefix: str = DEFAULT_DRAIN_REASON_PREFIX
    leader_lease_ttl_seconds: float = 15.0

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.slurm_poll_interval_seconds <= 0:
            problems.append("SLURM_POLL_INTERVAL_SECONDS must be positive")
        if self.slurm_request_timeout_seconds <= 0:
            problems.append("SLURM_REQUEST_TIMEOUT_SECONDS must be positive")
        if self.slurm_request_attempts < 1:
            problems.append("SLURM_REQUEST_ATTEMPTS must be at least 1")
        if self.slurm_token_refresh_margin_seconds >= self.slurm_token_lifespan_seconds:
            problems.append("SLURM_TOKEN_REFRESH_MARGIN_SECONDS must be below the lifespan")
        if self.slurm_not_responding_confirm_seconds < 0:
            problems.append("SLURM_NOT_RESPONDING_CONFIRM_SECONDS must not be negative")
        if self.slurm_max_concurrent_updates < 1:
            problems.append("SLURM_MAX_CONCURRENT_UPDATES must be at least 1")
        if not self.drain_reason_prefix.strip():
            problems.append("DRAIN_REASON_PREFIX must not be empty")
        if len(set(self.slurm_clusters)) != len(self.slurm_clusters):
            problems.append("SLURM_CLUSTERS names a cluster twice")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ClusterSettings:
    """Where one Slurm cluster's slurmrestd is and how to authenticate to it."""

    name: str
    url: str
    user: str
    token: str | None = None
    token_file: Path | None = None
    jwt_key_file: Path | None = None
    # The CA that signs slurmrestd's certificate (https only); None: the system trust store.
    ca_file: Path | None = None
    # SLURM_API_VERSION: the slurmrestd API version to speak; None: the newest both speak.
    api_version: str | None = None

    def __repr__(self) -> str:  # never print the token
        return (
            f"ClusterSettings(name={self.name!r}, url={self.url!r}, user={self.user!r}, "
            f"token={'<hidden>' if self.token else None}, token_file={self.token_file}, "
            f"jwt_key_file={self.jwt_key_file}, ca_file={self.ca_file}, "
            f"api_version={self.api_version})"
        )


def env_suffix(cluster: str) -> str:
    """`sim` -> `SIM`, `gpu-east` -> `GPU_EAST` (as the simulator names its variables)."""
    return "".join(c if c.isalnum() else "_" for c in cluster).upper()


def _setting(environ: Mapping[str, str], setting: str, cluster: str) -> str | None:
    for name in (f"SLURM_{env_suffix(cluster)}_{setting}", f"SLURM_{setting}"):
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def cluster_settings(
    clusters: tuple[str, ...], environ: Mapping[str, str]
) -> dict[str, ClusterSettings]:
    """Settings of every listed cluster; ConfigError naming every missing variable."""
    settings: dict[str, ClusterSettings] = {}
    problems: list[str] = []
    for cluster in clusters:
        suffix = env_suffix(cluster)
        url = _setting(environ, "URL", cluster)
        token = _setting(environ, "TOKEN", cluster)
        token_file = _setting(environ, "TOKEN_FILE", cluster)
        key_file = _setting(environ, "JWT_KEY_FILE", cluster)
        ca_file = _setting(environ, "CA_FILE", cluster)
        version = _setting(environ, "API_VERSION", cluster)
        if url is None:
            problems.append(f"cluster {cluster!r}: set SLURM_{suffix}_URL or SLURM_URL")
            continue
        if ca_file is not None and not url.lower().startswith("https://"):
            problems.append(
                f"cluster {cluster!r}: a CA file (SLURM_{suffix}_CA_FILE or SLURM_CA_FILE) "
                f"needs an https:// URL, got {url!r}"
            )
            continue
        if not (token or token_file or key_file):
            problems.append(
                f"cluster {cluster!r}: set SLURM_{suffix}_JWT_KEY_FILE, SLURM_{suffix}_TOKEN_FILE"
                f" or SLURM_{suffix}_TOKEN (or the same without the cluster name)"
            )
            continue
        if version is not None:
            try:
                version = api_version(version).name
            except ValueError as exc:
                problems.append(
                    f"cluster {cluster!r}: SLURM_{suffix}_API_VERSION or SLURM_API_VERSION: {exc}"
                )
                continue
        settings[cluster] = ClusterSettings(
            name=cluster,
            url=url.rstrip("/"),
            user=_setting(environ, "USER", cluster) or "slurm",
            token=token,
            token_file=Path(token_file) if token_file else None,
            jwt_key_file=Path(key_file) if key_file else None,
            ca_file=Path(ca_file) if ca_file else None,
            api_version=version,
        )
    if problems:
        raise ConfigError("invalid Slurm configuration: " + "; ".join(problems))
    return settings
