"""Lazy package attributes: a package's public names, imported from their modules on first use.

`oodbench --help` must not pay for scipy, scikit-learn, faiss, pyarrow or torch, so package ``__init__`` files
name their exports instead of importing them::

    _EXPORTS = {"load_run": ".rundata", "subsample_run": ".subsample"}
    __all__ = list(_EXPORTS)
    lazy_package(__name__, _EXPORTS)

A name that is both an export and a submodule (``audit.fingerprint``, the function in ``audit/fingerprint.py``)
stays the export, as it was with eager imports, even after the submodule is imported.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_package", "SUBMODULE"]

SUBMODULE = ":module"  # suffix of an export that is a module itself: {"metrics": ".core.metrics:module"}


class _LazyPackage(types.ModuleType):
    """A package module whose exports are imported on first access."""

    _exports: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        module = self.__dict__.get("_exports", {}).get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        imported = importlib.import_module(module.removesuffix(SUBMODULE), self.__name__)
        value = imported if module.endswith(SUBMODULE) else getattr(imported, name)
        self.__dict__[name] = value  # the next access is an ordinary attribute
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        exports = self.__dict__.get("_exports", {})
        if (
            isinstance(value, types.ModuleType)
            and name in exports
            and not exports[name].endswith(SUBMODULE)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return  # the import system binding a submodule that shares an export's name: the export wins
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.__dict__.get("_exports", {})})


def lazy_package(package: str, exports: Mapping[str, str]) -> None:
    """Make `package` (an imported package's ``__name__``) import each export from its relative module on use."""
    module = sys.modules[package]
    module.__dict__["_exports"] = dict(exports)
    module.__class__ = _LazyPackage
