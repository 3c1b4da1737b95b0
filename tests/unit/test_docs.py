"""docs/ stays true: every file, function and test a page cites exists, every page is indexed,
and no code comment points anywhere but docs/ for the rules it implements.

A citation is an inline code span that starts with one of the repository's top folders:
`services/x/y.py` (the file must exist) or `services/x/y.py::name` (a function, class or
assignment of that name must be defined in it; `Class.method` is looked up inside the class).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SERVICE_PAGES = (
    "k8s-watcher.md",
    "slurm-syncer.md",
    "nodeset-controller.md",
    "maintenance-scheduler.md",
    "topology-placer.md",
    "metrics-exporter.md",
)
CITED_ROOTS = ("services", "libs", "tests", "clustersim", "bench", "k8s", "proto", "tools", "docs")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
CITATION = re.compile(r"^(?:" + "|".join(CITED_ROOTS) + r")/[\w./-]+(?:::[\w.]+)?$")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#([^)\s]*))?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
SECTION = re.compile(r"^##\s+(.+?)\s*$", re.MULTILINE)
# The specification we work from lives outside the repository; nothing in it may point there.
# The names are assembled so that this file does not match its own check.
_SPEC_FILES = (
    "sunk-" + "nodeset",
    "slinky-" + "nodeset-controller",
    "nvidia-" + "maintenance-operator",
    "koordinator-" + "gang-topology",
    "skyhook-" + "jobs-proposal",
)
OUTSIDE_SPEC = re.compile(
    r"\.\./"
    + "shared"
    + r"|/work/"
    + "shared"
    + r"|anchors\.md|(?:"
    + "|".join(_SPEC_FILES)
    + r")\.txt"
)
SOURCE_DIRS = ("services", "libs", "tests", "clustersim", "bench", "k8s", "docs")
SOURCE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml"}


@functools.cache
def defined_names(path: Path) -> frozenset[str]:
    """Every name a Python file defines at top level, and `Class.member` for class members."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                names.update(f"{node.name}.{name}" for name in targets(member))
    return frozenset(names)


def citation_problem(citation: str, root: Path = ROOT) -> str | None:
    """Why `citation` does not hold in the tree under `root`, or None when it does."""
    path_text, _, name = citation.partition("::")
    path = root / path_text
    if not path.exists():
        return f"{citation}: no file {path_text}"
    if not name:
        return None
    if path.suffix != ".py" or not path.is_file():
        return f"{citation}: only a Python file can be cited with ::name"
    if name not in defined_names(path):
        return f"{citation}: {path_text} defines no {name}"
    return None


def anchor_of(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.lower())
    return kept.replace(" ", "-")


def anchors_in(page: Path) -> set[str]:
    return {anchor_of(heading) for heading in HEADING.findall(page.read_text())}


def page_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Every citation or relative link of a page that does not hold, and any pointer outside."""
    text = page.read_text()
    problems = []
    for span in CODE_SPAN.findall(text):
        if CITATION.match(span) and (problem := citation_problem(span, root)) is not None:
            problems.append(f"{page.name}: {problem}")
    for target, anchor in MARKDOWN_LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        linked = page.parent / target
        if not linked.exists():
            problems.append(f"{page.name}: link to missing {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors_in(linked):
            problems.append(f"{page.name}: link to missing section {target}#{anchor}")
    if OUTSIDE_SPEC.search(text):
        problems.append(f"{page.name}: points outside the repository")
    return problems


def test_every_cited_file_function_and_test_exists() -> None:
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    problems = [problem for page in pages for problem in page_problems(page)]
    assert problems == []


def test_a_page_citing_a_missing_test_or_file_is_caught(tmp_path: Path) -> None:
    real = "tests/unit/test_docs.py::test_every_cited_file_function_and_test_exists"
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        f"- `{real}`\n"
        "- `tests/unit/test_docs.py::test_that_was_never_written`\n"
        "- `services/no_such_service/planner.py`\n"
        "- [gone](missing.md)\n"
        "- [no such section](page.md#nowhere)\n"
        "## A section (here)\n"
        "- [this section](page.md#a-section-here)\n"
    )
    problems = page_problems(page, ROOT)
    assert len(problems) == 4
    assert "test_that_was_never_written" in problems[0]
    assert "no file services/no_such_service/planner.py" in problems[1]
    assert "missing.md" in problems[2]
    assert "page.md#nowhere" in problems[3]


def test_a_class_member_is_found_inside_its_class_only() -> None:
    module = "libs/nodeflow_contracts/slurm.py"
    assert citation_problem(f"{module}::SlurmClusterStatus.fresh") is None
    assert citation_problem(f"{module}::fresh") is not None


def test_the_index_lists_every_page_and_every_service_has_one() -> None:
    index = (DOCS / "README.md").read_text()
    pages = {page.name for page in DOCS.glob("*.md")} - {"README.md"}
    assert set(SERVICE_PAGES) | {"protocols.md"} <= pages
    linked = {target for target, _ in MARKDOWN_LINK.findall(index)}
    assert pages <= linked


def test_every_service_page_says_what_no_test_covers_yet() -> None:
    """Each service page ends with "Not yet covered", after every rule and reference section."""
    for name in SERVICE_PAGES:
        sections = SECTION.findall((DOCS / name).read_text())
        assert sections and sections[-1] == "Not yet covered", (name, sections)


def test_no_comment_points_at_the_specification_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    offenders = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or path.resolve() == this_file:
                continue
            if not path.is_file() or ".venv" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE_SPEC.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []
