"""The detector table, generated from the classes: each row from a detector's `summary`, `paper`, requirements and
defaults, so the README, docs/detectors.md and `oodbench detectors` cannot disagree.

`markdown_table()` renders the built-ins in registry order; `tools/detector_tables.py` writes it between the
markers ``<!-- detector-table -->`` and ``<!-- /detector-table -->`` of the README and docs/detectors.md (and
checks them in CI).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .base import Detector, Requirements
from .registry import available, get_class, origin

__all__ = [
    "COLUMNS",
    "BEGIN",
    "END",
    "PEERS",
    "also_in_items",
    "row",
    "markdown_table",
    "peer_detectors",
    "peers",
    "replace_table",
    "split_cells",
]

COLUMNS = ("name", "method", "paper", "needs", "defaults (source)", "also in", "measured agreement")
BEGIN = "<!-- detector-table -->"
END = "<!-- /detector-table -->"
_NONE = "—"
# The peer libraries a summary's `also_in` names ("pytorch-ood, OpenOOD (a remark)"); `-d peers` selects by them.
PEERS = ("OpenOOD", "pytorch-ood")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _arrays(names: Iterable[str]) -> str:
    """Array names, extras of one family folded: extra.gram.layer1 … layer4 -> extras `gram.<layer>` (4)."""
    plain, families = [], {}
    for name in sorted(names):
        parts = name.split(".")
        if parts[0] == "extra" and len(parts) == 3:
            families.setdefault(parts[1], []).append(parts[2])
        elif parts[0] == "extra":
            plain.append(f"extra `{name[6:]}`")
        else:
            plain.append(name)
    for family, members in families.items():
        plain.append(
            f"extras `{family}.<layer>` ({', '.join(members)})"
            if len(members) > 1
            else f"extra `{family}.{members[0]}`"
        )
    return ", ".join(plain)


def _needs(requirements: Requirements) -> str:
    parts = []
    if requirements.fit:
        parts.append("fit: " + _arrays(requirements.fit))
    if requirements.head:
        parts.append("head")
    if requirements.score:
        parts.append("score: " + _arrays(requirements.score))
    return "; ".join(parts) or _NONE


def row(name: str) -> tuple[str, ...]:
    """The table's cells for one registered detector (raw text; `markdown_table` escapes them)."""
    cls: type[Detector] = get_class(name)
    summary, paper = cls.summary, cls.paper
    defaults = ", ".join(f"{k}={_value(v)}" for k, v in cls.default_params().items())
    if summary is not None and summary.defaults:
        defaults = f"{defaults} — {summary.defaults}" if defaults else summary.defaults
    defaults = defaults or _NONE
    try:
        requirements = cls().requirements()  # needs that depend on the parameters, at the defaults
    except Exception:  # a plugin whose constructor needs arguments: its class-level declaration
        requirements = cls.requires
    needs = _needs(requirements)
    if summary is not None and summary.needs:
        needs += f" ({summary.needs})"
    also_in = summary.also_in if summary is not None and summary.also_in else _NONE
    agreement = _NONE if also_in == _NONE else (summary.agreement if summary and summary.agreement else "not compared")
    return (
        f"`{name}`",
        summary.method if summary is not None else _first_line(cls.__doc__),
        f"[{paper.citation}]({paper.url}), {paper.venue}" if paper is not None else _NONE,
        needs,
        defaults,
        also_in,
        agreement,
    )


def also_in_items(also_in: str) -> list[str]:
    """The libraries an `also_in` text names, remarks in parentheses dropped: "pytorch-ood, OpenOOD (on …)" ->
    ["pytorch-ood", "OpenOOD"]."""
    plain = re.sub(r"\([^()]*\)", "", also_in)
    return [item.strip() for item in plain.split(",") if item.strip()]


def peers(name: str) -> tuple[str, ...]:
    """The peer libraries (`PEERS`) that implement registered detector `name`, as its summary declares."""
    summary = get_class(name).summary
    named = also_in_items(summary.also_in) if summary is not None else []
    return tuple(peer for peer in PEERS if peer in named)


def peer_detectors(names: Iterable[str] | None = None) -> list[str]:
    """The registered detectors (or those of `names`, in their order) that a peer library implements."""
    return [name for name in (available() if names is None else names) if peers(name)]


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else _NONE


def _escape(cell: str) -> str:
    return cell.replace("\n", " ").replace("|", r"\|")


def markdown_table(names: Sequence[str] | None = None) -> str:
    """The detector table in Markdown: the built-in detectors in registry order, or `names`."""
    if names is None:
        names = [n for n in available() if origin(n).builtin]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_escape(c) for c in row(name)) + " |" for name in names]
    return "\n".join(lines) + "\n"


def replace_table(text: str, table: str, where: str = "the text") -> str:
    """`text` with the part between the table markers replaced by `table`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{where} must hold {BEGIN} … {END} once")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    # Blank lines around the table: Markdown renderers may read lines right after an HTML comment as part of it.
    return f"{head}{BEGIN}\n\n{table}\n{END}{tail}"


def split_cells(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` is a pipe inside a cell, not a separator)."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith(r"\|") else inner
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]
