"""The one registry of detectors: a decorator registers a class under its name; plugins register theirs.

Plugins are detectors from outside the package. An installed distribution declares them in the entry-point
group ``oodbench.detectors`` (``name = "package.module:Class"``, or a module whose import registers with
``@register``); they are imported the first time the registry is asked for names or classes, so every command
sees them. ``load_plugins(["module", "path/to/file.py"])`` imports more by hand (``--plugin`` on the commands).
A plugin that fails to import, or claims a name already taken, is recorded with its error and registers
nothing; the built-ins keep working.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from ..core.errors import DetectorError
from ..core.names import check_name
from .base import Detector

__all__ = [
    "ENTRY_POINT_GROUP",
    "Origin",
    "register",
    "create",
    "available",
    "get_class",
    "origin",
    "load_plugins",
    "plugin_failures",
    "plugin_versions",
    "detector_fingerprint",
]

ENTRY_POINT_GROUP = "oodbench.detectors"

_REGISTRY: dict[str, type[Detector]] = {}
# Origins known at registration (entry points name their distribution); others are derived from the module.
_ORIGINS: dict[str, Origin] = {}
_FAILURES: dict[str, str] = {}  # plugin (entry point or module) -> "ErrorType: message"
_LOADED_MODULES: dict[str, list[str]] = {}  # plugin module or file -> detector names it registered
_FILE_MODULES: dict[str, str] = {}  # module name given to a plugin file -> the file's path
_entry_points_state = "not loaded"  # -> "loading" -> "loaded"
D = TypeVar("D", bound=type[Detector])


@dataclass(frozen=True)
class Origin:
    """Where a detector comes from: its module, the distribution that installed it, and that distribution's version."""

    module: str
    distribution: str | None
    version: str | None
    builtin: bool
    source_hash: str | None = None  # sha256 (12 hex) of the plugin module's source file; None for built-ins
    path: str | None = None  # the file, for a plugin loaded from a .py file by its path

    def describe(self) -> str:
        """One line for listings, e.g. 'built-in', 'oodbench-knnplus 0.2.0', 'module mydet (not installed)'."""
        if self.builtin:
            return "built-in"
        if self.distribution is not None:
            return f"{self.distribution} {self.version}"
        version = f" {self.version}" if self.version else ""
        where = f"file {self.path}" if self.path else f"module {self.module}"
        return f"{where}{version} (not installed)"


def _is_builtin(module: str) -> bool:
    return module == "oodbench" or module.startswith("oodbench.")


@lru_cache(maxsize=1)
def _package_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _source_hash(cls: type) -> str | None:
    try:
        source = inspect.getsourcefile(cls)
    except TypeError:
        return None
    if source is None or not Path(source).is_file():
        return None
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:12]


def _derive_origin(cls: type[Detector], distribution: str | None = None, version: str | None = None) -> Origin:
    module = cls.__module__
    if _is_builtin(module):
        from .. import __version__

        return Origin(module, "oodbench", __version__, builtin=True)
    if distribution is None:
        names = _package_distributions().get(module.split(".")[0], [])
        if names:
            distribution = names[0]
            try:
                version = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                version = None
    if version is None:
        # A module that is not installed may still say its version.
        loaded = sys.modules.get(module)
        version = str(getattr(loaded, "__version__", "")) or None
    path = _FILE_MODULES.get(module)
    return Origin(module, distribution, version, builtin=False, source_hash=_source_hash(cls), path=path)


def _describe_class(cls: type[Detector], known: Origin | None = None) -> str:
    where = known if known is not None else _derive_origin(cls)
    return f"{cls.__module__}.{cls.__qualname__} ({where.describe()})"


def register(name: str) -> Callable[[D], D]:
    """Class decorator: register a Detector subclass under `name` (a name taken by another class is an error)."""

    def decorate(cls: D) -> D:
        if not (isinstance(cls, type) and issubclass(cls, Detector)):
            raise DetectorError(f"detector {name!r}: {cls!r} is not a subclass of oodbench.detectors.Detector")
        # The name becomes a folder (run directories, kept detectors), so it follows the one rule for names.
        check_name(name, "detector name", error=DetectorError)
        taken = _REGISTRY.get(name)
        if taken is not None and taken is not cls:
            raise DetectorError(
                f"detector name {name!r} is registered twice: by {_describe_class(taken, _ORIGINS.get(name))} "
                f"and by {_describe_class(cls)}; uninstall one or rename its detector"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


# ----------------------------------------------------------------------------------------------- plugins
# A plugin that calls sys.exit() or raises KeyboardInterrupt while importing is a failed plugin, not the end of the
# command (it made `evaluate --plugin` exit 0 with no output).
_PLUGIN_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


def _describe_failure(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit: it called sys.exit({exc.code!r}) while being imported"
    return f"{type(exc).__name__}: {exc}"


def _load_one(label: str, load: Callable[[], Any], entry_name: str | None, distribution: Any) -> list[str]:
    """Import one plugin; on any error restore the registry, record the failure and re-raise."""
    before = dict(_REGISTRY)
    try:
        loaded = load()
        if isinstance(loaded, type) and issubclass(loaded, Detector) and entry_name is not None:
            registered_as = [n for n, c in _REGISTRY.items() if c is loaded]
            if registered_as and entry_name not in registered_as:
                raise DetectorError(
                    f"entry point {entry_name!r} names {loaded.__qualname__}, which registers itself as "
                    f"{registered_as[0]!r}; use one name"
                )
            register(entry_name)(loaded)
        elif not isinstance(loaded, ModuleType):
            raise DetectorError(f"{label} is neither a Detector subclass nor a module")
    except BaseException as exc:
        _REGISTRY.clear()
        _REGISTRY.update(before)
        _FAILURES[label] = _describe_failure(exc)
        raise
    _FAILURES.pop(label, None)
    added = [name for name in _REGISTRY if name not in before]
    for name in added:
        if distribution is not None:
            dist_name = distribution.metadata["Name"]
            _ORIGINS[name] = _derive_origin(_REGISTRY[name], dist_name, distribution.version)
    return added


def _load_entry_points() -> None:
    global _entry_points_state
    if _entry_points_state != "not loaded":
        return
    _entry_points_state = "loading"  # a plugin that asks the registry while importing must not recurse
    try:
        for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
            label = f"{entry.name} = {entry.value}"
            try:
                _load_one(label, entry.load, entry.name, getattr(entry, "dist", None))
            except _PLUGIN_FAILURES:  # recorded in _FAILURES; one broken plugin must not take the built-ins down
                continue
    finally:
        _entry_points_state = "loaded"


def _import_path(path: Path) -> ModuleType:
    name = f"oodbench_plugin_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DetectorError(f"cannot import plugin file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _FILE_MODULES[name] = str(path)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_plugins(modules: Iterable[str] = ()) -> dict[str, list[str]]:
    """Import the installed entry points (once) and each named module or ``.py`` file; returns plugin -> new names.

    An entry point that fails is recorded (see `plugin_failures`) and skipped; a named module that fails raises
    DetectorError with its error, since the user asked for it.
    """
    _load_entry_points()
    result: dict[str, list[str]] = {}
    for spec in modules:
        if spec in _LOADED_MODULES:
            result[spec] = list(_LOADED_MODULES[spec])
            continue
        path = Path(spec)
        is_file = spec.endswith(".py") or path.is_file()
        if is_file and not path.is_file():
            raise DetectorError(f"plugin file {spec} does not exist")

        def load(spec: str = spec, path: Path = path, is_file: bool = is_file) -> ModuleType:
            return _import_path(path) if is_file else importlib.import_module(spec)

        try:
            added = _load_one(spec, load, None, None)
        except _PLUGIN_FAILURES as exc:
            hint = "" if is_file else " (is it installed, or on PYTHONPATH? a .py file can be given by its path)"
            raise DetectorError(f"plugin {spec} failed to import: {_describe_failure(exc)}{hint}") from None
        _LOADED_MODULES[spec] = added
        result[spec] = added
    return result


def plugin_failures() -> dict[str, str]:
    """Plugins that failed to load: entry point or module -> 'ErrorType: message'."""
    _load_entry_points()
    return dict(_FAILURES)


def origin(name: str) -> Origin:
    """Where the detector registered under `name` comes from (built-in, or a plugin's distribution and version)."""
    cls = get_class(name)
    if name not in _ORIGINS:
        _ORIGINS[name] = _derive_origin(cls)
    return _ORIGINS[name]


def plugin_versions() -> dict[str, str]:
    """Detector name -> origin line ('distribution version') of every registered plugin detector."""
    return {name: origin(name).describe() for name in available() if not origin(name).builtin}


def detector_fingerprint(name: str) -> str | None:
    """What a cache key must include for `name` beyond its parameters: None for built-ins (oodbench's own code),
    the distribution, version and source hash for a plugin, so that a new plugin version recomputes scores."""
    where = origin(name)
    if where.builtin:
        return None
    return f"{where.distribution or where.module}=={where.version or '?'}+{where.source_hash or '?'}"


def _snapshot() -> tuple[Any, ...]:
    """The registry and its plugin bookkeeping, for tests that register and must leave no trace."""
    tables = (_REGISTRY, _ORIGINS, _FAILURES, _LOADED_MODULES, _FILE_MODULES)
    return (*(dict(t) for t in tables), _entry_points_state)


def _restore(snapshot: tuple[Any, ...]) -> None:
    """Put back a `_snapshot()` (and forget cached distribution lookups)."""
    global _entry_points_state
    for table, content in zip((_REGISTRY, _ORIGINS, _FAILURES, _LOADED_MODULES, _FILE_MODULES), snapshot, strict=False):
        table.clear()
        table.update(content)
    _entry_points_state = snapshot[-1]
    _package_distributions.cache_clear()


# ----------------------------------------------------------------------------------------------- lookup
def get_class(name: str) -> type[Detector]:
    """The class registered under `name`."""
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        failed = "".join(f"; plugin {p} failed to load: {e}" for p, e in _FAILURES.items())
        raise DetectorError(f"unknown detector {name!r}; available: {', '.join(available())}{failed}") from None


def create(name: str, **params: Any) -> Detector:
    """A new, unfitted detector with validated hyper-parameters."""
    cls = get_class(name)
    unknown = sorted(set(params) - set(cls.param_names()))
    if unknown:
        allowed = ", ".join(f"{k}={v!r}" for k, v in cls.default_params().items()) or "none"
        raise DetectorError(f"{name} has no parameter {', '.join(unknown)}; its parameters (defaults): {allowed}")
    detector = cls(**params)
    detector.validate_params()
    return detector


def available() -> list[str]:
    """Registered detector names: the built-ins in documentation order, then plugins."""
    _load_entry_points()
    return list(_REGISTRY)
