"""Which code may import which, read from the sources with ast (every import counts: those
under `if TYPE_CHECKING:` and inside functions too, since each one is a dependency a reader
has to follow).

* clustersim has no import circle: the Kubernetes API emulator's object store knows nothing
  of its collaborators' modules (admission, garbage collection, disruption); they are given
  to it when the store is built (`clustersim/kube/store.py`).
* bench/ imports nothing from tests/: what both need (the chaos launcher, recorder and Slurm
  client) lives in `clustersim/chaos.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_statements(path: Path, root: Path) -> list[tuple[str, list[str]]]:
    """Each import statement of `path` as (the module it names, relative imports resolved;
    for `from package import a, b` also `package.a` and `package.b`, which may be modules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [f"{base}.{alias.name}" for alias in node.names]))
    return found


def import_graph(package_dir: Path, root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package tree it imports: for `from package import
    name`, the module `package.name` when there is one, else `package` itself."""
    files = {module_name(path, root): path for path in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets: set[str] = set()
        for base, names in import_statements(path, root):
            submodules = [name for name in names if name in files]
            targets.update(submodules)
            if len(submodules) < len(names) or not names:
                targets.add(base)
        graph[module] = (targets & files.keys()) - {module}
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def imports_from(package_dir: Path, root: Path, forbidden: str) -> list[str]:
    """`file: module` for each import under `package_dir` of `forbidden` or a module in it."""
    return [
        f"{path.relative_to(root)}: {base}"
        for path in sorted(package_dir.rglob("*.py"))
        for base, _ in import_statements(path, root)
        if base == forbidden or base.startswith(forbidden + ".")
    ]


def test_clustersim_has_no_import_circle() -> None:
    assert cycles(import_graph(ROOT / "clustersim", ROOT)) == []


def test_bench_imports_nothing_from_tests() -> None:
    assert imports_from(ROOT / "bench", ROOT, "tests") == []


def write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_an_import_only_for_type_checking_closes_a_circle_too(tmp_path: Path) -> None:
    # The shape clustersim/kube had: the store builds its collaborators, they name its type.
    write(
        tmp_path,
        {
            "sim/__init__.py": "",
            "sim/kube/__init__.py": "",
            "sim/kube/store.py": "from sim.kube.gc import Collector\n",
            "sim/kube/gc.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from sim.kube.store import Store\n"
            ),
            "sim/kube/objects.py": "from . import gc\nfrom .. import kube\n",
        },
    )
    graph = import_graph(tmp_path / "sim", tmp_path)
    assert graph["sim.kube.objects"] == {"sim.kube", "sim.kube.gc"}
    assert cycles(graph) == [["sim.kube.gc", "sim.kube.store"]]


def test_a_one_way_chain_is_no_circle(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "sim/__init__.py": "",
            "sim/store.py": "import sim.objects\n",
            "sim/gc.py": "from sim import store\n",
            "sim/objects.py": "",
        },
    )
    assert cycles(import_graph(tmp_path / "sim", tmp_path)) == []


def test_an_import_inside_a_function_is_seen(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/run.py": "def main():\n    from tests.e2e.support import Stack\n",
        },
    )
    assert imports_from(tmp_path / "bench", tmp_path, "tests") == [
        "bench/run.py: tests.e2e.support"
    ]
