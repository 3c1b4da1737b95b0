"""One-line mutants of a Python module, made on its syntax tree.

Each mutant changes one thing the way a realistic slip would: a comparison loosened or
turned (`<` for `<=`, `==` for `!=`, `in` for `not in`), a constant off by one, a `not`
dropped, one operand of `and`/`or` dropped or the two swapped, a comprehension's filter
dropped, an `if` turned round, a call statement (an action appended, a stage run) dropped,
a sort reversed, `min` for `max`, `+` for `-`, a rounding turned (`ceil` for `floor`), a
boolean constant flipped.

A mutant is found again by its site: the index of its node in `ast.walk` order over the
parsed module (deterministic for one source text) and which variant of that site it is.
Annotations are left alone (they change no behaviour), and so are log calls.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

_TURNED_COMPARISONS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_SYMBOL: dict[type[ast.AST], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
}
_SWAPPED_CALLS = {"min": "max", "max": "min"}
_SWAPPED_ROUNDING = {"ceil": "floor", "floor": "ceil"}
# Calls on these names only log or count: dropping one changes no decision.
_QUIET_RECEIVERS = frozenset({"log", "logger", "_log", "LOG", "structlog", "metrics"})


@dataclass(frozen=True)
class Mutant:
    """One mutation of one module: where it is (line), what it does (description), and how
    to find its site again (node index in walk order, variant at that site)."""

    path: str
    line: int
    description: str
    node_index: int
    variant: int

    @property
    def key(self) -> str:
        """How the exclusion list names it."""
        return f"{self.path}:{self.line}: {self.description}"


# A site's variants: (description, edit). The edit changes the tree in place, given the
# node and a function that replaces the node in its parent.
Replace = Callable[[ast.AST], None]
Edit = Callable[[ast.AST, Replace], None]


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation, a docstring or a `TYPE_CHECKING` block."""
    skipped: set[int] = set()

    def skip(node: ast.AST | None) -> None:
        if node is not None:
            skipped.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign):
            skip(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skip(node.returns)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            # Decorators (`@dataclass(frozen=True)`, `@lru_cache(maxsize=256)`) shape the
            # object, not a decision: their mutants only test Python.
            for decorator in node.decorator_list:
                skip(decorator)
        elif _skipped_whole(node):
            skip(node)
    return skipped


def _skipped_whole(node: ast.AST) -> bool:
    """A `TYPE_CHECKING` block, `__all__`, or a log call: no decision lives there."""
    if isinstance(node, ast.If):
        return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    return isinstance(node, ast.Call) and _is_quiet_call(node)


def _is_quiet_call(call: ast.Call) -> bool:
    receiver = call.func
    while isinstance(receiver, ast.Attribute | ast.Call):
        receiver = receiver.value if isinstance(receiver, ast.Attribute) else receiver.func
    return isinstance(receiver, ast.Name) and receiver.id in _QUIET_RECEIVERS


def _set_attr(attr: str, value: object) -> Edit:
    def edit(node: ast.AST, _replace: Replace) -> None:
        setattr(node, attr, value)

    return edit


def _variants(node: ast.AST) -> Iterator[tuple[str, Edit]]:
    if isinstance(node, ast.Compare):
        for position, op in enumerate(node.ops):
            turned = _TURNED_COMPARISONS.get(type(op))
            if turned is None:
                continue

            def turn(
                n: ast.AST, _r: Replace, position: int = position, turned: type = turned
            ) -> None:
                assert isinstance(n, ast.Compare)
                n.ops[position] = turned()

            yield f"{_SYMBOL[type(op)]} -> {_SYMBOL[turned]}", turn
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            yield f"{node.value} -> {not node.value}", _set_attr("value", not node.value)
        elif isinstance(node.value, int):
            yield f"{node.value} -> {node.value + 1}", _set_attr("value", node.value + 1)
            yield f"{node.value} -> {node.value - 1}", _set_attr("value", node.value - 1)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = node.operand
        yield "not dropped", lambda _n, replace: replace(operand)
    elif isinstance(node, ast.BoolOp):
        name = "and" if isinstance(node.op, ast.And) else "or"
        other: type[ast.boolop] = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"{name} -> {'or' if name == 'and' else 'and'}", _set_attr("op", other())
        for position in range(len(node.values)):
            kept = [v for i, v in enumerate(node.values) if i != position]

            def drop(n: ast.AST, replace: Replace, kept: list[ast.expr] = kept) -> None:
                assert isinstance(n, ast.BoolOp)
                if len(kept) == 1:
                    replace(kept[0])
                else:
                    n.values = kept

            yield f"{name} operand {position + 1} dropped", drop
    elif isinstance(node, ast.comprehension):
        for position in range(len(node.ifs)):
            kept_ifs = [c for i, c in enumerate(node.ifs) if i != position]
            yield f"comprehension filter {position + 1} dropped", _set_attr("ifs", kept_ifs)
    elif isinstance(node, ast.If | ast.IfExp | ast.While):
        test = node.test
        negated = ast.UnaryOp(op=ast.Not(), operand=test)
        yield "condition negated", _set_attr("test", negated)
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call | ast.Await):
        yield "call statement dropped", lambda _n, replace: replace(ast.Pass())
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        turned_op: ast.operator = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        yield f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[type(turned_op)]}", _set_attr("op", turned_op)
    elif isinstance(node, ast.Call):
        yield from _call_variants(node)


def _call_variants(node: ast.Call) -> Iterator[tuple[str, Edit]]:
    func = node.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )
    if isinstance(func, ast.Name) and name in _SWAPPED_CALLS:
        yield f"{name} -> {_SWAPPED_CALLS[name]}", _set_attr("func", ast.Name(_SWAPPED_CALLS[name]))
    if isinstance(func, ast.Attribute) and name in _SWAPPED_ROUNDING:
        swapped = ast.Attribute(value=func.value, attr=_SWAPPED_ROUNDING[name], ctx=ast.Load())
        yield f"{name} -> {_SWAPPED_ROUNDING[name]}", _set_attr("func", swapped)
    if name in ("sorted", "sort"):
        reverse = next((k for k in node.keywords if k.arg == "reverse"), None)
        if reverse is None:
            added = [*node.keywords, ast.keyword(arg="reverse", value=ast.Constant(True))]
            yield "sort reversed", _set_attr("keywords", added)
        else:
            turned = ast.keyword(arg="reverse", value=ast.UnaryOp(ast.Not(), reverse.value))
            others = [k for k in node.keywords if k is not reverse]
            yield "sort reversed", _set_attr("keywords", [*others, turned])
    if isinstance(func, ast.Name) and name == "reversed" and len(node.args) == 1:
        only = node.args[0]
        yield "reversed dropped", lambda _n, replace: replace(only)


def _sites(tree: ast.AST) -> Iterator[tuple[int, ast.AST]]:
    skipped = _annotation_nodes(tree)
    for index, node in enumerate(ast.walk(tree)):
        if id(node) not in skipped:
            yield index, node


def find_mutants(path: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    found: list[Mutant] = []
    for index, node in _sites(tree):
        for variant, (description, _edit) in enumerate(_variants(node)):
            # A comprehension has no line of its own: its first filter's (or target's) line.
            where = node.ifs[0] if isinstance(node, ast.comprehension) and node.ifs else node
            line = int(
                getattr(where, "lineno", 0) or getattr(getattr(node, "target", None), "lineno", 0)
            )
            found.append(Mutant(path, line, description, index, variant))
    found.sort(key=lambda m: (m.line, m.node_index, m.variant))
    # Two like mutations on one line are told apart by their order on it.
    seen: dict[str, int] = {}
    named: list[Mutant] = []
    for mutant in found:
        count = seen[mutant.key] = seen.get(mutant.key, 0) + 1
        suffix = f" [{count}]" if count > 1 else ""
        named.append(replace(mutant, description=mutant.description + suffix))
    return named


def _parents(tree: ast.AST) -> dict[int, tuple[ast.AST, str, int | None]]:
    parents: dict[int, tuple[ast.AST, str, int | None]] = {}
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for position, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        parents[id(child)] = (parent, field, position)
            elif isinstance(value, ast.AST):
                parents[id(value)] = (parent, field, None)
    return parents


def mutated_source(source: str, mutant: Mutant) -> str:
    """The module's text with this one mutation made."""
    tree = ast.parse(source)
    parents = _parents(tree)
    node = next(n for i, n in enumerate(ast.walk(tree)) if i == mutant.node_index)
    description, edit = list(_variants(node))[mutant.variant]
    if not mutant.description.startswith(description):
        raise ValueError(f"{mutant.key}: the source changed under the mutant ({description})")

    def put(new: ast.AST) -> None:
        parent, field, position = parents[id(node)]
        if position is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[position] = new

    edit(node, put)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def original_text(source: str) -> str:
    """The module as `ast.unparse` writes it: a mutant equal to this changes nothing."""
    return ast.unparse(copy.deepcopy(ast.parse(source)))
