"""`make bench`: run every benchmark module of this folder, one line per figure.

`python -m bench` runs them all; `python -m bench bus kube_api` runs the named ones. Each module
has `async def main() -> None` that prints its figures with their targets. With BENCH_RECORD=1
(`make bench BENCH_RECORD=1`) the lines each benchmark prints are also kept in
bench/results.json, with the day and the machine, and docs/benchmarks.md's table is rendered
from them again (bench/_results.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import os
import sys
import time
from typing import TextIO

import structlog

from bench._results import benchmark_modules, record


class _Tee(io.StringIO):
    """Writes through to `out` and keeps every line written, for the record."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self._out.flush()

    def lines(self) -> list[str]:
        return self.getvalue().splitlines()


def main(argv: list[str]) -> int:
    names = argv or benchmark_modules()
    unknown = sorted(set(names) - set(benchmark_modules()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; have {benchmark_modules()}")
        return 2
    recording = os.environ.get("BENCH_RECORD", "") not in ("", "0")
    # Figures go to stdout (and into the record), the components' logs to stderr: a log line
    # is no figure. A benchmark may still set its own log level; the stream stays.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee) if recording else contextlib.nullcontext():
            asyncio.run(module.main())
        print(f"   ({name} took {time.perf_counter() - started:.1f} s)", flush=True)
        if recording:
            record(name, tee.lines())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
