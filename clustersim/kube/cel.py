"""A small CEL (Common Expression Language) evaluator for CRD ``x-kubernetes-validations``.

It covers the expression forms CRD validation rules commonly use, evaluated over JSON values:

* literals: integers, doubles, strings ('..', "..", raw r'..'), ``true``/``false``/``null``,
  lists ``[a, b]`` and maps ``{'k': v}``; the variables ``self`` and ``oldSelf``
* field selection ``a.b``, indexing ``a[0]`` / ``a['k']``, the ``has(a.b)`` macro
* operators ``! - * / % + - < <= > >= == != in && || ?:``
* functions ``size(x)`` / ``x.size()``, ``x.startsWith(s)``, ``x.endsWith(s)``,
  ``x.contains(s)``, ``x.matches(re)``, ``int(x)``, ``string(x)``, ``double(x)``,
  ``'...'.format([args])`` with ``%s``, ``%d`` and ``%%``,
  and the macros ``x.all(v, p)``, ``x.exists(v, p)``, ``x.exists_one(v, p)``

Anything else is rejected by ``compile_rule`` with ``CelUnsupported`` so that a CRD using it is
refused at creation instead of having the rule silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


class CelUnsupported(ValueError):
    """The expression is outside the subset this evaluator implements (or is not valid CEL)."""


class CelEvalError(ValueError):
    """A runtime error (``no such key``, type mismatch, division by zero...)."""


# --------------------------------------------------------------------------- lexer

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<float>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>0x[0-9a-fA-F]+|\d+)(?P<unsigned>[uU])?
  | (?P<string>[rR]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    """,
    re.VERBOSE,
)

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_RESERVED = {"in", "as", "break", "const", "continue", "else", "for", "function", "if", "import"}


@dataclass(frozen=True)
class Token:
    kind: str  # int, float, string, ident, op, end
    text: str
    value: Any = None


def _unquote(text: str) -> str:
    raw = text[0] in "rR"
    body = text[2:-1] if raw else text[1:-1]
    if raw:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "uU" or nxt == "x":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
            i += 2 + width
        else:
            raise CelUnsupported(f"unsupported escape sequence \\{nxt}")
    return "".join(out)


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN_RE.match(source, pos)
        if match is None:
            raise CelUnsupported(f"unexpected character {source[pos]!r} at offset {pos}")
        pos = match.end()
        kind = match.lastgroup
        text = match.group(0)
        if match.group("ws"):
            continue
        if match.group("int") is not None:
            literal = match.group("int")
            tokens.append(Token("int", text, int(literal, 16 if literal.startswith("0x") else 10)))
        elif kind == "float":
            tokens.append(Token("float", text, float(text)))
        elif kind == "string":
            tokens.append(Token("string", text, _unquote(text)))
        elif kind == "ident":
            tokens.append(Token("op" if text == "in" else "ident", text))
        else:
            tokens.append(Token("op", text))
    tokens.append(Token("end", ""))
    return tokens


# --------------------------------------------------------------------------- AST

Env = Mapping[str, Any]
Node = Callable[[Env], Any]


@dataclass(frozen=True)
class Compiled:
    """A compiled expression: ``evaluate(env)`` plus the variables it reads."""

    source: str
    run: Node
    variables: frozenset[str]

    def evaluate(self, env: Env) -> Any:
        return self.run(env)


def _type_name(value: Any) -> str:
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def cel_equal(a: Any, b: Any) -> bool:
    """CEL equality: no bool/number confusion, numbers compare across int/double."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(cel_equal(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    return bool(a == b)


def _require_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise CelEvalError(f"no such overload: {what} applied to {_type_name(value)}")
    return value


def _compare(op: str, a: Any, b: Any) -> bool:
    numbers = (
        isinstance(a, int | float)
        and isinstance(b, int | float)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    )
    same = type(a) is type(b) and isinstance(a, str | bool)
    if not (numbers or same):
        raise CelEvalError(f"no such overload: {_type_name(a)} {op} {_type_name(b)}")
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _arith(op: str, a: Any, b: Any) -> Any:
    if op == "+" and isinstance(a, str) and isinstance(b, str):
        return a + b
    if op == "+" and isinstance(a, list) and isinstance(b, list):
        return a + b
    if (
        not isinstance(a, int | float)
        or not isinstance(b, int | float)
        or isinstance(a, bool)
        or isinstance(b, bool)
        or type(a) is not type(b)
    ):
        raise CelEvalError(f"no such overload: {_type_name(a)} {op} {_type_name(b)}")
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0 and isinstance(a, int):
        raise CelEvalError("division by zero" if op == "/" else "modulus by zero")
    if op == "/":
        return int(a / b) if isinstance(a, int) else a / b
    if isinstance(a, float):
        raise CelEvalError("no such overload: double % double")
    return a - b * int(a / b)  # CEL truncates toward zero like Go


def _select(value: Any, name: str) -> Any:
    if not isinstance(value, dict):
        raise CelEvalError(f"no such key: {name} (on {_type_name(value)})")
    if name not in value:
        raise CelEvalError(f"no such key: {name}")
    return value[name]


def _index(value: Any, key: Any) -> Any:
    if isinstance(value, list):
        if not isinstance(key, int) or isinstance(key, bool):
            raise CelEvalError(f"unsupported index type {_type_name(key)} for list")
        if not 0 <= key < len(value):
            raise CelEvalError(f"index out of bounds: {key}")
        return value[key]
    if isinstance(value, dict):
        if key not in value:
            raise CelEvalError(f"no such key: {key}")
        return value[key]
    raise CelEvalError(f"cannot index {_type_name(value)}")


def _size(value: Any) -> int:
    if isinstance(value, str | list | dict):
        return len(value)
    raise CelEvalError(f"no such overload: size({_type_name(value)})")


def _string_method(name: str, target: Any, arg: Any) -> Any:
    if not isinstance(target, str) or not isinstance(arg, str):
        raise CelEvalError(f"no such overload: {_type_name(target)}.{name}({_type_name(arg)})")
    if name == "startsWith":
        return target.startswith(arg)
    if name == "endsWith":
        return target.endswith(arg)
    if name == "contains":
        return arg in target
    return _regex(arg).search(target) is not None


_FORMAT_VERB = re.compile(r"%(.)", re.DOTALL)


def _format(target: Any, args: Any) -> str:
    """The strings extension's ``'...'.format([args])`` for the verbs messages use: ``%s``
    (any value, as ``string()`` renders it), ``%d`` (an integer) and ``%%``."""
    if not isinstance(target, str) or not isinstance(args, list):
        raise CelEvalError(f"no such overload: {_type_name(target)}.format({_type_name(args)})")
    remaining = list(args)

    def verb(match: re.Match[str]) -> str:
        kind = match.group(1)
        if kind == "%":
            return "%"
        if not remaining:
            raise CelEvalError("format: not enough arguments")
        value = remaining.pop(0)
        if kind == "s":
            return value if isinstance(value, str) else _convert("string", value)
        if kind == "d" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise CelEvalError(f"format: %{kind} does not accept {_type_name(value)}")

    return _FORMAT_VERB.sub(verb, target)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CelEvalError(f"invalid regular expression {pattern!r}: {exc}") from exc


def _convert(name: str, value: Any) -> Any:
    if name == "int":
        if isinstance(value, bool):
            raise CelEvalError("no such overload: int(bool)")
        if isinstance(value, int | float):
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError as exc:
                raise CelEvalError(f"cannot convert {value!r} to int") from exc
    if name == "double":
        if isinstance(value, bool):
            raise CelEvalError("no such overload: double(bool)")
        if isinstance(value, int | float | str):
            try:
                return float(value)
            except ValueError as exc:
                raise CelEvalError(f"cannot convert {value!r} to double") from exc
    if name == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float | str):
            return str(value)
    raise CelEvalError(f"no such overload: {name}({_type_name(value)})")


_STRING_METHODS = {"startsWith", "endsWith", "contains", "matches"}
_GLOBAL_FUNCTIONS = {"size", "int", "double", "string"}
_MACROS = {"all", "exists", "exists_one"}


# --------------------------------------------------------------------------- parser


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.variables: set[str] = set()
        self.bound: list[str] = []

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def accept(self, text: str) -> bool:
        token = self.peek()
        if token.kind == "op" and token.text == text:
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            found = self.peek().text or "end of expression"
            raise CelUnsupported(f"expected {text!r}, found {found!r}")

    def parse(self) -> Compiled:
        node = self.expr()
        if self.peek().kind != "end":
            raise CelUnsupported(f"unexpected {self.peek().text!r}")
        return Compiled(self.source, node, frozenset(self.variables))

    # expr = or ['?' or ':' expr]
    def expr(self) -> Node:
        cond = self.or_()
        if not self.accept("?"):
            return cond
        then = self.or_()
        self.expect(":")
        other = self.expr()

        def ternary(env: Env) -> Any:
            return then(env) if _require_bool(cond(env), "?:") else other(env)

        return ternary

    def or_(self) -> Node:
        left = self.and_()
        while self.accept("||"):
            left = _logical(left, self.and_(), is_or=True)
        return left

    def and_(self) -> Node:
        left = self.relation()
        while self.accept("&&"):
            left = _logical(left, self.relation(), is_or=False)
        return left

    def relation(self) -> Node:
        left = self.addition()
        while True:
            token = self.peek()
            if token.kind != "op" or token.text not in ("==", "!=", "<", "<=", ">", ">=", "in"):
                return left
            self.pos += 1
            left = _relation(token.text, left, self.addition())

    def addition(self) -> Node:
        left = self.multiplication()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            op = self.take().text
            left = _binary_arith(op, left, self.multiplication())
        return left

    def multiplication(self) -> Node:
        left = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "%"):
            op = self.take().text
            left = _binary_arith(op, left, self.unary())
        return left

    def unary(self) -> Node:
        if self.accept("!"):
            operand = self.unary()
            return lambda env: not _require_bool(operand(env), "!")
        if self.accept("-"):
            operand = self.unary()

            def negate(env: Env) -> Any:
                value = operand(env)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise CelEvalError(f"no such overload: -{_type_name(value)}")
                return -value

            return negate
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                name = self.take()
                if name.kind != "ident":
                    raise CelUnsupported(f"expected a field name after '.', found {name.text!r}")
                if self.accept("("):
                    node = self.method(node, name.text)
                else:
                    node = _selector(node, name.text)
            elif self.accept("["):
                key = self.expr()
                self.expect("]")
                node = _indexer(node, key)
            else:
                return node

    def method(self, target: Node, name: str) -> Node:
        if name in _MACROS:
            return self.macro(target, name)
        args = self.arguments()
        if name == "size" and not args:
            return lambda env: _size(target(env))
        if name in _STRING_METHODS and len(args) == 1:
            arg = args[0]
            return lambda env: _string_method(name, target(env), arg(env))
        if name == "format" and len(args) == 1:
            values = args[0]
            return lambda env: _format(target(env), values(env))
        raise CelUnsupported(f"unsupported function: .{name}() with {len(args)} argument(s)")

    def macro(self, target: Node, name: str) -> Node:
        var = self.take()
        if var.kind != "ident":
            raise CelUnsupported(f"{name}() needs a variable name as its first argument")
        self.expect(",")
        self.bound.append(var.text)
        predicate = self.expr()
        self.bound.pop()
        self.expect(")")
        return _comprehension(name, target, var.text, predicate)

    def arguments(self) -> list[Node]:
        args: list[Node] = []
        if self.accept(")"):
            return args
        while True:
            args.append(self.expr())
            if self.accept(")"):
                return args
            self.expect(",")

    def primary(self) -> Node:
        token = self.take()
        if token.kind in ("int", "float", "string"):
            value = token.value
            return lambda env: value
        if token.kind == "ident":
            return self.identifier(token.text)
        if token.kind == "op" and token.text == "(":
            inner = self.expr()
            self.expect(")")
            return inner
        if token.kind == "op" and token.text == "[":
            return self.list_literal()
        if token.kind == "op" and token.text == "{":
            return self.map_literal()
        raise CelUnsupported(f"unexpected {token.text or 'end of expression'!r}")

    def identifier(self, name: str) -> Node:
        if name in ("true", "false"):
            flag = name == "true"
            return lambda env: flag
        if name == "null":
            return lambda env: None
        if self.accept("("):
            return self.global_call(name)
        if name in self.bound:
            return lambda env: env[name]
        if name in ("self", "oldSelf"):
            self.variables.add(name)
            return lambda env: env[name]
        if name in _RESERVED:
            raise CelUnsupported(f"reserved identifier {name!r}")
        raise CelUnsupported(f"undeclared reference to {name!r}")

    def global_call(self, name: str) -> Node:
        if name == "has":
            arg = self.expr()
            self.expect(")")
            return self.has_macro(arg)
        args = self.arguments()
        if name in _GLOBAL_FUNCTIONS and len(args) == 1:
            arg = args[0]
            if name == "size":
                return lambda env: _size(arg(env))
            return lambda env: _convert(name, arg(env))
        raise CelUnsupported(f"unsupported function: {name}() with {len(args)} argument(s)")

    @staticmethod
    def has_macro(arg: Node) -> Node:
        if not isinstance(arg, _Select):
            raise CelUnsupported("invalid argument to has() macro: needs a field selection")
        target, field_name = arg.target, arg.name

        def has(env: Env) -> bool:
            value = target(env)
            if not isinstance(value, dict):
                raise CelEvalError(f"has() applied to {_type_name(value)}")
            return field_name in value

        return has

    def list_literal(self) -> Node:
        items: list[Node] = []
        if not self.accept("]"):
            while True:
                items.append(self.expr())
                if self.accept("]"):
                    break
                self.expect(",")
        return lambda env: [item(env) for item in items]

    def map_literal(self) -> Node:
        entries: list[tuple[Node, Node]] = []
        if not self.accept("}"):
            while True:
                key = self.expr()
                self.expect(":")
                entries.append((key, self.expr()))
                if self.accept("}"):
                    break
                self.expect(",")
        return lambda env: {k(env): v(env) for k, v in entries}


def _logical(left: Node, right: Node, *, is_or: bool) -> Node:
    # CEL's logical operators are commutative over errors: an error on one side is absorbed
    # when the other side alone decides the result.
    def run(env: Env) -> bool:
        decided = is_or
        error: CelEvalError | None = None
        try:
            if _require_bool(left(env), "||" if is_or else "&&") is decided:
                return decided
        except CelEvalError as exc:
            error = exc
        value = _require_bool(right(env), "||" if is_or else "&&")
        if value is decided:
            return decided
        if error is not None:
            raise error
        return not decided

    return run


def _relation(op: str, left: Node, right: Node) -> Node:
    if op == "==":
        return lambda env: cel_equal(left(env), right(env))
    if op == "!=":
        return lambda env: not cel_equal(left(env), right(env))
    if op == "in":

        def contains(env: Env) -> bool:
            item, container = left(env), right(env)
            if isinstance(container, list):
                return any(cel_equal(item, x) for x in container)
            if isinstance(container, dict):
                return item in container
            raise CelEvalError(f"no such overload: in {_type_name(container)}")

        return contains
    return lambda env: _compare(op, left(env), right(env))


def _binary_arith(op: str, left: Node, right: Node) -> Node:
    return lambda env: _arith(op, left(env), right(env))


@dataclass(frozen=True)
class _Select:
    """``target.name``; a class (not a closure) so that ``has()`` can take it apart."""

    target: Node
    name: str

    def __call__(self, env: Env) -> Any:
        return _select(self.target(env), self.name)


def _selector(target: Node, name: str) -> Node:
    return _Select(target, name)


def _indexer(target: Node, key: Node) -> Node:
    return lambda env: _index(target(env), key(env))


def _comprehension(name: str, target: Node, var: str, predicate: Node) -> Node:
    def run(env: Env) -> bool:
        collection = target(env)
        if isinstance(collection, dict):
            items: list[Any] = list(collection)
        elif isinstance(collection, list):
            items = collection
        else:
            raise CelEvalError(f"no such overload: {_type_name(collection)}.{name}()")
        results = []
        for item in items:
            scope = dict(env)
            scope[var] = item
            results.append(_require_bool(predicate(scope), name))
        if name == "all":
            return all(results)
        if name == "exists":
            return any(results)
        return sum(results) == 1

    return run


@lru_cache(maxsize=1024)
def compile_rule(source: str) -> Compiled:
    """Parse ``source``; raises ``CelUnsupported`` for anything outside the subset."""
    if not source.strip():
        raise CelUnsupported("empty expression")
    return _Parser(source).parse()
