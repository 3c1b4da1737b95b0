"""`kubectl nodeflow doctor`'s checks, pure: fetched objects in, OK/WARN/FAIL/SKIP out."""

from __future__ import annotations

import datetime
from typing import Any

from nodeflow_cli import doctor
from nodeflow_cli.doctor import Check, NatsFacts, StreamHealth
from nodeflow_contracts.permissions import SERVICES, lease_names
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import WATCHED_KINDS

NOW = 1_800_000_000.0
NS = "nodeflow-system"


def rfc3339(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


def obj(name: str, namespace: str = NS, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, **fields}


def lease(name: str, renewed: float, holder: str = "r-1", duration: int = 15) -> dict[str, Any]:
    spec = {
        "holderIdentity": holder,
        "renewTime": rfc3339(renewed),
        "leaseDurationSeconds": duration,
    }
    return obj(name, spec=spec)


def deployment(name: str, *, ready: int, replicas: int = 1, **pod: Any) -> dict[str, Any]:
    return obj(
        name,
        spec={"replicas": replicas, "template": {"spec": pod}},
        status={"readyReplicas": ready},
    )


def by_name(checks: list[Check]) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in checks}


# --- output ---------------------------------------------------------------------------------


def test_format_one_line_per_check_status_name_detail() -> None:
    lines = doctor.format_checks([Check("OK", "nats", "up"), Check("FAIL", "crd x", "missing")])
    assert lines == ["OK    nats  up", "FAIL  crd x  missing"]


def test_exit_fails_on_any_fail_not_on_warn_or_skip() -> None:
    assert not doctor.failed([Check("OK", "a", ""), Check("WARN", "b", ""), Check("SKIP", "c", "")])
    assert doctor.failed([Check("OK", "a", ""), Check("FAIL", "b", "")])


# --- Secrets --------------------------------------------------------------------------------


def test_secrets_expected_without_deployments_are_every_nats_users_credentials() -> None:
    expected = doctor.default_secrets()
    assert expected["nodeflow-k8s-watcher-nats"] == {"user", "password"}
    assert expected["nodeflow-admin-nats"] == {"user", "password"}
    assert len(expected) == len(SERVICES) + 1


def test_secrets_expected_are_those_the_deployments_reference_optional_ones_left_out() -> None:
    pod: dict[str, Any] = {
        "containers": [
            {
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "password"}}},
                    {
                        "name": "B",
                        "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k", "optional": True}},
                    },
                    {"name": "C", "value": "plain"},
                ],
                "envFrom": [{"secretRef": {"name": "s3"}}],
            }
        ],
        "volumes": [
            {
                "name": "jwt",
                "secret": {"secretName": "s4", "items": [{"key": "jwt.key", "path": "k"}]},
            }
        ],
    }
    assert doctor.referenced_secrets([deployment("slurm-syncer", ready=1, **pod)]) == {
        "s1": {"password"},
        "s3": set(),
        "s4": {"jwt.key"},
    }


def test_secrets_fail_when_a_secret_is_missing() -> None:
    checks = by_name(doctor.check_secrets({"nats-a": {"password"}}, [], NS))
    assert checks[f"secret {NS}/nats-a"][0] == "FAIL"
    assert "missing" in checks[f"secret {NS}/nats-a"][1]


def test_rule_a_missing_secret_only_warns_while_no_nodeflow_deployment_mounts_it() -> None:
    """The local stack on a real control plane (services as processes, the namespace there)
    or a namespace made before `kubectl apply`: nothing fails to start for want of it."""
    checks = by_name(doctor.check_secrets({"nats-a": {"password"}}, [], NS, deployed=False))
    status, detail = checks[f"secret {NS}/nats-a"]
    assert status == "WARN" and "create it before deploying" in detail
    assert not doctor.failed(doctor.check_secrets({"nats-a": set()}, [], NS, deployed=False))


def test_secrets_fail_when_a_key_is_missing() -> None:
    secrets = [obj("nats-a", data={"user": "eA=="})]
    checks = by_name(doctor.check_secrets({"nats-a": {"user", "password"}}, secrets, NS))
    assert checks[f"secret {NS}/nats-a"] == ("FAIL", "missing key(s) password")


def test_secrets_ok_when_present_with_their_keys() -> None:
    secrets = [obj("nats-a", data={"user": "eA==", "password": "eQ=="})]
    checks = by_name(doctor.check_secrets({"nats-a": {"user", "password"}}, secrets, NS))
    assert checks[f"secret {NS}/nats-a"] == ("OK", "present (password, user)")


def test_secrets_skip_when_the_api_serves_none() -> None:
    assert [c.status for c in doctor.check_secrets({"a": set()}, None, NS)] == ["SKIP"]


# --- CRDs -----------------------------------------------------------------------------------


def crd(name: str, *versions: tuple[str, bool, bool]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"versions": [{"name": v, "served": s, "storage": st} for v, s, st in versions]},
    }


def all_crds() -> list[dict[str, Any]]:
    return [crd(f"{k.plural}.{k.group}", (k.version, True, True)) for k in doctor.custom_kinds()]


def test_crds_checked_are_the_watched_kinds_a_crd_provides() -> None:
    names = {k.kind for k in doctor.custom_kinds()}
    assert {"NodeSet", "PodGroup", "NodeMaintenance", "Skyhook"} <= names
    assert not names & {"Pod", "Node", "Job", "PodDisruptionBudget", "ControllerRevision"}
    assert "StorageClass" not in names
    # One CRD per (kind, group): DeploymentPolicy is served by skyhook's and nodewright's.
    assert len({(k.kind, k.group) for k in doctor.custom_kinds()}) == len(
        [k for k in WATCHED_KINDS if k.served_by_crd]
    )


def test_crd_owners_are_the_services_writing_status_else_those_reading_it() -> None:
    assert doctor.crd_owners("NodeSet") == "status by nodeset-controller"
    assert doctor.crd_owners("PodGroup") == "status by topology-placer"
    assert doctor.crd_owners("DeploymentPolicy") == "read by maintenance-scheduler"


def test_crds_ok_when_installed_serving_the_version_the_services_use() -> None:
    checks = by_name(doctor.check_crds(all_crds()))
    assert checks["crd nodesets.nodeflow.dev"] == (
        "OK",
        "v1alpha1 (served, storage); status by nodeset-controller",
    )
    assert {status for status, _ in checks.values()} == {"OK"}


def test_crds_fail_when_one_is_not_installed() -> None:
    crds = [c for c in all_crds() if c["metadata"]["name"] != "podgroups.scheduling.sigs.k8s.io"]
    checks = by_name(doctor.check_crds(crds))
    assert checks["crd podgroups.scheduling.sigs.k8s.io"] == (
        "FAIL",
        "not installed (PodGroup: status by topology-placer)",
    )


def test_crds_fail_when_the_version_the_services_use_is_not_served() -> None:
    crds = [c for c in all_crds() if c["metadata"]["name"] != "nodesets.nodeflow.dev"]
    crds.append(crd("nodesets.nodeflow.dev", ("v1alpha1", False, False), ("v1beta1", True, True)))
    status, detail = by_name(doctor.check_crds(crds))["crd nodesets.nodeflow.dev"]
    assert status == "FAIL"
    assert detail.startswith("v1alpha1 not served (versions v1alpha1, v1beta1 (served, storage))")


# --- COMMAND_NAMESPACES ---------------------------------------------------------------------


def watcher(
    env: list[dict[str, Any]], env_from: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return deployment("k8s-watcher", ready=1, containers=[{"env": env, "envFrom": env_from or []}])


def test_command_namespaces_read_from_a_value_a_configmap_key_or_envfrom() -> None:
    plain = watcher([{"name": "COMMAND_NAMESPACES", "value": "a,b"}])
    assert doctor.env_setting(plain, "COMMAND_NAMESPACES", {}) == "a,b"
    keyed = watcher(
        [
            {
                "name": "COMMAND_NAMESPACES",
                "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "ns"}},
            }
        ]
    )
    assert doctor.env_configmaps(keyed) == {"cm"}
    assert doctor.env_setting(keyed, "COMMAND_NAMESPACES", {"cm": {"data": {"ns": "c"}}}) == "c"
    whole = watcher([], [{"configMapRef": {"name": "settings"}}])
    settings = {"settings": {"data": {"COMMAND_NAMESPACES": "d"}}}
    assert doctor.env_setting(whole, "COMMAND_NAMESPACES", settings) == "d"
    assert doctor.env_setting(watcher([]), "COMMAND_NAMESPACES", {}) is None


def in_use() -> dict[str, set[str]]:
    return doctor.namespaces_in_use(
        {"NodeSet": [obj("gpu", "slurm")], "PodGroup": [obj("train", "team-b")]}
    )


def test_command_namespaces_fail_when_a_namespace_in_use_is_left_out() -> None:
    check = doctor.check_command_namespaces("slurm", in_use(), NS)
    assert check.status == "FAIL"
    assert "leaves out team-b (PodGroup)" in check.detail


def test_command_namespaces_ok_when_they_cover_every_namespace_in_use() -> None:
    check = doctor.check_command_namespaces("slurm, team-b", in_use(), NS)
    assert check == Check(
        "OK",
        "command-namespaces",
        "COMMAND_NAMESPACES=slurm,team-b covers slurm (NodeSet), team-b (PodGroup)",
    )


def test_command_namespaces_ok_when_unset_commands_act_everywhere() -> None:
    assert doctor.check_command_namespaces("", in_use(), NS).status == "OK"


def test_command_namespaces_skip_without_a_k8s_watcher_deployment() -> None:
    assert doctor.check_command_namespaces(None, in_use(), NS).status == "SKIP"


# --- koord-scheduler ------------------------------------------------------------------------


def test_scheduler_names_of_the_placer_default_to_its_config() -> None:
    assert doctor.placer_scheduler_names(None) == ("koord-scheduler", "nodeflow-placer")
    assert doctor.placer_scheduler_names("mine, other") == ("mine", "other")


def pod(name: str, scheduler: str = "koord-scheduler", **spec: Any) -> dict[str, Any]:
    return obj(
        name, "default", spec={"schedulerName": scheduler, **spec}, status={"phase": "Pending"}
    )


def test_scheduler_pending_pods_are_unbound_ones_asking_for_it() -> None:
    pods = [pod("a"), pod("b", nodeName="n1"), pod("c", scheduler="default-scheduler")]
    assert doctor.pending_pods(pods, "koord-scheduler") == ["default/a"]


def test_scheduler_others_are_a_ready_deployment_or_a_fresh_lease_of_its_name() -> None:
    deployments = [
        deployment("koord-scheduler", ready=1)
        | {"metadata": {"name": "koord-scheduler", "namespace": "koordinator-system"}},
        deployment("koord-scheduler", ready=0)
        | {"metadata": {"name": "koord-scheduler", "namespace": "idle"}},
    ]
    leases = [
        lease("koord-scheduler", NOW - 2),
        lease("koord-scheduler", NOW - 600)
        | {"metadata": {"name": "koord-scheduler", "namespace": "old"}},
    ]
    assert doctor.other_schedulers(deployments, leases, "koord-scheduler", NOW) == [
        "Deployment koordinator-system/koord-scheduler",
        f"Lease {NS}/koord-scheduler",
    ]


def test_scheduler_fails_when_a_second_scheduler_also_serves_it() -> None:
    check = doctor.check_scheduler(
        [], ("koord-scheduler",), True, ["Deployment koordinator-system/koord-scheduler"]
    )
    assert check.status == "FAIL"
    assert "served by 2 schedulers (topology-placer, Deployment koordinator-system" in check.detail


def test_scheduler_fails_when_pods_wait_and_nothing_serves_it() -> None:
    check = doctor.check_scheduler(["default/a"], ("koord-scheduler",), False, [])
    assert check == Check(
        "FAIL",
        "scheduler koord-scheduler",
        "no scheduler serves it: topology-placer serves it but has no fresh leader; "
        "1 pod(s) pending (default/a)",
    )
    other = doctor.check_scheduler(["default/a"], ("nodeflow-placer",), True, [])
    assert (
        other.status == "FAIL"
        and "does not serve it (SCHEDULER_NAMES=nodeflow-placer)" in other.detail
    )


def test_scheduler_warns_when_nothing_serves_it_and_no_pod_waits() -> None:
    assert doctor.check_scheduler([], ("koord-scheduler",), False, []).status == "WARN"


def test_scheduler_ok_when_one_scheduler_serves_it() -> None:
    check = doctor.check_scheduler(["default/a"], ("koord-scheduler",), True, [])
    assert check == Check(
        "OK", "scheduler koord-scheduler", "served by topology-placer; 1 pod(s) pending (default/a)"
    )
    assert doctor.check_scheduler([], (), True, ["Lease x/koord-scheduler"]).status == "OK"


# --- Slurm ----------------------------------------------------------------------------------


def slurm(**fields: Any) -> SlurmClusterStatus:
    base: dict[str, Any] = {
        "cluster": "main",
        "reachable": True,
        "last_poll_at": NOW - 3,
        "last_success_at": NOW - 3,
        "poll_interval_seconds": 10.0,
        "api_version": "v0.0.42",
        "nodes_listed": 16,
    }
    return SlurmClusterStatus(**(base | fields))


def test_slurm_ok_names_the_api_version_spoken() -> None:
    assert doctor.check_slurm([slurm()], NOW, "") == [
        Check("OK", "slurm main", "slurmrestd API v0.0.42; last poll 3s ago, 16 nodes")
    ]


def test_slurm_fails_when_the_cluster_is_unreachable() -> None:
    [check] = doctor.check_slurm([slurm(reachable=False, error="connection refused")], NOW, "")
    assert check.status == "FAIL" and check.detail.startswith("unreachable: connection refused")


def test_slurm_fails_when_its_state_is_stale() -> None:
    [check] = doctor.check_slurm(
        [slurm(last_poll_at=NOW - 100, last_success_at=NOW - 100)], NOW, ""
    )
    assert check.status == "FAIL"
    assert check.detail.startswith("stale: last successful poll 100s ago (poll every 10s)")


def test_slurm_warns_when_no_api_version_was_negotiated() -> None:
    [check] = doctor.check_slurm([slurm(api_version="")], NOW, "")
    assert check == Check("WARN", "slurm main", "API version not negotiated; last poll 3s ago")


def test_slurm_warns_when_no_cluster_is_reported_and_skips_without_nats() -> None:
    assert doctor.check_slurm([], NOW, "")[0].status == "WARN"
    assert doctor.check_slurm(None, NOW, "no NATS") == [Check("SKIP", "slurm", "no NATS")]


# --- NATS -----------------------------------------------------------------------------------


def facts(*health: StreamHealth, streams: int | None = 9) -> NatsFacts:
    return NatsFacts("nats-0:4222", "2.11.0", "nodeflow", streams, 20, "timeout", health)


def test_nats_ok_when_jetstream_answers_and_every_stream_has_a_leader() -> None:
    checks = by_name(
        doctor.check_nats(facts(StreamHealth("A", True, "nats-0", clustered=True)), "")
    )
    assert checks["nats"] == (
        "OK",
        "nats-0:4222 (nats-server 2.11.0, cluster nodeflow): JetStream 9 streams, 20 consumers",
    )
    assert checks["nats streams"] == ("OK", "all 1 declared streams have a leader")


def test_nats_fails_when_jetstream_does_not_answer() -> None:
    [check] = doctor.check_nats(facts(streams=None), "")
    assert check.status == "FAIL" and check.detail.endswith("JetStream does not answer: timeout")


def test_nats_streams_fail_when_one_is_missing_or_has_no_leader() -> None:
    checks = by_name(
        doctor.check_nats(
            facts(StreamHealth("A", False), StreamHealth("B", True, "", clustered=True)), ""
        )
    )
    assert checks["nats streams"] == ("FAIL", "missing: A; no leader: B")


def test_nats_streams_warn_when_a_replica_is_not_current() -> None:
    health = StreamHealth("A", True, "nats-0", lagging=("nats-2",), clustered=True)
    assert by_name(doctor.check_nats(facts(health), ""))["nats streams"] == (
        "WARN",
        "replicas not current: A (nats-2)",
    )


def test_nats_skip_with_the_reason_without_nats() -> None:
    assert {c.status for c in doctor.check_nats(None, "no URL")} == {"SKIP"}


# --- leaders --------------------------------------------------------------------------------


def every_lease(renewed: float = NOW - 2) -> list[dict[str, Any]]:
    return [lease(name, renewed) for s in SERVICES for name in lease_names(s)]


def test_leaders_ok_when_each_lease_was_renewed_within_its_duration() -> None:
    checks = by_name(doctor.check_leaders(every_lease(), NS, NOW))
    assert checks["leader nodeset-controller"] == ("OK", "r-1, renewed 2s ago")
    assert "leader maintenance-scheduler-skyhook" in checks
    assert {status for status, _ in checks.values()} == {"OK"}


def test_leaders_fail_when_a_lease_is_stale() -> None:
    leases = [x for x in every_lease() if x["metadata"]["name"] != "topology-placer"]
    leases.append(lease("topology-placer", NOW - 60))
    checks = by_name(doctor.check_leaders(leases, NS, NOW))
    assert checks["leader topology-placer"] == (
        "FAIL",
        "stale: r-1 renewed it 60s ago (lease 15s): no replica leads",
    )


def test_leaders_fail_when_a_lease_is_released_or_missing() -> None:
    leases = [
        x for x in every_lease() if x["metadata"]["name"] not in {"slurm-syncer", "k8s-watcher"}
    ]
    leases.append(lease("slurm-syncer", NOW - 1, holder=""))
    checks = by_name(doctor.check_leaders(leases, NS, NOW))
    assert checks["leader slurm-syncer"] == ("FAIL", "released: no replica holds it")
    assert checks["leader k8s-watcher"] == ("FAIL", f"no Lease {NS}/k8s-watcher: no leader")


# --- readiness ------------------------------------------------------------------------------


def test_readiness_skips_when_the_services_are_not_deployments() -> None:
    expected = [Check("SKIP", "ready", f"not deployed as Deployments in {NS}")]
    assert doctor.check_readiness(None, NS) == expected
    assert doctor.check_readiness([deployment("other", ready=1)], NS) == expected


def test_readiness_ok_warn_fail_by_ready_replicas_and_fail_without_a_deployment() -> None:
    deployments = [deployment(s, ready=2, replicas=2) for s in SERVICES if s != "metrics-exporter"]
    deployments[0] = deployment(SERVICES[0], ready=1, replicas=2)
    deployments[1] = deployment(SERVICES[1], ready=0, replicas=2)
    checks = by_name(doctor.check_readiness(deployments, NS))
    assert checks[f"ready {SERVICES[0]}"] == ("WARN", "1/2 replicas ready")
    assert checks[f"ready {SERVICES[1]}"] == ("FAIL", "0/2 replicas ready")
    assert checks[f"ready {SERVICES[2]}"] == ("OK", "2/2 replicas ready")
    assert checks["ready metrics-exporter"] == ("FAIL", f"no Deployment {NS}/metrics-exporter")


# --- what was not read ----------------------------------------------------------------------


def test_each_check_says_skip_with_the_reason_when_its_source_was_not_read() -> None:
    why = "X not read: the caller may not list them (HTTP 403)"
    assert doctor.check_secrets({"a": set()}, None, NS, why) == [Check("SKIP", "secrets", why)]
    assert doctor.check_crds(None, why) == [Check("SKIP", "crds", why)]
    assert doctor.check_command_namespaces("a", in_use(), NS, why) == Check(
        "SKIP", "command-namespaces", why
    )
    assert doctor.check_scheduler(["default/a"], (), False, [], unread=why) == Check(
        "SKIP", "scheduler koord-scheduler", why
    )
    assert doctor.check_leaders(None, NS, NOW, why) == [Check("SKIP", "leaders", why)]
    assert doctor.check_readiness(None, NS, why) == [Check("SKIP", "ready", why)]
