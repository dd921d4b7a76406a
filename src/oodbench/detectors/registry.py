"""The one registry of detectors: a decorator registers a class under its name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import DetectorError
from .base import Detector

__all__ = ["register", "create", "available", "get_class"]

_REGISTRY: dict[str, type[Detector]] = {}
D = TypeVar("D", bound=type[Detector])


def register(name: str) -> Callable[[D], D]:
    """Class decorator: register a Detector subclass under `name`."""

    def decorate(cls: D) -> D:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise DetectorError(f"detector name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def get_class(name: str) -> type[Detector]:
    """The class registered under `name`."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DetectorError(f"unknown detector {name!r}; available: {', '.join(available())}") from None


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
    """Registered detector names, in registration (documentation) order."""
    return list(_REGISTRY)
