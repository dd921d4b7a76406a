"""Help that fits an 80-column terminal: example commands broken at option boundaries, no type tags on flags.

Rich renders a command's docstring wrapped at the terminal width, which cuts an example command anywhere (often
inside a path); `fit_examples` breaks long command lines beforehand, before an option where it can, with the
shell's `` \\`` continuation, so every example stays copyable. Typer shows ``<bool>`` after on/off flags, where a
type says nothing; flags get no type column.

Typer lays an options panel out in five columns (option, short name, negative flag, type, description), which
leaves a description about 17 characters at 80 columns. `options_panel` lays it out in two: the option with its
short name and type, the negative flag on the line below, then the description, which takes what the option
column leaves (the option column takes at most `OPTION_SHARE` of the width).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import typer

__all__ = ["EXAMPLE_WIDTH", "OPTION_SHARE", "fit_examples", "options_panel", "polish_help"]

# Rich prints the help text with one column of padding; 76 + continuation leaves room in 80 columns.
EXAMPLE_WIDTH = 76
_INDENT = "    "
# At most this share of the terminal for the option column: at 80 columns the description keeps about 45.
OPTION_SHARE = 0.36
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


def _option_cell(param: Any, ctx: Any) -> Any:
    """The option column of one row: names and type on the first line, the negative flag (if any) below."""
    from rich.text import Text
    from typer import rich_utils as ru

    if isinstance(param, ru.TyperArgument if hasattr(ru, "TyperArgument") else ()):
        names = [param.display_name_raw]
    else:
        names = [o for o in param.opts if o.startswith("--")] + [o for o in param.opts if not o.startswith("--")]
    cell = ru.highlighter(Text(", ".join(names)))
    kind = param.display_type_rich(ctx=ctx)
    span = param._get_number_range_help_str()
    if kind or span:
        cell.append(" ")
        cell.append_text(ru.types_highlighter(Text((kind or "") + (ru.RANGE_STRING.format(span) if span else ""))))
    if getattr(param, "secondary_opts", None):
        cell.append("\n")
        cell.append_text(ru.negative_highlighter(Text(", ".join(param.secondary_opts))))
    return cell


def options_panel(*, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Any) -> None:
    """Typer's options panel in two columns, the description wrapped in the width the option column leaves."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils as ru

    if not params:
        return
    table = Table(
        highlight=True, show_header=False, expand=True, box=None, pad_edge=False, padding=ru.STYLE_OPTIONS_TABLE_PADDING
    )
    required = any(param.required for param in params)
    if required:
        table.add_column(no_wrap=True, width=1)
    table.add_column(no_wrap=False, max_width=max(20, int(console.width * OPTION_SHARE)))
    table.add_column(no_wrap=False, ratio=1)
    for param in params:
        help_cell = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        row = [_option_cell(param, ctx), help_cell]
        if required:
            row.insert(0, Text(ru.REQUIRED_SHORT_STRING, style=ru.STYLE_REQUIRED_SHORT) if param.required else "")
        table.add_row(*row)
    console.print(
        Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name, title_align=ru.ALIGN_OPTIONS_PANEL)
    )


def _install_options_panel() -> None:
    """Use `options_panel` where typer's renderer has the signature it was written for; else keep typer's."""
    from typer import rich_utils as ru

    original = getattr(ru, "_print_options_panel", None)
    needed = ("_get_parameter_help", "highlighter", "negative_highlighter", "types_highlighter", "RANGE_STRING")
    if original is None or original is options_panel or not all(hasattr(ru, n) for n in needed):
        return
    if set(inspect.signature(original).parameters) != {"name", "params", "ctx", "markup_mode", "console"}:
        return
    ru._print_options_panel = options_panel


def _walk(app: typer.Typer) -> None:
    for command in app.registered_commands:
        doc = command.help if isinstance(command.help, str) else inspect.getdoc(command.callback)
        if doc:
            command.help = fit_examples(inspect.cleandoc(doc))
    for group in app.registered_groups:
        _walk(group.typer_instance)


def polish_help(app: typer.Typer) -> None:
    """Fit the examples of every command under `app`, drop the type tag of flags and lay options out in two columns
    (call once, after registering)."""
    _walk(app)
    _install_options_panel()
    from typer.core import TyperOption

    method = getattr(TyperOption, "display_type_rich", None)
    if method is not None and not getattr(method, "_oodbench", False):
        patched = _flag_type(method)
        patched._oodbench = True  # type: ignore[attr-defined]
        TyperOption.display_type_rich = patched  # type: ignore[method-assign]
