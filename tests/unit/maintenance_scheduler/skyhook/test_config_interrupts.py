"""An edited configMap runs config again, honouring `configInterrupts` as upstream does
(HandleConfigUpdates, NodeState.HasInterrupt with configUpdates): the re-run interrupts only
for a changed key that has a configInterrupt, drained first; a changed key without one, or an
env change, runs config alone, even for a package whose own interrupt is a reboot."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.skyhook.api import Interrupt, parse_skyhook
from maintenance_scheduler.skyhook.stages import (
    PackageState,
    parse_node_state,
    render_node_state,
)
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import Cluster, make_skyhook


def tuned(config: dict[str, str], *, own: dict[str, Any] | None = None, **extra: Any) -> Any:
    spec: dict[str, Any] = {
        "version": "1.0.0",
        "image": "ghcr.io/x/tuned",
        "configMap": config,
        "configInterrupts": {
            "kernel.conf": {"type": "reboot"},
            "daemon.conf": {"type": "service", "services": ["tuned.service"]},
        },
        **extra,
    }
    if own is not None:
        spec["interrupt"] = own
    return {"tuned": spec}


BASE = {"kernel.conf": "a", "daemon.conf": "a", "notes": "a"}


def rerun(cluster: Cluster, config: dict[str, str], **extra: Any) -> list[Any]:
    cluster.settle()
    assert cluster.status() == "complete"
    mark = len(cluster.created)
    own = cluster.skyhook.packages[0].interrupt
    cluster.change(tuned(config, own=None if own is None else {"type": own.type}, **extra))
    cluster.settle()
    assert cluster.status() == "complete"
    return cluster.created[mark:]


def test_rule_a_changed_key_with_a_config_interrupt_interrupts_after_config_drained() -> None:
    cluster = Cluster.of(make_skyhook(tuned(BASE)))
    ran = rerun(cluster, {**BASE, "kernel.conf": "b"})
    assert [a.stage for a in ran] == ["config", "interrupt", "post-interrupt"]
    assert ran[1].package.interrupt == Interrupt("reboot")
    assert {cluster.phase_at_create[a.name] for a in ran} == {"Ready"}
    assert cluster.maintenances == {}


def test_rule_changed_keys_merge_their_config_interrupts() -> None:
    cluster = Cluster.of(make_skyhook(tuned(BASE)))
    ran = rerun(cluster, {**BASE, "daemon.conf": "b"})
    assert [a.stage for a in ran] == ["config", "interrupt", "post-interrupt"]
    assert ran[1].package.interrupt == Interrupt("service", ("tuned.service",))
    cluster = Cluster.of(make_skyhook(tuned(BASE)))
    ran = rerun(cluster, {**BASE, "daemon.conf": "b", "kernel.conf": "b"})
    assert ran[1].package.interrupt == Interrupt("reboot")


def test_rule_a_changed_key_without_a_config_interrupt_runs_config_alone() -> None:
    cluster = Cluster.of(make_skyhook(tuned(BASE, own={"type": "reboot"})))
    # The package's own reboot ran in its first rollout...
    cluster.settle()
    assert [a.stage for a in cluster.created].count("interrupt") == 1
    # ...but a config change of a key without a configInterrupt neither reboots nor drains.
    cluster.held_pending = True
    ran = rerun(cluster, {**BASE, "notes": "b"})
    assert [a.stage for a in ran] == ["config"]
    assert cluster.maintenances == {}


def test_rule_an_env_change_runs_config_alone() -> None:
    cluster = Cluster.of(make_skyhook(tuned(BASE)))
    ran = rerun(cluster, BASE, env=[{"name": "MODE", "value": "fast"}])
    assert [a.stage for a in ran] == ["config"]


def test_a_first_run_past_config_keeps_its_own_interrupt_due() -> None:
    """Edited while the first rollout's reboot runs: config runs again once that Job has
    ended, and the package's own reboot still follows (never fewer interrupts than the
    package asks for)."""
    cluster = Cluster.of(make_skyhook(tuned(BASE, own={"type": "reboot"})))
    for _ in range(20):
        cluster.round()
        if any(a.stage == "interrupt" for a in cluster.created):
            break
    (interrupt,) = [a.name for a in cluster.created if a.stage == "interrupt"]
    cluster.held_jobs = {interrupt}
    mark = len(cluster.created)
    cluster.change(tuned({**BASE, "notes": "b"}, own={"type": "reboot"}))
    for _ in range(3):
        cluster.round()
    assert cluster.created[mark:] == []  # no config pod beside the running interrupt
    cluster.held_jobs.clear()
    cluster.settle()
    assert cluster.status() == "complete"
    assert [a.stage for a in cluster.created[mark:]] == ["config", "interrupt", "post-interrupt"]


def test_config_interrupts_parse_and_the_rerun_state_survives_the_annotation() -> None:
    skyhook = parse_skyhook(
        {
            "metadata": {"name": "s"},
            "spec": {
                "packages": {
                    "tuned": {
                        "version": "1.0.0",
                        "image": "x",
                        "configInterrupts": {"k": {"type": "nope"}, "j": {"type": "noop"}},
                    }
                }
            },
        }
    )
    assert skyhook.packages[0].config_interrupts == (("j", Interrupt("noop")),)
    assert any("configInterrupts.k.type" in p for p in skyhook.problems)
    entry = PackageState(
        "tuned",
        "1.0.0",
        "x",
        "config",
        "in_progress",
        run="r",
        config="c",
        config_keys=(("j", "d1"), ("k", "d2")),
        rerun="config",
        interrupt_keys=("k",),
    )
    parsed, readable = parse_node_state(render_node_state({"tuned": entry}))
    assert readable and parsed == {"tuned": entry}
