"""docs/benchmarks.md's table is made from bench/results.json (bench/_results.py), and
`make bench BENCH_RECORD=1` keeps what each benchmark printed there, dated, with its machine."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bench import _results
from bench.__main__ import _Tee
from bench._results import (
    BEGIN,
    DOC,
    END,
    RESULTS,
    Recorded,
    ResultsError,
    benchmark_modules,
    parse,
    record,
    render_table,
    rendered_page,
    with_run,
)

PAGE = f"# Benchmarks\n\nprose before\n\n{BEGIN}\nold table\n{END}\n\nprose after\n"


def test_rule_the_docs_table_is_the_recorded_results() -> None:
    page = DOC.read_text()
    assert page == rendered_page(page, parse(RESULTS.read_text())), (
        "docs/benchmarks.md's table is not bench/results.json's: "
        "run `python -m bench._results render`"
    )
    assert _results.main(["check"]) == 0


def test_rule_every_recorded_figure_names_a_benchmark_a_day_and_a_machine() -> None:
    results = parse(RESULTS.read_text())
    assert results
    for entry in results:
        assert entry.benchmark in benchmark_modules(), entry.benchmark
        assert entry.figures and entry.machine and entry.runs >= 1, entry


def test_a_table_edited_by_hand_is_caught() -> None:
    page = DOC.read_text()
    first_figure = parse(RESULTS.read_text())[0].figures[0]
    assert first_figure in page
    edited = page.replace(first_figure, first_figure.replace("0", "9", 1), 1)
    assert edited != page
    assert rendered_page(edited, parse(RESULTS.read_text())) != edited


def test_the_table_groups_figures_and_names_what_has_no_record() -> None:
    results = [
        Recorded("bus", "2026-11-23", "2 cores", ("takeover 0.87 x TTL", "a|b")),
        Recorded("bus", "2026-11-28", "4 cores", ("at 10k",), runs=2, setting="BENCH_N=10"),
    ]
    table = render_table(results, ["bus", "chaos"])
    assert table.splitlines() == [
        BEGIN,
        "",
        "| Benchmark | Figure | Measured | Runs | Machine (source) |",
        "|---|---|---|---|---|",
        "| `bus` | takeover 0.87 x TTL | 2026-11-23 | 1 | 2 cores (make bench) |",
        "|  | a\\|b |  |  |  |",
        "| `bus` `BENCH_N=10` | at 10k | 2026-11-28 | 2 | 4 cores (make bench) |",
        "",
        "No recorded figures yet: `chaos`.",
        "",
        END,
    ]
    page = rendered_page(PAGE, results, ["bus"])
    assert page.startswith("# Benchmarks\n\nprose before\n\n" + BEGIN)
    assert page.endswith(END + "\n\nprose after\n")
    with pytest.raises(ResultsError):
        rendered_page("# Benchmarks\n", results, ["bus"])


def test_rule_a_recorded_run_replaces_that_benchmarks_earlier_record(tmp_path: Path) -> None:
    results_path, doc = tmp_path / "results.json", tmp_path / "benchmarks.md"
    earlier = [
        Recorded("bus", "2026-11-23", "2 cores", ("old",), source="copied"),
        Recorded("bus", "2026-11-24", "2 cores", ("older day",), source="copied"),
        Recorded("bus", "2026-11-23", "2 cores", ("big",), setting="BENCH_BUS_SIZE=9"),
        Recorded("chaos", "2026-11-23", "2 cores", ("kill",)),
    ]
    results_path.write_text(_results.dumps(earlier))
    doc.write_text(PAGE)
    printed = ["   takeover 0.91 x TTL  ", "", "   hand-over 0.02 x TTL"]
    record(
        "bus",
        printed,
        results_path=results_path,
        doc=doc,
        environ={"BENCH_RECORD": "1", "BENCH_LOG_LEVEL": "error", "PATH": "/bin"},
    )
    kept = parse(results_path.read_text())
    assert [(r.benchmark, r.setting, r.figures) for r in kept] == [
        ("bus", "", ("takeover 0.91 x TTL", "hand-over 0.02 x TTL")),
        ("bus", "BENCH_BUS_SIZE=9", ("big",)),
        ("chaos", "", ("kill",)),
    ]
    fresh = kept[0]
    assert fresh.source == "make bench" and fresh.runs == 1
    assert fresh.date >= "2026-01-01"
    assert f"{_results.this_machine().split(',')[0]}," in fresh.machine
    assert doc.read_text() == rendered_page(PAGE, kept)
    assert "takeover 0.91 x TTL" in doc.read_text() and "old" not in doc.read_text()


def test_a_benchmark_setting_is_its_bench_variables_but_recording_and_logging() -> None:
    environ = {"BENCH_RECORD": "1", "BENCH_LOG_LEVEL": "debug", "BENCH_B": "2", "BENCH_A": "1"}
    assert _results.bench_setting(environ) == "BENCH_A=1 BENCH_B=2"


def test_results_that_are_not_a_list_of_runs_are_refused() -> None:
    with pytest.raises(ResultsError):
        parse(json.dumps({"bus": {}}))
    with pytest.raises(ResultsError):
        parse(json.dumps([{"benchmark": "bus", "date": "yesterday", "machine": "m"}]))


def test_the_tee_writes_through_and_keeps_the_lines() -> None:
    out = io.StringIO()
    tee = _Tee(out)
    print("first line", file=tee)
    tee.write("second ")
    tee.write("line\n")
    assert out.getvalue() == "first line\nsecond line\n"
    assert tee.lines() == ["first line", "second line"]


def test_with_run_keeps_other_benchmarks_in_place() -> None:
    a = Recorded("a", "2026-11-23", "m", ("1",))
    b = Recorded("b", "2026-11-23", "m", ("2",))
    fresh = Recorded("a", "2026-11-28", "m", ("3",))
    assert with_run([a, b], fresh) == [b, fresh]
