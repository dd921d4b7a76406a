"""Declarative validation of experiment-file tables: pydantic models whose errors name the key and suggest a fix.

Every table of the experiment file (and every model or dataset kind's table) is a `Table` subclass: its fields
are the allowed keys with their types and defaults. `validate` turns pydantic's first error into one
`ConfigError` line that starts with the full key (``models[2].batch_size: must be >= 1; got 0``) and, for an
unknown key, suggests the closest allowed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..core.errors import ConfigError
from ..core.names import suggest
from ..detectors.base import SEED_MAX

__all__ = ["Table", "StrList", "PositiveInt", "Seed", "suggest", "validate", "join_key", "as_mapping"]

T = TypeVar("T", bound="Table")


class Table(BaseModel):
    """One TOML table: unknown keys are errors, and TOML types are taken as written (a boolean is not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _one_or_many(value: Any) -> Any:
    """A single string where a list of strings is meant stands for a one-element list."""
    return [value] if isinstance(value, str) else value


StrList = Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_one_or_many)]
PositiveInt = Annotated[int, Field(ge=1)]
# A seed, bounded as the detectors' seeds are (0 to 2^31 - 1): every library it reaches (numpy, torch, scikit-learn)
# takes it, and a huge one is refused when the file is read, not by a library after work has begun.
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


def join_key(prefix: str, *parts: str | int) -> str:
    """``models[2].name`` from ``models[2]`` and ``name`` (integers become list indices)."""
    key = prefix
    for part in parts:
        key = f"{key}[{part}]" if isinstance(part, int) else (f"{key}.{part}" if key else str(part))
    return key


def as_mapping(data: Any, key: str) -> dict[str, Any]:
    """The value as a table, or a ConfigError naming the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{key or 'the file'}: expected a table, got {type(data).__name__} {data!r}")
    return dict(data)


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "list_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The allowed keys of the (nested) table at `loc`, for an unknown-key message."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or not isinstance(part, str):
            return None
        info = current.model_fields.get(part)
        if info is None:
            return None
        current = info.annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut to its start and its length when long (thousands of digits)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _message(model: type[BaseModel], error: Mapping[str, Any], prefix: str) -> str:
    loc = tuple(error["loc"])
    key = join_key(prefix, *loc)
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1]) or []
        name = str(loc[-1])
        return f"{key}: unknown key{suggest(name, allowed)} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"{key}: missing (required)"
    if kind in _EXPECTED:
        got = "a boolean" if isinstance(value, bool) else f"{type(value).__name__} {_shown(value)}"
        return f"{key}: expected {_EXPECTED[kind]}, got {got}"
    ctx = error.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"{key}: must be >= {ctx['ge']}; got {_shown(value)}"
    if kind in ("greater_than", "less_than", "less_than_equal"):
        bound = {"greater_than": ">", "less_than": "<", "less_than_equal": "<="}[kind]
        limit = ctx.get({"greater_than": "gt", "less_than": "lt", "less_than_equal": "le"}[kind])
        return f"{key}: must be {bound} {limit}; got {_shown(value)}"
    if kind == "too_short":
        return f"{key}: must not be empty"
    if kind == "string_too_short":
        return f"{key}: expected a non-empty string, got {_shown(value)}"
    if kind == "literal_error":
        options = str(ctx.get("expected", ""))
        return (
            f"{key}: unknown value {_shown(value)}{suggest(str(value), _literal_options(options))} (expected {options})"
        )
    message = str(error["msg"])
    if kind == "value_error":  # raised by a field validator: its own sentence
        message = message.removeprefix("Value error, ")
    return f"{key}: {message[0].lower()}{message[1:]}; got {_shown(value)}"


def _literal_options(expected: str) -> list[str]:
    return [part.strip().strip("'\"") for part in expected.replace(" or ", ",").split(",") if part.strip()]


def validate(model: type[T], data: Any, key: str) -> T:
    """Validate one table against its schema; the first problem becomes a ConfigError that names its key."""
    mapping = as_mapping(data, key)
    try:
        return model.model_validate(mapping)
    except ValidationError as exc:
        raise ConfigError(_message(model, exc.errors()[0], key)) from None
