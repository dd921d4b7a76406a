"""Help that fits an 80-column terminal: example commands broken at option boundaries, no type tags on flags.

Rich renders a command's docstring wrapped at the terminal width, which cuts an example command anywhere (often
inside a path); `fit_examples` breaks long command lines beforehand, before an option where it can, with the
shell's `` \\`` continuation, so every example stays copyable. Typer shows ``<bool>`` after on/off flags, where a
type says nothing; flags get no type column.
"""

from __future__ import annotations

import inspect
import re

import typer

__all__ = ["EXAMPLE_WIDTH", "fit_examples", "polish_help"]

# Rich prints the help text with one column of padding; 76 + continuation leaves room in 80 columns.
EXAMPLE_WIDTH = 76
_INDENT = "    "
# A command line: "oodbench …" at the start or after a label ("Example: "), maybe after VAR=value assignments.
COMMAND = re.compile(r"(^|:\s+)([A-Z_]+=\S+\s+)*oodbench\s")


def _break_line(line: str, width: int) -> list[str]:
    """One long command line as several, each at most `width` wide, ending in `` \\`` except the last."""
    lead = line[: len(line) - len(line.lstrip())]
    tokens = line.strip().split()
    lines: list[list[str]] = [[]]
    for token in tokens:
        current = lines[-1]
        candidate = len(lead) + len(" ".join([*current, token])) + (len(_INDENT) if len(lines) > 1 else 0)
        if current and candidate + 2 > width:
            # Prefer breaking before an option: move a trailing option's value along with it.
            if len(current) > 1 and current[-1].startswith("-") and not token.startswith("-"):
                lines.append([current.pop(), token])
            else:
                lines.append([token])
        else:
            current.append(token)
    rendered = [lead + (_INDENT if i else "") + " ".join(part) for i, part in enumerate(lines) if part]
    return [text + " \\" for text in rendered[:-1]] + [rendered[-1]]


def fit_examples(text: str, width: int = EXAMPLE_WIDTH) -> str:
    """Re-break every ``oodbench`` command (with its ``\\`` continuations) that has a line wider than `width`."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        j = i
        while lines[j].rstrip().endswith("\\") and j + 1 < len(lines):
            j += 1  # a command continued over several lines is one logical line
        group = lines[i : j + 1]
        if COMMAND.search(group[0].strip()) and max(len(line) for line in group) > width:
            lead = group[0][: len(group[0]) - len(group[0].lstrip())]
            parts = [line.strip().removesuffix("\\").strip() for line in group]
            out.extend(_break_line(lead + " ".join(part for part in parts if part), width))
        else:
            out.extend(group)
        i = j + 1
    return "\n".join(out)


def _flag_type(original):  # noqa: ANN001, ANN202 - wraps typer's method, whatever its signature
    def display_type_rich(self, ctx):  # noqa: ANN001, ANN202
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None  # an on/off flag takes no value: no "<bool>"
        return original(self, ctx)

    return display_type_rich


def _walk(app: typer.Typer) -> None:
    for command in app.registered_commands:
        doc = command.help if isinstance(command.help, str) else inspect.getdoc(command.callback)
        if doc:
            command.help = fit_examples(inspect.cleandoc(doc))
    for group in app.registered_groups:
        _walk(group.typer_instance)


def polish_help(app: typer.Typer) -> None:
    """Fit the examples of every command under `app` and drop the type tag of flags (call once, after registering)."""
    _walk(app)
    from typer.core import TyperOption

    method = getattr(TyperOption, "display_type_rich", None)
    if method is not None and not getattr(method, "_oodbench", False):
        patched = _flag_type(method)
        patched._oodbench = True  # type: ignore[attr-defined]
        TyperOption.display_type_rich = patched  # type: ignore[method-assign]
