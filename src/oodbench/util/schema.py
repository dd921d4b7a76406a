"""A small schema language for the JSON files oodbench reads back: every field's type and range, checked before use.

A schema is a Python value: a type (``int``, ``str``, ``bool``, ``float``, ``dict``, ``list``, ``object`` for any
JSON value), an `Int` or `Str` with bounds, a `ListOf`, a `MapOf` (any keys, one value schema), a `Record` (named
fields, required and optional, no others) or `Nullable`. `validate` returns the value unchanged or raises
`SchemaError` with one line naming the first field that is wrong (``plan.3.rows: expected an integer >= 0, got
'1'``). ``bool`` is never accepted where an integer or a number belongs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SchemaError", "Int", "Str", "ListOf", "MapOf", "Record", "Nullable", "validate"]


class SchemaError(ValueError):
    """A JSON value that does not fit its schema (one line, naming the field)."""


@dataclass(frozen=True)
class Int:
    """An integer (not a boolean) in [lo, hi]."""

    lo: int | None = None
    hi: int | None = None


@dataclass(frozen=True)
class Str:
    """A string of at most `max_len` characters, matching `pattern` in full when one is given."""

    pattern: str | None = None
    max_len: int = 4096


@dataclass(frozen=True)
class ListOf:
    """A list of at most `max_len` items, each fitting `item`."""

    item: Any
    max_len: int = 1 << 24
    min_len: int = 0


@dataclass(frozen=True)
class MapOf:
    """An object whose keys fit `key` (a `Str`) and whose values fit `value`."""

    value: Any
    key: Str = field(default_factory=Str)
    max_len: int = 1 << 20


@dataclass(frozen=True)
class Record:
    """An object with the `required` fields, any of the `optional` ones, and no other (unless `open`)."""

    required: Mapping[str, Any]
    optional: Mapping[str, Any] = field(default_factory=dict)
    open: bool = False


@dataclass(frozen=True)
class Nullable:
    """`schema` or null."""

    schema: Any


def _name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(schema: Any, value: Any, where: str = "") -> Any:
    """`value` when it fits `schema`, else `SchemaError` naming the first wrong field (see the module docstring)."""
    _check(schema, value, where)
    return value


def _fail(where: str, expected: str, value: Any) -> SchemaError:
    return SchemaError(f"{where or 'the file'}: expected {expected}, got {_short(value)}")


def _check(schema: Any, value: Any, where: str) -> None:
    if schema is object:
        return
    if isinstance(schema, Nullable):
        if value is not None:
            _check(schema.schema, value, where)
        return
    if schema is int or isinstance(schema, Int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _fail(where, "an integer", value)
        lo, hi = (schema.lo, schema.hi) if isinstance(schema, Int) else (None, None)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = (
                f"in [{lo}, {hi}]"
                if lo is not None and hi is not None
                else f">= {lo}"
                if lo is not None
                else f"<= {hi}"
            )
            raise _fail(where, f"an integer {bounds}", value)
        return
    if schema is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _fail(where, "a number", value)
        return
    if schema is bool:
        if not isinstance(value, bool):
            raise _fail(where, "true or false", value)
        return
    if schema is str or isinstance(schema, Str):
        if not isinstance(value, str):
            raise _fail(where, "a string", value)
        if isinstance(schema, Str):
            if len(value) > schema.max_len:
                raise _fail(where, f"a string of at most {schema.max_len} characters", value)
            if schema.pattern is not None and not re.fullmatch(schema.pattern, value):
                raise _fail(where, f"a string matching {schema.pattern}", value)
        return
    if schema is dict:
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        return
    if schema is list:
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        return
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        if not schema.min_len <= len(value) <= schema.max_len:
            raise _fail(where, f"a list of {schema.min_len} to {schema.max_len} items", f"{len(value)} items")
        for i, item in enumerate(value):
            _check(schema.item, item, f"{where}[{i}]")
        return
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        if len(value) > schema.max_len:
            raise _fail(where, f"an object of at most {schema.max_len} fields", f"{len(value)} fields")
        for key, item in value.items():
            _check(schema.key, key, f"{where}: key" if where else "key")
            _check(schema.value, item, f"{where}.{key}" if where else str(key))
        return
    if isinstance(schema, Record):
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        for key, sub in schema.required.items():
            if key not in value:
                raise SchemaError(f"{where or 'the file'}: missing field {key!r}")
            _check(sub, value[key], f"{where}.{key}" if where else key)
        for key, item in value.items():
            if key in schema.required:
                continue
            if key in schema.optional:
                _check(schema.optional[key], item, f"{where}.{key}" if where else key)
            elif not schema.open:
                raise SchemaError(f"{where or 'the file'}: unknown field {_short(key)}")
        return
    raise TypeError(f"not a schema: {schema!r}")
