"""One package on one node: which stage runs next, and what its Job's end means (pure).

Stages: apply -> config, or with an interrupt apply -> config -> interrupt -> post-interrupt;
a version change starts at upgrade instead of apply, a downgrade uninstalls the old version
first and then applies the new one (as upstream's HandleVersionChange); a package removed from
the Skyhook runs uninstall; a changed configMap or env re-runs config. nodewright's explicit
uninstall (`step_uninstall`) runs uninstall, then `uninstall-interrupt` when the package has an
interrupt, and removes the entry (absent = uninstalled). The node's state for a
Skyhook is the annotation `nodeState_<skyhook>`:
{"name|version": {name, version, image, stage, state, restarts, run, config}}. The Job of a
stage is the truth of its completion: Complete advances, Failed marks the package erroring.

`run` and `config` are the identity the entry's Jobs must carry: `run` is fixed when the
package starts on the node (so a reset node or a re-added package is a new run) and changes
when someone else than the controller sets the entry back to a stage (`writtenAs`, the
`stage/state` the controller last wrote, no longer matches: rerun_by_hand), `config` is the
hash of the package's configMap and env its stages run with.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from maintenance_scheduler.skyhook.api import Interrupt, InterruptType, Package

Stage = Literal[
    "apply", "config", "interrupt", "post-interrupt", "upgrade", "uninstall", "uninstall-interrupt"
]
STAGES: Final[tuple[str, ...]] = (
    "apply",
    "config",
    "interrupt",
    "post-interrupt",
    "upgrade",
    "uninstall",
    "uninstall-interrupt",
)
# The stages a package starts with (`stages_of`'s first): the only Job a start whose node
# patch was lost leaves behind.
START_STAGES: Final = frozenset({"apply", "upgrade"})
# Stages whose Job is an interrupt pod (one at a time, alone on its drained node).
INTERRUPT_STAGES: Final = frozenset({"interrupt", "uninstall-interrupt"})
# The explicit uninstall's cycle (nodewright's IsUninstallCycleInProgress).
UNINSTALL_STAGES: Final = frozenset({"uninstall", "uninstall-interrupt"})
# Package states, as the anchor names them.
COMPLETE: Final = "complete"
IN_PROGRESS: Final = "in_progress"
ERRORING: Final = "erroring"
SKIPPED: Final = "skipped"
UNKNOWN: Final = "unknown"
PACKAGE_STATES: Final = (COMPLETE, IN_PROGRESS, SKIPPED, ERRORING, UNKNOWN)
# What a node-state entry may say (upstream's Stages and States): anything else is malformed.
_KNOWN_STAGES: Final = frozenset(STAGES)
_KNOWN_STATES: Final = frozenset(PACKAGE_STATES)


def stages_of(
    package: Package, *, upgrading: bool = False, interrupts: bool | None = None
) -> tuple[str, ...]:
    """`interrupts` None: whether the package has an interrupt decides."""
    first = "upgrade" if upgrading else "apply"  # START_STAGES
    if not (package.interrupt is not None if interrupts is None else interrupts):
        return (first, "config")
    return (first, "config", "interrupt", "post-interrupt")


# Upstream's interrupt priorities (lower wins): a reboot covers every other interrupt.
INTERRUPT_PRIORITY: Final[Mapping[str, int]] = {
    "reboot": 0,
    "restartAllServices": 1,
    "service": 2,
    "noop": 3,
}


def merge_interrupt_list(due: Sequence[tuple[str, Interrupt]]) -> tuple[str, Interrupt]:
    """The one interrupt that serves every (owner, interrupt) in `due`, and its owner, as
    upstream's fudgeInterruptWithPriority: by owner name, the first of the highest priority
    (a reboot wins at once); services of equal priority are merged as upstream's
    mergeInterrupt: the first one's services in their declared order, then each other
    service the first time it appears."""
    owner = ""
    merged: Interrupt | None = None
    for name, interrupt in sorted(due, key=lambda item: item[0]):
        if merged is None:
            owner, merged = name, interrupt
        if interrupt.type == "reboot":
            return name, interrupt
        if INTERRUPT_PRIORITY[interrupt.type] < INTERRUPT_PRIORITY[merged.type]:
            owner, merged = name, interrupt
        elif interrupt.type == merged.type == "service":
            services = tuple(dict.fromkeys((*merged.services, *interrupt.services)))
            merged = Interrupt("service", services)
    if merged is None:
        raise ValueError("no interrupt to merge")
    return owner, merged


@dataclass(frozen=True)
class PackageState:
    """One entry of the node-state annotation."""

    name: str
    version: str
    image: str
    stage: str
    state: str
    restarts: int = 0
    # Why the package is erroring (the Job's reason, OOMKilled, the image that never pulled).
    message: str = ""
    # The run this entry belongs to and the config hash its stages run with ("" in an entry
    # written before they existed: its Jobs carry the older names).
    run: str = ""
    config: str = ""
    # Digest of the value of each configMap key that has a configInterrupt, as last run.
    config_keys: tuple[tuple[str, str], ...] = ()
    # "config": this is a config re-run of a complete package (upstream's configUpdates),
    # which interrupts only for the configInterrupts of `interrupt_keys`, the keys changed.
    rerun: str = ""
    interrupt_keys: tuple[str, ...] = ()
    # The `stage/state` the controller last wrote in this entry (its `writtenAs`, always
    # rendered from stage and state): an entry whose stage or state no longer says it was
    # set back by someone else (`kubectl skyhook package rerun --stage`). "" when read from
    # an entry written before the mark existed (nothing is then taken for a rerun).
    written: str = field(default="", compare=False)
    # The interrupt an uninstall-interrupt runs, recorded when the uninstall Job completed:
    # the stage runs to its end whatever the spec says since (nodewright strands the node).
    interrupt: Interrupt | None = None
    # The package's uninstall.enabled as the spec last said (a NodeWright's entries): a
    # package removed from the spec runs its uninstall only if it was enabled.
    uninstall_enabled: bool = False
    # Left on the node without an uninstall (a NodeWright's package removed or downgraded
    # with uninstall.enabled false): a marker that its files may still be on the host, no
    # longer tracked. Kept under its `name|version` key beside the package's live entry.
    retained: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}|{self.version}"

    def to_json(self) -> dict[str, Any]:
        """The annotation's form (a fresh dict; `as_json` is the shared, memoised one)."""
        data: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "image": self.image,
            "stage": self.stage,
            "state": self.state,
            "restarts": self.restarts,
        }
        if self.message:
            data["message"] = self.message
        if self.run:
            data["run"] = self.run
        if self.config:
            data["config"] = self.config
        if self.config_keys:
            data["configKeys"] = dict(self.config_keys)
        if self.rerun:
            data["rerun"] = self.rerun
        if self.interrupt_keys:
            data["interruptKeys"] = list(self.interrupt_keys)
        if self.interrupt is not None:
            data["uninstallInterrupt"] = {
                "type": self.interrupt.type,
                **({"services": list(self.interrupt.services)} if self.interrupt.services else {}),
            }
        if self.uninstall_enabled:
            data["uninstallEnabled"] = True
        if self.retained:
            data["retained"] = True
        data["writtenAs"] = f"{self.stage}/{self.state}"
        return data

    @functools.cached_property
    def as_json(self) -> Mapping[str, Any]:
        return self.to_json()


NodeState = Mapping[str, PackageState]  # package name -> its entry (a marker: `name|version`)


_PARSED: dict[str, tuple[dict[str, PackageState], bool]] = {}
_PARSED_LIMIT = 50_000


def parse_node_state(raw: str | None) -> tuple[dict[str, PackageState], bool]:
    """The annotation's entries by package name, and whether it was readable. An unreadable
    (malformed) annotation yields no entries (and `False`): the caller must not act on the
    node, since it cannot know which stages already ran there. Malformed: not JSON, not an
    object of objects, an entry without its name, version, stage or state, or (stricter than
    nodewright, whose Go strings take any value) an entry whose stage or state is none of the
    anchor's names: a stage we do not know may be one a newer controller or a hand edit
    left mid-way (an uninstall of its own), which no Job of ours may run over or count as done.

    Results are memoised by the annotation's text (most nodes keep theirs from one round to
    the next): callers must not change the dict they get."""
    if not raw:
        return {}, True
    cached = _PARSED.get(raw)
    if cached is not None:
        return cached
    if len(_PARSED) >= _PARSED_LIMIT:
        _PARSED.clear()
    parsed = _parse_node_state(raw)
    _PARSED[raw] = parsed
    return parsed


def _parse_node_state(raw: str) -> tuple[dict[str, PackageState], bool]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}, False
    if not isinstance(data, Mapping):
        return {}, False
    entries: dict[str, PackageState] = {}
    for value in data.values():
        if not isinstance(value, Mapping):
            return {}, False
        name, version = value.get("name"), value.get("version")
        stage, state = value.get("stage"), value.get("state")
        if not all(isinstance(v, str) and v for v in (name, version, stage, state)):
            return {}, False
        if stage not in _KNOWN_STAGES or state not in _KNOWN_STATES:
            return {}, False
        restarts = value.get("restarts", 0)
        retained = value.get("retained") is True
        written = str(value.get("writtenAs") or "")
        rerun = str(value.get("rerun") or "")
        if not written and not rerun and stage == "config" and state == COMPLETE:
            # Written before re-runs were marked (an earlier release, upstream): complete at
            # config may be a config re-run that needed no interrupt. Read as one, so the
            # `writtenAs` the controller stamps on it never makes it an interrupt added
            # (interrupt_added): no reboot is started on a guess.
            rerun = "config"
        entries[f"{name}|{version}" if retained else str(name)] = PackageState(
            name=str(name),
            version=str(version),
            image=str(value.get("image") or ""),
            stage=str(stage),
            state=str(state),
            restarts=restarts if isinstance(restarts, int) else 0,
            message=str(value.get("message") or ""),
            run=str(value.get("run") or ""),
            config=str(value.get("config") or ""),
            config_keys=tuple(
                sorted((str(k), str(v)) for k, v in _mapping(value.get("configKeys")).items())
            ),
            rerun=rerun,
            interrupt_keys=tuple(str(k) for k in _sequence(value.get("interruptKeys"))),
            written=written,
            interrupt=_recorded_interrupt(value.get("uninstallInterrupt")),
            uninstall_enabled=value.get("uninstallEnabled") is True,
            retained=retained,
        )
    return entries, True


_INTERRUPT_TYPES: Final[Mapping[str, InterruptType]] = {
    "reboot": "reboot",
    "restartAllServices": "restartAllServices",
    "service": "service",
    "noop": "noop",
}


def _recorded_interrupt(raw: object) -> Interrupt | None:
    """An entry's recorded uninstall interrupt; one it cannot read is none (the package's
    interrupt then serves, `uninstall_interrupt_of`)."""
    data = _mapping(raw)
    kind = _INTERRUPT_TYPES.get(str(data.get("type")))
    if kind is None:
        return None
    services = tuple(str(s) for s in _sequence(data.get("services")))
    return Interrupt(kind, services)


def rerun_by_hand(entry: PackageState) -> PackageState:
    """The entry as a new run when its stage or state is not what the controller last wrote
    (someone set it back to a stage: upstream's `package rerun --stage`), so the Complete
    Jobs of its earlier run prove nothing and the stage runs again; otherwise the entry
    itself. The new run is made only of the edited entry: a controller deciding again on it
    (restarted, its node patch lost) gets the same run, hence finds the Jobs it made."""
    now = f"{entry.stage}/{entry.state}"
    if not entry.written or entry.written == now:
        return entry
    text = "\x1f".join(("rerun", entry.run, entry.written, now))
    run = hashlib.sha256(text.encode()).hexdigest()[:12]
    return replace(entry, run=run, written=now, message="")


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _sequence(raw: object) -> list[Any]:
    return raw if isinstance(raw, list) else []


def render_node_state(entries: Mapping[str, PackageState]) -> str:
    return json.dumps(
        # A marker of the live entry's version yields to it (rendered first, overwritten).
        {
            e.key: e.to_json()
            for e in sorted(entries.values(), key=lambda e: (e.name, not e.retained))
        },
        sort_keys=True,
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class JobFacts:
    """What the Job of one stage says: `running` (no final condition yet), `complete`, or
    `failed` with its reason (OOMKilled from the pod when a container was OOM-killed)."""

    name: str
    outcome: Literal["running", "complete", "failed"]
    reason: str = ""
    message: str = ""
    # Since when a container of its pod has been unable to pull its image (ErrImagePull or
    # ImagePullBackOff), and which image; None when it is not stuck.
    pull_stuck_since: float | None = None
    pull_image: str = ""
    # spec.ttlSecondsAfterFinished: a failed Job keeps none, so its logs stay.
    ttl_seconds: int | None = None
    # What it ran (jobs.IDENTITY_ANNOTATION); None when it carries no such record.
    identity: Mapping[str, str] | None = None
    # (skyhook, package, node) from its labels: a running Job there keeps a new one of the
    # same package on the node from starting beside it.
    slot: tuple[str, str, str] | None = None
    # Its stage label: a running interrupt Job keeps every other Job off its node.
    stage: str = ""


@dataclass(frozen=True)
class StepOutcome:
    """The package's new entry (None: remove it) and what to do for it."""

    entry: PackageState | None
    # Run (create, idempotently) the Job of entry.stage now.
    run_job: bool = False
    # Fail the Job of entry.stage: its image never pulled within the grace.
    fail_job: bool = False
    # The package's interrupt is over: the node's maintenance request may go.
    interrupt_done: bool = False
    # A stage ended (for the decision log); "" when nothing moved.
    event: str = ""


@functools.lru_cache(maxsize=1 << 12)
def config_hash(package: Package) -> str:
    """What a config stage depends on: the package's configMap and env."""
    # A plain env entry hashes as the [name, value] pair it always did (no re-run of config
    # when the controller is upgraded); a valueFrom entry adds its source.
    env = [
        [e.name, e.value, e.value_from] if e.value_from else [e.name, e.value] for e in package.env
    ]
    text = json.dumps([list(package.config_map), env], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?")


def _version_key(version: str) -> tuple[tuple[int, ...], tuple[tuple[int, int | str], ...]]:
    """Semantic-version order (build metadata ignored; a pre-release before its release;
    `1.2` is `1.2.0`, as x/mod/semver reads the shorthand)."""
    found = _VERSION.match(version)
    if found is None:
        return (), ()
    core = tuple(int(found.group(i) or 0) for i in (1, 2, 3))
    pre = found.group(4)
    if pre is None:
        return core, ((2, 0),)
    return core, tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split("."))


def config_key_digests(package: Package) -> tuple[tuple[str, str], ...]:
    """A digest of the value of each configMap key that has a configInterrupt."""
    values = dict(package.config_map)
    return tuple(
        (key, hashlib.sha256(values.get(key, "").encode()).hexdigest()[:8])
        for key, _ in package.config_interrupts
    )


def effective_interrupt(package: Package, entry: PackageState) -> Interrupt | None:
    """The interrupt this run of the package needs: its own, or for a config re-run the
    merged configInterrupts of the keys that changed (none: no interrupt), as upstream's
    NodeState.HasInterrupt with configUpdates."""
    if entry.rerun != "config":
        return package.interrupt
    hit = [(key, i) for key, i in package.config_interrupts if key in entry.interrupt_keys]
    return merge_interrupt_list(hit)[1] if hit else None


def is_downgrade(installed: str, wanted: str) -> bool:
    return _version_key(wanted) < _version_key(installed)


def _start(
    package: Package, previous: PackageState | None, run: str = "", config: str = ""
) -> PackageState:
    upgrading = previous is not None and previous.version != package.version
    return PackageState(
        name=package.name,
        version=package.version,
        image=package.image,
        stage=stages_of(package, upgrading=upgrading)[0],
        state=IN_PROGRESS,
        run=run,
        config=config,
        config_keys=config_key_digests(package),
    )


def next_stage(package: Package, entry: PackageState) -> str | None:
    order = stages_of(
        package,
        upgrading=entry.stage == "upgrade",
        interrupts=effective_interrupt(package, entry) is not None,
    )
    if entry.stage not in order:
        return None
    index = order.index(entry.stage)
    return order[index + 1] if index + 1 < len(order) else None


def interrupt_added(package: Package, entry: PackageState) -> bool:
    """An interrupt the package gained after it completed without one: its interrupt and
    post-interrupt are still to run (upstream's NodeState.NextStage: a package with an
    interrupt is complete only at post-interrupt, so one complete at config goes on to its
    interrupt; the caller drains the node first, as for any interrupt). Not a config re-run
    that completed at config because no changed key had a configInterrupt, nor an entry
    written before the controller marked re-runs (`writtenAs` absent): what it ran is not
    known, and a reboot is never started on a guess."""
    return (
        entry.stage == "config"
        and entry.state == COMPLETE
        and entry.rerun != "config"
        and bool(entry.written)
        and package.interrupt is not None
    )


def step_package(
    package: Package | None,
    entry: PackageState | None,
    job: JobFacts | None,
    *,
    now: float,
    pull_grace_seconds: float,
    run: str = "",
    config: str = "",
) -> StepOutcome:
    """Advance one package on one node by what its current stage's Job shows.

    `package` None means the package left the Skyhook: an installed one is uninstalled.
    `job` is the Job of `entry.stage` at `entry.version` with the entry's identity (run,
    config) (None: there is none). `run` is the identity a package starting now gets,
    `config` the package's current config hash ("" skips the config check). Whether the
    node may start a stage at all (batch, pause, dependencies, the interrupt's maintenance
    request) is the caller's decision: `run_job` only says the stage's Job should exist.
    """
    if package is None:
        if entry is None:
            return StepOutcome(None)
        if entry.stage != "uninstall":
            return StepOutcome(replace(entry, stage="uninstall", state=IN_PROGRESS), run_job=True)
        package_done = job is not None and job.outcome == "complete"
        if package_done:
            return StepOutcome(None, event="uninstalled")
        return _follow_job(entry, job, now=now, pull_grace_seconds=pull_grace_seconds)
    if entry is None:
        return StepOutcome(_start(package, None, run, config), run_job=True, event="started")
    if entry.version != package.version:
        if not is_downgrade(entry.version, package.version):
            return StepOutcome(_start(package, entry, run, config), run_job=True, event="started")
        # A downgrade uninstalls the installed version, then applies the wanted one afresh.
        if entry.stage != "uninstall":
            return StepOutcome(
                replace(entry, stage="uninstall", state=IN_PROGRESS, message=""),
                run_job=True,
                event=f"downgrade to {package.version}: uninstall {entry.version}",
            )
        if job is not None and job.outcome == "complete":
            return StepOutcome(
                _start(package, None, run, config), run_job=True, event="uninstalled: started"
            )
        return _follow_job(entry, job, now=now, pull_grace_seconds=pull_grace_seconds)
    if config and entry.config and entry.config != config:
        return StepOutcome(
            _config_changed(package, entry, config), run_job=True, event="config changed"
        )
    if entry.state == COMPLETE:
        if interrupt_added(package, entry):
            return StepOutcome(
                replace(entry, stage="interrupt", state=IN_PROGRESS, message=""),
                run_job=True,
                event="interrupt added to the complete package",
            )
        return StepOutcome(entry)
    if job is not None and job.outcome == "complete":
        following = next_stage(package, entry)
        was_interrupt = entry.stage == "post-interrupt"
        if following is None:
            return StepOutcome(
                replace(entry, state=COMPLETE, message=""),
                interrupt_done=was_interrupt,
                event=f"{entry.stage} complete",
            )
        return StepOutcome(
            replace(entry, stage=following, state=IN_PROGRESS, message=""),
            run_job=True,
            event=f"{entry.stage} complete",
        )
    return _follow_job(entry, job, now=now, pull_grace_seconds=pull_grace_seconds)


def _config_changed(package: Package, entry: PackageState, config: str) -> PackageState:
    """The configMap or env changed: what ran with the old one proves nothing for the new.
    Before config has run, the stage under way runs again with the new config. A complete
    package (or one in a config re-run) runs config again, interrupting only for the
    configInterrupts of the keys that changed (accumulated until the re-run completes), as
    upstream's HandleConfigUpdates; a first run past config runs config again and keeps its
    own interrupt due."""
    keys = config_key_digests(package)
    changed = replace(entry, state=IN_PROGRESS, config=config, config_keys=keys, message="")
    if entry.stage in ("apply", "upgrade"):
        return changed
    if entry.state != COMPLETE and entry.rerun != "config":
        return replace(changed, stage="config")
    before, after = dict(entry.config_keys), dict(keys)
    hit = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if entry.rerun == "config" and entry.state != COMPLETE:
        hit |= set(entry.interrupt_keys)
    return replace(changed, stage="config", rerun="config", interrupt_keys=tuple(sorted(hit)))


def _follow_job(
    entry: PackageState, job: JobFacts | None, *, now: float, pull_grace_seconds: float
) -> StepOutcome:
    if job is None:
        if entry.state == ERRORING:
            # The failed Job is gone (a person deleted it, or its TTL ran out): try again.
            return StepOutcome(
                replace(entry, state=IN_PROGRESS, restarts=entry.restarts + 1, message=""),
                run_job=True,
                event="retry",
            )
        return StepOutcome(replace(entry, state=IN_PROGRESS), run_job=True)
    if job.outcome == "failed":
        job_said = f"{entry.stage} Job {job.name} failed:"
        # A message written when the controller failed the Job itself (the image) is kept;
        # one read from the Job is read again, since its pods (an OOMKilled container) can be
        # mirrored a moment after the Job's Failed condition.
        ours = entry.state == ERRORING and entry.message and not entry.message.startswith(job_said)
        message = (
            entry.message
            if ours
            else f"{job_said} {job.reason}" + (f": {job.message}" if job.message else "")
        )
        changed = entry.state != ERRORING
        return StepOutcome(
            replace(entry, state=ERRORING, message=message),
            event=f"{entry.stage} failed: {job.reason}" if changed else "",
        )
    if entry.state == ERRORING:
        # Already failed by us (the image); the Job's own Failed condition follows.
        return StepOutcome(entry)
    if job.pull_stuck_since is not None and now - job.pull_stuck_since >= pull_grace_seconds:
        message = (
            f"image {job.pull_image} could not be pulled for {int(now - job.pull_stuck_since)}s "
            f"({entry.stage} Job {job.name} failed)"
        )
        return StepOutcome(
            replace(entry, state=ERRORING, message=message),
            fail_job=True,
            event=f"{entry.stage} failed: image {job.pull_image} not pullable",
        )
    return StepOutcome(replace(entry, state=IN_PROGRESS))


# --- nodewright's explicit uninstall -----------------------------------------------------------


def in_uninstall_cycle(entry: PackageState | None) -> bool:
    return entry is not None and entry.stage in UNINSTALL_STAGES


def uninstall_interrupt_of(package: Package | None, entry: PackageState) -> Interrupt | None:
    """What an uninstall-interrupt runs: the interrupt recorded when it was committed, or (an
    entry without the record) the package's own."""
    if entry.interrupt is not None:
        return entry.interrupt
    return package.interrupt if package is not None else None


def step_uninstall(
    package: Package | None,
    entry: PackageState,
    job: JobFacts | None,
    *,
    now: float,
    pull_grace_seconds: float,
) -> StepOutcome:
    """nodewright's uninstall cycle of an installed package on one node (HandleUninstallRequests,
    HandleCompletePod): an entry at an install stage goes to uninstall (the caller starts it
    only from a complete install); the uninstall Job complete, a package with an interrupt
    goes to uninstall-interrupt with that interrupt recorded, one without is removed (absent
    = uninstalled); the uninstall-interrupt Job complete, the entry is removed. `package` is
    the spec's package at the entry's version, or None."""
    if entry.stage not in UNINSTALL_STAGES:
        return StepOutcome(
            replace(entry, stage="uninstall", state=IN_PROGRESS, message="", interrupt=None),
            run_job=True,
            event="uninstall started",
        )
    done = job is not None and job.outcome == "complete"
    if entry.stage == "uninstall":
        if not done:
            return _follow_job(entry, job, now=now, pull_grace_seconds=pull_grace_seconds)
        interrupt = package.interrupt if package is not None else None
        if interrupt is None:
            return StepOutcome(None, event="uninstalled")
        return StepOutcome(
            replace(
                entry,
                stage="uninstall-interrupt",
                state=IN_PROGRESS,
                message="",
                restarts=0,
                interrupt=interrupt,
            ),
            run_job=True,
            event="uninstall complete",
        )
    if done:
        return StepOutcome(None, interrupt_done=True, event="uninstalled")
    if uninstall_interrupt_of(package, entry) is None:
        # Nothing recorded nor declared to interrupt with: the uninstall itself is done.
        return StepOutcome(None, event="uninstalled")
    return _follow_job(entry, job, now=now, pull_grace_seconds=pull_grace_seconds)


def cancel_uninstall(entry: PackageState) -> PackageState:
    """uninstall.apply turned off while the uninstall stage runs or failed (nodewright's
    HandleCancelledUninstalls): back to the install pipeline at apply, as a new run (the
    Jobs of the install that ran before prove nothing after a part of the uninstall ran).
    The run is made of the entry's, so a controller deciding again gets the same."""
    text = "\x1f".join(("uninstall-cancelled", entry.run, entry.version))
    run = hashlib.sha256(text.encode()).hexdigest()[:12]
    return replace(
        entry,
        stage="apply",
        state=IN_PROGRESS,
        restarts=0,
        message="",
        run=run,
        rerun="",
        interrupt_keys=(),
        interrupt=None,
    )


def retain(entry: PackageState) -> PackageState:
    """The entry left on the node as a marker (no uninstall ran)."""
    return replace(entry, retained=True)
