"""Mutation testing of the services' pure decision cores (`make mutate`, not part of `make
test`).

For each module: every one-line mutant (tools/mutate/mutants.py) is loaded in place of the
module (tools/mutate/nodeflow_mutant_inject.py: nothing in the checkout is written) and only
that module's unit tests run, stopping at the first failure, under a time limit per mutant.
A mutant the tests fail on (or that breaks the import, or runs past its limit) is killed; one
they pass is a survivor: a slip no test would notice. The runner prints killed/total per
module and every survivor with file:line and its mutation.

Equivalent mutants (a change that cannot alter behaviour) are listed in
tools/mutate/equivalent.txt, one `path:line: mutation  # why` a line; they are left out of
the total, and an entry that no longer names a mutant is reported so the list stays true.

Property tests run under the `ci` hypothesis profile (derandomized), so a mutant is killed or
not the same way on every run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.mutate.mutants import Mutant, find_mutants, mutated_source, original_text

ROOT = Path(__file__).resolve().parents[2]
EXCLUSIONS = Path(__file__).with_name("equivalent.txt")


@dataclass(frozen=True)
class Target:
    """A module under mutation and the unit tests that hold its rules."""

    path: str  # relative to the repository root
    module: str  # import name
    tests: tuple[str, ...]
    ignore: tuple[str, ...] = ()


def _targets() -> list[Target]:
    nodeset = ("tests/unit/nodeset_controller",)
    syncer = ("tests/unit/slurm_syncer",)
    maintenance = ("tests/unit/maintenance_scheduler",)
    skyhook = ("tests/unit/maintenance_scheduler/skyhook",)
    placer = ("tests/unit/topology_placer",)
    found: list[Target] = []
    for name in ("planner", "ranking", "deletion", "feasibility"):
        found.append(
            Target(f"services/nodeset_controller/{name}.py", f"nodeset_controller.{name}", nodeset)
        )
    for name in ("reconcile", "drain", "reasons"):
        found.append(Target(f"services/slurm_syncer/{name}.py", f"slurm_syncer.{name}", syncer))
    for name in ("scheduler", "reconcile", "drain", "pods"):
        found.append(
            Target(
                f"services/maintenance_scheduler/{name}.py",
                f"maintenance_scheduler.{name}",
                maintenance,
                ignore=skyhook,
            )
        )
    for name in ("plan", "rollout", "stages", "jobs"):
        found.append(
            Target(
                f"services/maintenance_scheduler/skyhook/{name}.py",
                f"maintenance_scheduler.skyhook.{name}",
                skyhook,
            )
        )
    for name in ("planner", "gather", "fit", "preemption", "gang"):
        found.append(
            Target(f"services/topology_placer/{name}.py", f"topology_placer.{name}", placer)
        )
    # The Kubernetes semantics the cores share (the placer, the NodeSet controller and the
    # simulator's scheduler decide with them), against their own unit tests.
    kube = ("tests/unit/kube",)
    for name in ("taints", "affinity", "labels", "quantity"):
        found.append(Target(f"libs/nodeflow_kube/{name}.py", f"nodeflow_kube.{name}", kube))
    return found


TARGETS = _targets()


def read_exclusions(path: Path = EXCLUSIONS) -> dict[str, str]:
    """`path:line: mutation` -> why it is equivalent."""
    entries: dict[str, str] = {}
    if not path.exists():
        return entries
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, why = line.partition("#")
        if not why.strip():
            raise SystemExit(f"{path}: an exclusion needs a comment saying why: {raw!r}")
        entries[key.strip()] = why.strip()
    return entries


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    killed: bool
    how: str  # "tests failed", "import broke", "timeout", "survived"


def _pytest(target: Target, env: dict[str, str], timeout: float) -> tuple[int | None, float]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "nodeflow_mutant_inject",
        *(f"--ignore={path}" for path in target.ignore),
        *target.tests,
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, timeout=timeout, capture_output=True, check=False
        )
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    return done.returncode, time.monotonic() - started


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    plugin_dir = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin_dir, env.get("PYTHONPATH", "")) if p)
    env["HYPOTHESIS_PROFILE"] = "ci"
    env.update(extra)
    return env


def run_target(
    target: Target,
    exclusions: dict[str, str],
    *,
    limit: int | None,
    only: set[str],
    out: list[str],
) -> tuple[list[Outcome], list[Mutant]]:
    source = (ROOT / target.path).read_text(encoding="utf-8")
    baseline_code, baseline_seconds = _pytest(target, _environment({}), timeout=1800)
    if baseline_code != 0:
        raise SystemExit(f"{target.path}: its unit tests fail unmutated (exit {baseline_code})")
    # Slow mutants (a loop that no longer ends) count as killed past this.
    timeout = max(60.0, 4 * baseline_seconds)
    original = original_text(source)
    seen: set[str] = {original}
    outcomes: list[Outcome] = []
    excluded: list[Mutant] = []
    mutants = find_mutants(target.path, source)
    if only:
        mutants = [m for m in mutants if m.key in only]
    if limit is not None:
        mutants = mutants[:limit]
    with tempfile.TemporaryDirectory(prefix="nodeflow-mutant-") as scratch:
        text_file = Path(scratch) / "mutant.py"
        for mutant in mutants:
            if mutant.key in exclusions:
                excluded.append(mutant)
                continue
            text = mutated_source(source, mutant)
            if text in seen:
                continue  # the same program as the original or as an earlier mutant
            seen.add(text)
            text_file.write_text(text, encoding="utf-8")
            env = _environment(
                {
                    "NODEFLOW_MUTANT_MODULE": target.module,
                    "NODEFLOW_MUTANT_SOURCE": str(text_file),
                    "NODEFLOW_MUTANT_ORIGIN": str(ROOT / target.path),
                }
            )
            code, _seconds = _pytest(target, env, timeout=timeout)
            if code is None:
                outcome = Outcome(mutant, True, "timeout")
            elif code == 0:
                outcome = Outcome(mutant, False, "survived")
            elif code == 1:
                outcome = Outcome(mutant, True, "tests failed")
            else:
                outcome = Outcome(mutant, True, f"pytest exit {code} (import or collection broke)")
            outcomes.append(outcome)
            if outcome.killed:
                print(".", end="", flush=True)
            else:  # named at once, so a run stopped early still says what it found
                print(f"\nsurvived: {mutant.key}", flush=True)
    print(flush=True)
    killed = sum(o.killed for o in outcomes)
    out.append(
        f"{target.path}: {killed}/{len(outcomes)} killed ({len(excluded)} excluded as equivalent)"
    )
    return outcomes, excluded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutate", description=__doc__)
    parser.add_argument(
        "modules",
        nargs="*",
        help="module paths (services/topology_placer/fit.py) or service folders "
        "(services/topology_placer); default: every pure core",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--limit", type=int, help="first N mutants of each module only")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY",
        help="run only this mutant, as printed (`path:line: mutation`); repeatable: re-check "
        "the survivors of a run after adding tests",
    )
    args = parser.parse_args(argv)
    chosen = [
        t
        for t in TARGETS
        if not args.modules
        or any(
            t.path == m.rstrip("/") or t.path.startswith(m.rstrip("/") + "/") for m in args.modules
        )
    ]
    if not chosen:
        known = ", ".join(t.path for t in TARGETS)
        raise SystemExit(f"no pure-core module matches {args.modules}; known: {known}")
    exclusions = read_exclusions()
    if args.list:
        for target in chosen:
            source = (ROOT / target.path).read_text(encoding="utf-8")
            for mutant in find_mutants(target.path, source):
                note = "  (excluded)" if mutant.key in exclusions else ""
                print(f"{mutant.key}{note}")
        return 0
    summary: list[str] = []
    survivors: list[Mutant] = []
    matched: set[str] = set()
    for target in chosen:
        print(f"{target.path} ({', '.join(target.tests)})", flush=True)
        outcomes, excluded = run_target(
            target, exclusions, limit=args.limit, only=set(args.only), out=summary
        )
        survivors += [o.mutant for o in outcomes if not o.killed]
        matched.update(m.key for m in excluded)
    print(f"\nmutation run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for line in summary:
        print(line)
    if survivors:
        print(f"\n{len(survivors)} survivors (no test fails when this slip is made):")
        for survivor in survivors:
            print(f"  {survivor.key}")
    chosen_paths = {t.path for t in chosen}
    stale = [
        key
        for key in exclusions
        if key.split(":", 1)[0] in chosen_paths
        and key not in matched
        and args.limit is None
        and not args.only
    ]
    if stale:
        print("\nexclusions that name no mutant any more (update tools/mutate/equivalent.txt):")
        for key in stale:
            print(f"  {key}")
    return 1 if survivors or stale else 0
