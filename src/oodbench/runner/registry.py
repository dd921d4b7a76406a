"""The registry of model and dataset kinds: kind objects by name, filled by the kinds' own modules.

A kind class registers itself with `register_model_kind` / `register_dataset_kind` (class decorators) into the
module's `KINDS`; config validation receives a `KindRegistry` as data and looks kinds up in it. This module
imports nothing of the runner, so the kinds, the config and the planner can all depend on it without a circle.
The built-in kinds (``runner/models.py``, ``runner/hf.py``, ``runner/datasets.py``) are modules like any plugin's:
`KindRegistry.load_builtins` imports them by name on the first lookup, as `oodbench.util.lazy` does for the
package's exports.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.errors import ConfigError
from ..core.names import suggest

__all__ = ["BUILTIN_MODULES", "KINDS", "KindRegistry", "register_dataset_kind", "register_model_kind"]

# The modules whose classes are the built-in kinds (each registers its kinds when imported).
BUILTIN_MODULES = ("oodbench.runner.datasets", "oodbench.runner.models", "oodbench.runner.hf")

K = TypeVar("K", bound=type)


@dataclass
class KindRegistry:
    """Model kinds and dataset kinds by name (one instance of each kind class)."""

    models: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, Any] = field(default_factory=dict)
    builtins: tuple[str, ...] = ()  # modules imported on first lookup (they register into this registry)
    _loaded: bool = field(default=False, repr=False, compare=False)

    def load_builtins(self) -> KindRegistry:
        """Import the built-in kind modules once (their decorators register them); returns the registry."""
        if not self._loaded:
            for module in self.builtins:
                importlib.import_module(module)
            self._loaded = True
        return self

    def model(self, name: str, key: str = "kind") -> Any:
        """The model kind called `name`; ConfigError (with the closest names) when there is none."""
        return _lookup(self.load_builtins().models, name, "model", key)

    def dataset(self, name: str, key: str = "kind") -> Any:
        """The dataset kind called `name`; ConfigError (with the closest names) when there is none."""
        return _lookup(self.load_builtins().datasets, name, "dataset", key)

    def model_kinds(self) -> dict[str, Any]:
        """Registered model kinds by name."""
        return dict(self.load_builtins().models)

    def dataset_kinds(self) -> dict[str, Any]:
        """Registered dataset kinds by name."""
        return dict(self.load_builtins().datasets)


def _lookup(kinds: Mapping[str, Any], name: str, what: str, key: str) -> Any:
    if name not in kinds:
        raise ConfigError(f"{key}: unknown {what} kind {name!r}{suggest(name, kinds)} (kinds: {', '.join(kinds)})")
    return kinds[name]


# The registry `oodbench run` uses: the built-in kinds and every kind registered by an imported module.
KINDS = KindRegistry(builtins=BUILTIN_MODULES)


def register_model_kind(cls: K) -> K:
    """Class decorator: make a ModelKind available under its ``name``."""
    KINDS.models[cls.name] = cls()  # type: ignore[attr-defined]  (every kind class has a `name`)
    return cls


def register_dataset_kind(cls: K) -> K:
    """Class decorator: make a DatasetKind available under its ``name``."""
    KINDS.datasets[cls.name] = cls()  # type: ignore[attr-defined]
    return cls
