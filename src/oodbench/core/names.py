"""The one rule for names that become folder or file names: model, dataset and vocabulary ids.

Letters, digits and ``. _ + @ = , -``, not starting with a symbol, no ``..`` and no slashes, so a name is
always one safe path component. Vocabulary names leave out ``@`` (``NAME@vN`` selects a stored version).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

from .errors import OodbenchError

__all__ = ["NAME_PATTERN", "VERSIONLESS_PATTERN", "is_name", "check_name", "closest", "suggest"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@=,-]*")  # use with fullmatch: `$` matches before a final newline
VERSIONLESS_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,-]*")
_RULE = "letters, digits and . _ + {at}= , -; no slashes, no '..', not starting with a symbol"


def is_name(value: object, *, allow_at: bool = True) -> bool:
    """True when `value` is a valid name (see the module docstring)."""
    pattern = NAME_PATTERN if allow_at else VERSIONLESS_PATTERN
    return isinstance(value, str) and bool(pattern.fullmatch(value)) and ".." not in value


def check_name(value: object, where: str, *, error: type[OodbenchError] = OodbenchError, allow_at: bool = True) -> str:
    """`value` when it is a valid name, else `error` saying ``WHERE: 'value' is not a valid name (rule)``."""
    if not is_name(value, allow_at=allow_at):
        rule = _RULE.format(at="@ " if allow_at else "")
        raise error(f"{where}: {value!r} is not a valid name ({rule})")
    assert isinstance(value, str)
    return value


def closest(name: str, options: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` of `options` nearest to `name`, case-insensitive, nearest first.

    First an option that differs only in case; then the options one of which begins with the other
    (``tf_efficientnet_lite`` → ``tf_efficientnet_lite0``, ``mahalanobis`` → ``maha``), the closest in length
    first, the shorter of the two at least 3 characters; then difflib's similar names, most similar first. Ties go
    in name order, so a family's first member comes first.
    """
    by_lower: dict[str, str] = {}
    for option in options:
        by_lower.setdefault(option.lower(), option)
    key = name.lower()
    prefixed = sorted(
        (abs(len(o) - len(key)), o)
        for o in by_lower
        if o != key and min(len(o), len(key)) >= 3 and (o.startswith(key) or key.startswith(o))
    )
    similar = difflib.get_close_matches(key, list(by_lower), n=max(n, 1) * 4, cutoff=0.6)
    scored = sorted((-difflib.SequenceMatcher(None, key, o).ratio(), o) for o in similar)
    same = [key] if key in by_lower else []  # differs only in case: the one meant
    ranked = list(dict.fromkeys(same + [o for _, o in prefixed] + [o for _, o in scored]))
    return [by_lower[o] for o in ranked][:n]


def suggest(name: str, options: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the options closest to `name` (see `closest`), or an empty string."""
    close = closest(name, options)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def unknown_parameter(owner: str, given: Iterable[str], allowed: Sequence[str]) -> tuple[str, str] | None:
    """The first of `given` that `owner` does not take, with the one-line reason (closest name, the valid ones)."""
    for key in given:
        if key not in allowed:
            valid = ", ".join(allowed) or "none"
            return key, f"{owner} has no parameter {key!r}{suggest(key, allowed)} (its parameters: {valid})"
    return None
