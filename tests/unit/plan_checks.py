"""Assertions on a decision core's actions that an empty plan cannot satisfy.

`assert not [a for a in plan.actions if ...]` also passes when the planner decides nothing
at all: a planner broken to return an empty plan keeps such a test green. So:

- `expect_actions` asserts the plan holds actions of a kind with the given attributes (at
  least one, or exactly `count`) and returns them for further checks;
- `expect_no_actions` asserts there is no such action *and* that the plan holds something
  else the test names (`while_it_has`), so the absence is a decision, not a silence.

Attributes are compared by equality; `pod__name="w-0"` reads `action.pod.name`.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from typing import Any, TypeVar

A = TypeVar("A")


def _read(action: object, path: str) -> Any:
    value: Any = action
    for part in path.split("__"):
        value = getattr(value, part)
    return value


def _matches(action: object, kind: type[Any], fields: dict[str, Any]) -> bool:
    return isinstance(action, kind) and all(
        _read(action, name) == value for name, value in fields.items()
    )


def _shown(actions: list[object]) -> str:
    if not actions:
        return "(no action at all)"
    return "\n  ".join(reprlib.repr(a) if len(repr(a)) > 300 else repr(a) for a in actions)


def expect_actions(
    actions: Iterable[object], kind: type[A], *, count: int | None = None, **fields: Any
) -> list[A]:
    """The actions of `kind` with these attributes; fails when there is none (or not exactly
    `count`)."""
    if count == 0:
        # An empty plan would pass it: absence is asserted with expect_no_actions, beside
        # something the plan must hold.
        raise ValueError("count=0 proves nothing: use expect_no_actions(..., while_it_has=...)")
    every = list(actions)
    found = [a for a in every if isinstance(a, kind) and _matches(a, kind, fields)]
    wanted = f"exactly {count}" if count is not None else "at least one"
    ok = len(found) == count if count is not None else bool(found)
    assert ok, (
        f"expected {wanted} {kind.__name__} with {fields}, found {len(found)}; "
        f"the plan:\n  {_shown(every)}"
    )
    return found


def expect_no_actions(
    actions: Iterable[object],
    kind: type[Any],
    *,
    while_it_has: type[Any] | tuple[type[Any], ...],
    **fields: Any,
) -> None:
    """No action of `kind` with these attributes, in a plan that does hold an action of
    `while_it_has` (proof that the planner ran and decided)."""
    every = list(actions)
    unwanted = [a for a in every if _matches(a, kind, fields)]
    assert not unwanted, f"expected no {kind.__name__} with {fields}, found:\n  {_shown(unwanted)}"
    evidence = while_it_has if isinstance(while_it_has, tuple) else (while_it_has,)
    assert any(isinstance(a, evidence) for a in every), (
        f"the plan holds no {' or '.join(k.__name__ for k in evidence)}: an empty or silent "
        f"plan proves nothing; the plan:\n  {_shown(every)}"
    )
