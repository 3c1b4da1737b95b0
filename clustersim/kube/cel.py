"""CEL for CRD ``x-kubernetes-validations``, on Google's CEL implementation (cel-expr-python).

Rules are parsed, type-checked and evaluated by the library; this module only declares the
environment kube-apiserver gives CRD rules and adapts the results:

* variables ``self`` and ``oldSelf``, both dynamically typed (kube-apiserver types them from the
  schema; the emulator leaves the checks that needs to evaluation time);
* the standard library (``has()``, ``size()``, ``all``/``exists``/``exists_one``/``map``/
  ``filter``, ``matches``, conversions, timestamps, durations), the strings extension at the
  version kube-apiserver's base environment declares (2: ``format``, ``join``, ``lowerAscii``,
  ``split``, ...) and optional types (``self.?field.orValue(...)``).

Kubernetes' own libraries (quantity, lists, regex ``find``, URLs, IP/CIDR, sets) are not
declared: a rule using one fails to compile, so a CRD relying on it is refused at creation
rather than having the rule silently skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cel_expr_python.cel as cel
import cel_expr_python.ext.ext_optional as ext_optional
import cel_expr_python.ext.ext_strings as ext_strings

#: The strings extension version of kube-apiserver's base CEL environment.
KUBERNETES_STRINGS_VERSION = 2


class CelCompileError(ValueError):
    """The expression does not parse or type-check (the message is the library's)."""


class CelEvalError(ValueError):
    """A runtime error (``no such key``, no matching overload, division by zero...)."""


def _environment(variables: tuple[str, ...]) -> cel.Env:
    return cel.NewEnv(
        variables={name: cel.Type.DYN for name in variables},
        extensions=[
            ext_strings.ExtStrings(version=KUBERNETES_STRINGS_VERSION),
            ext_optional.ExtOptional(),
        ],
    )


# Two environments instead of walking the parsed expression: a rule that compiles without
# ``oldSelf`` declared does not read it, so it is not a transition rule.
_SELF_ONLY = _environment(("self",))
_TRANSITION = _environment(("self", "oldSelf"))

# The library reports errors as ``<absl status code>: <message>``, compile errors with a
# trailing `` [<code>]``; kube-apiserver (cel-go) shows the message alone.
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r" \[[A-Z_]+\]$")
# cel-go's wording for the runtime errors rules most often hit, so that a cause reads as
# kube-apiserver's does.
_GO_WORDING = (
    (re.compile(r'^Key not found in map : "?(.*?)"?$'), r"no such key: \1"),
    (re.compile(r"^No matching overloads found : (.*)$"), r"no such overload: \1"),
    (
        re.compile(r"^Index error: index=(-?\d+) size=(\d+)$"),
        r"index '\1' out of range in list size '\2'",
    ),
    (re.compile(r"^divide by zero$"), "division by zero"),
    (re.compile(r"^modulus by zero$"), "modulus by zero"),
)


def _library_message(text: str) -> str:
    return _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))


def _runtime_message(text: str) -> str:
    message = _library_message(text)
    for pattern, replacement in _GO_WORDING:
        if pattern.match(message):
            return pattern.sub(replacement, message)
    return message


@dataclass(frozen=True)
class Compiled:
    """A compiled expression, the variables it reads and its static result type."""

    source: str
    expression: cel.Expression
    variables: frozenset[str]

    @property
    def result_type(self) -> str:
        """``bool``, ``string``, ``int``, ... or ``dyn`` when only evaluation can tell."""
        return str(self.expression.return_type().name()).lower()

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The expression's value as plain Python (None, bool, int, float, str, list, dict)."""
        data = {name: _nul_substituted(env[name], NUL, NUL_STAND_IN) for name in self.variables}
        result = self.expression.eval(data=data)
        if result.type() == cel.Type.ERROR:
            message = _runtime_message(str(result.value()))
            raise CelEvalError(message.replace(NUL_STAND_IN, NUL))
        return _nul_substituted(result.plain_value(), NUL_STAND_IN, NUL)


# The library hands strings to C++ as NUL-terminated, so it cuts every string and map key at
# its first NUL: {"": 1, "\x00": 2} becomes a map with a duplicate key, "a\x00b" equals "a".
# JSON allows NUL (\u0000) and cel-go, in kube-apiserver, keeps it. The emulator hands the
# library a stand-in code point instead and maps it back in results and messages: one code
# point for one, so equality, size() and indexing are kube-apiserver's. What differs: ordering
# (NUL sorts first, the stand-in last) and a value that already holds the stand-in.
NUL = "\x00"
NUL_STAND_IN = "\U0010ffff"


def _nul_substituted(value: Any, old: str, new: str) -> Any:
    """`value` with `old` replaced by `new` in every string and key; `value` itself (not a
    copy) when none holds it, as almost every value is."""
    return _replaced(value, old, new) if _holds(value, old) else value


def _holds(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return text in value
    if isinstance(value, dict):
        return any(text in key or _holds(item, text) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds(item, text) for item in value)
    return False


def _replaced(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new) if old in value else value
    if isinstance(value, dict):
        return {_replaced(key, old, new): _replaced(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, old, new) for item in value]
    return value


@lru_cache(maxsize=1024)
def compile_rule(source: str) -> Compiled:
    """Parse and type-check ``source``; raises ``CelCompileError`` with the library's message."""
    try:
        return Compiled(source, _SELF_ONLY.compile(source), frozenset({"self"}))
    except RuntimeError:
        pass
    try:
        expression = _TRANSITION.compile(source)
    except RuntimeError as exc:
        raise CelCompileError(_library_message(str(exc))) from exc
    return Compiled(source, expression, frozenset({"self", "oldSelf"}))
