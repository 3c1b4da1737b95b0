"""pytest plugin (`-p nodeflow_mutant_inject`) that serves one module from a mutant's text.

The mutation runner never writes into the checkout (other people work in it): it puts the
mutant's text in a temporary file and names it here through the environment. Loaded before
any test module, this plugin puts a finder first on `sys.meta_path` that answers for that one
module name with the mutant's code, compiled under the original file name so tracebacks
point at the real file. Without NODEFLOW_MUTANT_MODULE it does nothing (the baseline run).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

MODULE = os.environ.get("NODEFLOW_MUTANT_MODULE", "")
SOURCE = os.environ.get("NODEFLOW_MUTANT_SOURCE", "")
ORIGIN = os.environ.get("NODEFLOW_MUTANT_ORIGIN", "")


class _MutantLoader(importlib.abc.Loader):
    def __init__(self, text: str) -> None:
        self.text = text

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.text, ORIGIN, "exec"), module.__dict__)


class _MutantFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        with open(SOURCE, encoding="utf-8") as text:
            loader = _MutantLoader(text.read())
        spec = importlib.util.spec_from_loader(fullname, loader, origin=ORIGIN)
        if spec is not None:
            spec.has_location = True  # the module gets its real __file__
        return spec


if MODULE:
    sys.modules.pop(MODULE, None)
    sys.meta_path.insert(0, _MutantFinder())
