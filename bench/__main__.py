"""`make bench`: run every benchmark module of this folder, one line per figure.

`python -m bench` runs them all; `python -m bench bus kube_api` runs the named ones. Each module
has `async def main() -> None` that prints its figures with their targets.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import sys
import time
from pathlib import Path


def benchmark_modules() -> list[str]:
    folder = Path(__file__).parent
    return sorted(
        info.name for info in pkgutil.iter_modules([str(folder)]) if not info.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    names = argv or benchmark_modules()
    unknown = sorted(set(names) - set(benchmark_modules()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; have {benchmark_modules()}")
        return 2
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        asyncio.run(module.main())
        print(f"   ({name} took {time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
