"""The module paths of oodbench 0.1 (`oodbench.store`, `oodbench.metrics`, …) keep importing for one release.

Each old path is an alias of the module at its new home (the same module object, so a monkeypatch or an
``isinstance`` check sees one thing), and importing it emits a `DeprecationWarning` naming the new path. Nothing
here runs until an old path is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

REMOVED_IN = "0.2"

MOVED: dict[str, str] = {
    **{f"oodbench.{m}": f"oodbench.core.{m}" for m in (
        "errors", "grouped", "metrics", "names", "numerics", "oodgroups", "outputs", "papers", "results",
        "rundir", "scores", "store", "tabular",
    )},
    **{f"oodbench.{m}": f"oodbench.util.{m}" for m in (
        "atomic", "chunking", "cli_params", "extras", "lazy", "progress", "terminal",
    )},
    **{f"oodbench.{m}": f"oodbench.text.{m}" for m in ("classes", "llm", "templates", "wordnet")},
    "oodbench.accuracy": "oodbench.evaluation.accuracy",
    "oodbench.accuracy_cli": "oodbench.evaluation.cli",
    "oodbench.cli_help": "oodbench.cli.help",
    "oodbench.quick": "oodbench.runner.quick",
    "oodbench.quick_cli": "oodbench.runner.quick_cli",
    "oodbench.testing": "oodbench.detectors.testing",
}  # fmt: skip


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module already at its new home."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.target}; the old path is removed in oodbench {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias's spec on the shared module; give the module its own back.
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED` and nothing else."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the alias finder on `sys.meta_path` once."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
