"""The explicit uninstall (S47..S52) under random edits: installs, `uninstall.apply` on and
off, interrupts added and removed, versions changed, packages removed and re-added, the
object paused, disabled and deleted, Jobs failing, NodeMaintenances held Pending. Each round
is checked against the safety invariants: an interrupt Job (install or uninstall) starts only
on a drained node and never beside another interrupt Job there; a package's Job never starts
beside a running Job of the same package on its node; an uninstall starts only from a
complete install; a committed `uninstall-interrupt` runs to its end; never more nodes drained
than the interruptionBudget; the finalizer's cleanup never runs while an uninstall it waits
for is still pending on a node."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Skyhook, parse_skyhook
from maintenance_scheduler.skyhook.jobs import build_job
from maintenance_scheduler.skyhook.observe import job_facts
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    DeleteMaintenance,
    FailJob,
    ForgetNode,
    NodeView,
    PatchNode,
    RoundPlan,
    SetSkyhookFinalizer,
    SetSkyhookStatus,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.stages import (
    INTERRUPT_STAGES,
    PackageState,
    parse_node_state,
    render_node_state,
)
from nodeflow_contracts.skyhook import FLAVORS, NODEWRIGHT, SKYHOOK, SkyhookNames
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import NAMESPACE, T0

NAME = "gpu-init"
BUDGET = 1


def make(
    names: SkyhookNames,
    packages: dict[str, Any],
    *,
    generation: int = 1,
    paused: bool = False,
    disabled: bool = False,
) -> Skyhook:
    annotations: dict[str, str] = {}
    if paused:
        annotations[names.pause_annotation] = "true"
    if disabled:
        annotations[names.disable_annotation] = "true"
    return parse_skyhook(
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {
                "name": NAME,
                "uid": f"uid-{names.kind}",
                "generation": generation,
                "annotations": annotations,
                "finalizers": [names.finalizer],
            },
            "spec": {"packages": packages, "interruptionBudget": {"count": BUDGET}},
        }
    )


@dataclass
class Harness:
    """One object on a few nodes; every action lands as the API server would apply it, the
    Jobs are the ones `build_job` makes (read back through `job_facts`, so the labels the
    plan reads are real), a Job made in one round ends in the next unless held or failed."""

    skyhook: Skyhook | None
    names: SkyhookNames
    nodes: dict[str, NodeView]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    made: dict[str, CreateJob] = field(default_factory=dict)
    maintenances: dict[str, str] = field(default_factory=dict)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    held_pending: bool = False
    failing: bool = False
    held_jobs: set[str] = field(default_factory=set)
    now: float = T0
    # A committed uninstall-interrupt: (node, package) -> version.
    committed: dict[tuple[str, str], str] = field(default_factory=dict)
    # Nodes that erred while drained, until their drain is released: their host may be half
    # changed, so they stay drained (fail closed) even once an edit sends them back to work.
    failed_drained: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, names: SkyhookNames, packages: dict[str, Any], count: int) -> Harness:
        nodes = {
            f"node-{i}": NodeView(f"node-{i}", f"node-uid-{i}", "1", {}, {}, created=float(i))
            for i in range(count)
        }
        return cls(make(names, packages), names, nodes)

    def entries(self, node: str) -> dict[str, PackageState]:
        raw = self.nodes[node].annotations.get(self.names.node_state_annotation(NAME))
        parsed, readable = parse_node_state(raw)
        assert readable
        return dict(parsed)

    def erroring(self, node: str) -> bool:
        return any(e.state == "erroring" for e in self.entries(node).values())

    def running(self) -> list[CreateJob]:
        return [self.made[n] for n, job in self.jobs.items() if not job.get("status")]

    def edit(self, packages: dict[str, Any], **flags: bool) -> None:
        old = self.skyhook
        assert old is not None
        new = make(self.names, packages, generation=old.generation + 1, **flags)
        self.skyhook = replace(
            new, status=old.status, deleting=old.deleting, finalizers=old.finalizers
        )

    def round(self) -> RoundPlan:
        self.now += 1
        for name, obj in self.jobs.items():
            if obj.get("status") or name in self.held_jobs:
                continue
            kind = "Failed" if self.failing else "Complete"
            obj["status"] = {"conditions": [{"type": kind, "status": "True"}]}
        for name in self.maintenances:
            self.maintenances[name] = "Pending" if self.held_pending else "Ready"
        before = {n: self.entries(n) for n in self.nodes}
        running_before = self.running()
        world = World(
            skyhooks=[self.skyhook] if self.skyhook is not None else [],
            policies={},
            nodes=list(self.nodes.values()),
            jobs={name: job_facts(obj, []) for name, obj in self.jobs.items()},
            maintenances=dict(self.maintenances),
            maintenance_owners=dict(self.owners),
        )
        plan = plan_round(world, now=self.now)
        self.check_plan(plan, world, before, running_before)
        for action in plan.actions:
            self.land(action)
        self.check_after(before)
        return plan

    def land(self, action: Any) -> None:
        names = self.names
        if isinstance(action, CreateJob):
            assert action.name not in self.jobs, f"{action.name} created twice"
            self.jobs[action.name] = build_job(
                action.skyhook,
                action.package,
                action.stage,
                action.node,
                namespace=NAMESPACE,
                default_stage_timeout_seconds=0,
                run=action.run,
                config=action.config,
                node_uid=action.node_uid,
            )
            self.made[action.name] = action
        elif isinstance(action, FailJob):
            job = self.jobs.get(action.name)
            if job is not None and not job.get("status"):
                job["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
        elif isinstance(action, PatchNode):
            node = self.nodes[action.node.name]
            annotations = dict(node.annotations)
            annotations[names.node_state_annotation(NAME)] = action.node_state
            annotations[names.status_key(NAME)] = action.status
            self.nodes[node.name] = replace(node, annotations=annotations)
        elif isinstance(action, ForgetNode):
            node = self.nodes[action.node.name]
            gone = (names.node_state_annotation(NAME), names.status_key(NAME))
            kept = {k: v for k, v in node.annotations.items() if k not in gone}
            self.nodes[node.name] = replace(node, annotations=kept)
        elif isinstance(action, CreateMaintenance):
            self.maintenances[action.name] = "Pending"
            self.owners[action.name] = (action.skyhook.owner_key, action.node)
        elif isinstance(action, DeleteMaintenance):
            self.maintenances.pop(action.name, None)
            self.owners.pop(action.name, None)
        elif isinstance(action, SetSkyhookStatus) and self.skyhook is not None:
            self.skyhook = replace(self.skyhook, status=dict(action.status))
        elif (
            isinstance(action, SetSkyhookFinalizer)
            and self.skyhook is not None
            and not action.present
            and self.skyhook.deleting
        ):
            self.skyhook = None  # the API server removes it with its last finalizer

    def check_plan(
        self,
        plan: RoundPlan,
        world: World,
        before: dict[str, dict[str, PackageState]],
        running_before: list[CreateJob],
    ) -> None:
        skyhook = self.skyhook
        assert skyhook is not None
        spec = {p.name: p for p in skyhook.packages}
        created = [a for a in plan.actions if isinstance(a, CreateJob)]
        ended = {a.name for a in plan.actions if isinstance(a, FailJob)}
        for action in created:
            # Drained: the node's NodeMaintenance is Ready when its interrupt Job is made,
            # and when the uninstall Job of a package with an interrupt is.
            declared = spec.get(action.package.name)
            drains = (
                action.stage == "uninstall"
                and declared is not None
                and declared.version == action.package.version
                and declared.interrupt is not None
            )
            if action.stage in INTERRUPT_STAGES or drains:
                phase = world.maintenances.get(world.request_of(skyhook, action.node))
                assert phase == "Ready", (action.name, phase)
            # Never beside a running Job of the same package on the node (one the plan ends
            # this round is still running: its pod is not gone yet).
            beside = [
                r
                for r in [*running_before, *created]
                if r is not action
                and r.node == action.node
                and r.package.name == action.package.name
            ]
            assert not beside, (action.name, [r.name for r in beside], ended)
            # An uninstall of a package still in the spec at that version starts only from
            # a complete install, or goes on with its cycle.
            entry = before[action.node].get(action.package.name)
            if (
                action.stage == "uninstall"
                and declared is not None
                and declared.version == action.package.version
                and entry is not None
                and entry.version == declared.version
            ):
                assert entry.stage == "uninstall" or entry.state == "complete", (action, entry)
        # Never two interrupt Jobs at once on a node.
        for node in self.nodes:
            interrupting = [
                a.name
                for a in [*running_before, *created]
                if a.node == node and a.stage in INTERRUPT_STAGES
            ]
            assert len(interrupting) <= 1, interrupting
        # The finalizer's cleanup waits for every pending uninstall.
        cleaning = any(isinstance(a, ForgetNode | SetSkyhookFinalizer) for a in plan.actions)
        if skyhook.deleting and cleaning:
            enabled = {p.name for p in skyhook.packages if p.uninstall_enabled}
            for node, entries in before.items():
                for entry in entries.values():
                    if entry.retained:
                        continue
                    owed = entry.name in enabled or entry.stage == "uninstall-interrupt"
                    if self.names == NODEWRIGHT and entry.name not in spec:
                        owed = owed or entry.uninstall_enabled
                    assert not owed, (node, entry)

    def check_after(self, before: dict[str, dict[str, PackageState]]) -> None:
        # As the interrupt-safety tests count it: an erroring node keeps its drain for its
        # failed Job's logs while the rollout moves on (told by its entries: a paused
        # object shows its nodes paused).
        held = {node for _, node in self.owners.values()}
        self.failed_drained = {
            node for node in held if node in self.failed_drained or self.erroring(node)
        }
        drained = held - self.failed_drained
        assert len(drained) <= BUDGET, (self.owners, self.failed_drained)
        for node in self.nodes:
            now = self.entries(node)
            for (where, package), version in list(self.committed.items()):
                if where != node:
                    continue
                entry = now.get(package)
                if entry is None:
                    del self.committed[(where, package)]
                    continue
                # Once committed, it is never cancelled nor sent back to install.
                assert entry.stage == "uninstall-interrupt", (node, entry)
                assert entry.version == version, (node, entry)
            for entry in now.values():
                if entry.stage == "uninstall-interrupt" and not entry.retained:
                    self.committed[(node, entry.name)] = entry.version


def package(
    index: int,
    *,
    version: str,
    interrupt: str | None,
    enabled: bool,
    apply: bool,
    depends: bool,
    depends_on: str = "1.0.0",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "version": version,
        "image": f"ghcr.io/x/p{index}",
        "uninstall": {"enabled": enabled, "apply": apply and enabled},
    }
    if interrupt is not None:
        spec["interrupt"] = {"type": interrupt}
    if depends and index > 0:
        spec["dependsOn"] = {"pkg-a": depends_on}
    return spec


EDITS = st.sampled_from(
    [
        "apply",
        "cancel",
        "interrupt",
        "no-interrupt",
        "upgrade",
        "downgrade",
        "remove",
        "readd",
        "disable-uninstall",
        "pause",
        "unpause",
        "disable",
        "enable",
        "fail",
        "succeed",
        "hold-drain",
        "release-drain",
        "hold-jobs",
        "release-jobs",
        "depend",
        "independ",
        "delete",
    ]
)


@dataclass
class Spec:
    version: list[str]
    interrupt: list[str | None]
    enabled: list[bool]
    apply: list[bool]
    present: list[bool]
    paused: bool = False
    disabled: bool = False
    depends: bool = False

    def packages(self) -> dict[str, Any]:
        return {
            f"pkg-{'ab'[i]}": package(
                i,
                version=self.version[i],
                interrupt=self.interrupt[i],
                enabled=self.enabled[i],
                apply=self.apply[i],
                depends=self.depends and self.present[0],
                depends_on=self.version[0],
            )
            for i in range(len(self.version))
            if self.present[i]
        }


@settings(max_examples=150, deadline=None)
# An erroring node keeps its drain for its failed Job's logs while another node takes the
# budget; a cancel sends it back to apply outside the batch, and it keeps its drain (its
# failed uninstall may have half changed the host): it counts outside the budget, as an
# erroring node does, and never starts beside the node under way.
@example(
    kind=SKYHOOK,
    count=2,
    interrupts=[None, "reboot"],
    edits=[("apply", 1, 0), ("fail", 0, 4), ("cancel", 1, 0)],
)
@given(
    kind=st.sampled_from(FLAVORS),
    count=st.integers(min_value=1, max_value=3),
    interrupts=st.lists(st.sampled_from([None, "reboot", "noop"]), min_size=2, max_size=2),
    edits=st.lists(
        st.tuples(EDITS, st.integers(min_value=0, max_value=1), st.integers(0, 4)),
        max_size=10,
    ),
)
def test_property_the_explicit_uninstall_keeps_every_safety_invariant(
    kind: SkyhookNames,
    count: int,
    interrupts: list[str | None],
    edits: list[tuple[str, int, int]],
) -> None:
    spec = Spec(["1.0.0", "1.0.0"], list(interrupts), [True, True], [False, False], [True, True])
    harness = Harness.of(kind, spec.packages(), count)
    for _ in range(40):
        if not harness.round().actions:
            break
    assert harness.skyhook is not None and harness.skyhook.status["status"] == "complete"
    for edit, which, gap in edits:
        if harness.skyhook is None:
            break
        if edit == "apply":
            spec.apply[which] = spec.enabled[which] = True
        elif edit == "cancel":
            spec.apply[which] = False
        elif edit == "interrupt":
            spec.interrupt[which] = "reboot"
        elif edit == "no-interrupt":
            spec.interrupt[which] = None
        elif edit == "upgrade":
            spec.version[which] = "2.0.0"
        elif edit == "downgrade":
            spec.version[which] = "1.0.0"
        elif edit == "remove":
            spec.present[which] = False
        elif edit == "readd":
            spec.present[which] = True
        elif edit == "disable-uninstall":
            spec.enabled[which] = spec.apply[which] = False
        elif edit in ("pause", "unpause"):
            spec.paused = edit == "pause"
        elif edit in ("disable", "enable"):
            spec.disabled = edit == "disable"
        elif edit in ("fail", "succeed"):
            harness.failing = edit == "fail"
        elif edit in ("hold-drain", "release-drain"):
            harness.held_pending = edit == "hold-drain"
        elif edit == "hold-jobs":
            harness.held_jobs |= {a.name for a in harness.running()}
        elif edit == "release-jobs":
            harness.held_jobs.clear()
        elif edit in ("depend", "independ"):
            spec.depends = edit == "depend"
        if edit == "delete":
            harness.skyhook = replace(harness.skyhook, deleting=True)
        else:
            harness.edit(spec.packages(), paused=spec.paused, disabled=spec.disabled)
        for _ in range(gap):
            harness.round()
            if harness.skyhook is None:
                break
    # Let it run out: nothing fails, nothing is held.
    harness.failing = harness.held_pending = False
    harness.held_jobs.clear()
    if harness.skyhook is not None:
        harness.edit(spec.packages())
    for _ in range(200):
        if harness.skyhook is None or not harness.round().actions:
            break
    # A committed uninstall-interrupt has run to its end (or its node was cleaned up with
    # the object, which waited for it), unless its node is erroring on another stage
    # (a node outside the batch retries nothing, S21): then it stays drained (fail closed).
    for node, _ in harness.committed:
        assert harness.erroring(node), harness.committed
        assert node in {n for _, n in harness.owners.values()}, (node, harness.owners)


def test_the_harness_tracks_a_committed_uninstall_interrupt_to_its_end() -> None:
    """The harness itself: a committed uninstall-interrupt is tracked until its entry goes
    (so the property's check of it can fail)."""
    harness = Harness.of(
        FLAVORS[0],
        {
            "pkg-a": package(
                0, version="1.0.0", interrupt="reboot", enabled=True, apply=False, depends=False
            )
        },
        1,
    )
    for _ in range(40):
        if not harness.round().actions:
            break
    harness.edit(
        {
            "pkg-a": package(
                0, version="1.0.0", interrupt="reboot", enabled=True, apply=True, depends=False
            )
        }
    )
    seen = False
    for _ in range(40):
        harness.round()
        seen = seen or bool(harness.committed)
    assert seen
    assert harness.entries("node-0") == {}
    # Entries written by hand round-trip (the harness reads what the plan writes).
    entry = PackageState(name="x", version="1", image="i", stage="apply", state="complete")
    assert parse_node_state(render_node_state({"x": entry}))[0]["x"].stage == "apply"
