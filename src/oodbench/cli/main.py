"""The `oodbench` application: each area's commands assembled under one root group that handles every failure.

Errors are handled in one place, the root command group (`OodbenchGroup`) that every command runs under, and
`main()`: an expected error (an `OodbenchError`, a bad parameter, a file that cannot be read or written) is one
line on stderr and exit status 2; anything else is one line with the exception type and the path of a log file
that holds the traceback, and exit status 1. No command ends in a raw traceback.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # typer vendors click
from typer.core import TyperGroup

from ..core.errors import OodbenchError

EXPECTED = 2  # exit status of an expected error (bad input, bad parameter)
UNEXPECTED = 1  # exit status of a bug or an environment failure (traceback in the log file)


class CliError(ClickException):
    """An error reduced to one line: expected (exit 2) or unexpected (exit 1, traceback in a log file)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(" ".join(message.split()) or "(no message)")  # one line, whatever the cause printed
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        """Print ``error: …`` on stderr (red on a terminal)."""
        typer.secho(f"error: {self.message}", fg=typer.colors.RED, err=True)


def log_dir() -> Path:
    """Where tracebacks of unexpected errors go: $OODBENCH_LOG_DIR, else ~/.cache/oodbench/logs (else the temp dir)."""
    configured = os.environ.get("OODBENCH_LOG_DIR")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "oodbench" / "logs"


def _write_log(exc: BaseException) -> Path:
    """Write the traceback (and the command line) to a new log file; its path."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = "oodbench " + " ".join(sys.argv[1:]) + "\n\n" + "".join(traceback.format_exception(exc))
    for directory in (log_dir(), Path(tempfile.gettempdir()) / "oodbench-logs"):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"error-{stamp}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    return Path("(no writable log directory)")


def as_cli_error(exc: BaseException) -> CliError:
    """The one-line error a command failure becomes (see the module docstring)."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, OodbenchError):
        return CliError(str(exc), getattr(exc, "exit_code", EXPECTED))
    if isinstance(exc, ClickException):  # a bad parameter found while the command ran
        return CliError(exc.format_message(), EXPECTED)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        # A file the user named cannot be read or written: their input, not a bug.
        return CliError(f"{exc.filename}: {exc.strerror.lower()}", EXPECTED)
    log = _write_log(exc)
    return CliError(f"unexpected {type(exc).__name__}: {exc} (traceback in {log})", UNEXPECTED)


class OodbenchGroup(TyperGroup):
    """The root command group: every command's failure becomes one line and an exit status (2 or 1)."""

    def main(self, args: Any = None, prog_name: str | None = None, *rest: Any, **extra: Any) -> Any:
        """Every way in (the console script, `app()`, typer's test runner) reports failures in one line and exits."""
        if extra.get("standalone_mode", True) is False:
            return super().main(args, prog_name, *rest, **extra)
        extra["standalone_mode"] = False
        self.argv = list(sys.argv[1:] if args is None else args)  # for the resume command of an interrupted run
        run = lambda: super(OodbenchGroup, self).main(args, prog_name or "oodbench", *rest, **extra)  # noqa: E731
        sys.exit(_exit_status(run, self.argv))

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # Said here: typer turns Ctrl-C into a silent exit status 130 once it leaves the command.
            _interrupted(getattr(self, "argv", sys.argv[1:]))
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, UsageError, CliError, BrokenPipeError):
            raise  # a closed stdout (`oodbench … | head`) is click's: it exits 1 quietly, without a log file
        except Exception as exc:
            raise as_cli_error(exc) from exc


def _interrupted(argv: Sequence[str]) -> None:
    """Ctrl-C: one line on stderr saying what finished, what is kept and the command that resumes."""
    import shlex

    from ..util.progress import interrupted_line

    typer.secho(interrupted_line(shlex.join(["oodbench", *argv])), fg=typer.colors.YELLOW, err=True)


app = typer.Typer(
    name="oodbench",
    cls=OodbenchGroup,
    help="Out-of-distribution detection research at ImageNet scale: extract, evaluate, analyse, audit, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# Each pipeline area owns its commands and adds them here.
from ..annotate import cli as _annotate_cli  # noqa: E402
from ..audit import cli as _audit_cli  # noqa: E402
from ..audit import render as _audit_render  # noqa: E402
from ..core import cli as _store_cli  # noqa: E402
from ..core import pack_cli as _pack_cli  # noqa: E402
from ..demo import cli as _demo_cli  # noqa: E402
from ..detectors import cli as _detectors_cli  # noqa: E402
from ..evaluation import cli as _evaluation_cli  # noqa: E402
from ..extract import cli as _extract_cli  # noqa: E402
from ..report import analyze as _analysis_cli  # noqa: E402
from ..report import cli as _report_cli  # noqa: E402
from ..runner import cli as _runner_cli  # noqa: E402
from ..runner import quick_cli as _quick_cli  # noqa: E402
from ..zeroshot import cli as _zeroshot_cli  # noqa: E402

for _area in (
    _evaluation_cli,
    _demo_cli,
    _store_cli,
    _pack_cli,
    _detectors_cli,
    _extract_cli,
    _quick_cli,
    _zeroshot_cli,
    _analysis_cli,
    _report_cli,
    _audit_cli,
    _annotate_cli,
    _runner_cli,
):
    _area.register(app)

from .help import polish_help  # noqa: E402

polish_help(app)  # after every area registered its commands


def _openclip_text_embedder(*args: object) -> object:
    """The zeroshot commands' label embedder: extract's open_clip one (wired here: zeroshot never imports extract)."""
    from ..extract.label_embedder import embedder_for

    return embedder_for(*args)


_zeroshot_cli.use_text_embedder(_openclip_text_embedder)


def _audit_html(*args: Any) -> str:
    """Audit documents' HTML: the report package renders it (wired here: audit sits below report)."""
    from ..report.html_report import render_audit_html

    return render_audit_html(*args)


_audit_render.use_html_renderer(_audit_html)


def _exit_status(run: Callable[[], Any], argv: Sequence[str] = ()) -> int:
    """Run a command line (click in non-standalone mode); report any failure in one line; the exit status."""
    from ..util.progress import forget_work

    forget_work()
    try:
        code = run()
    except NoArgsIsHelpError as exc:  # `oodbench AREA` alone: the area's help
        exc.show()
        code = EXPECTED
    except UsageError as exc:  # a missing or malformed option: one line, and where to look
        command = exc.ctx.command_path if exc.ctx is not None else "oodbench"
        # A BadParameter raised by the command itself names its option in the message: no "Invalid value:" prefix.
        bare = getattr(exc, "param", True) is None and getattr(exc, "param_hint", True) is None
        CliError(f"{exc.message if bare else exc.format_message()} (see: {command} --help)", EXPECTED).show()
        code = EXPECTED
    except typer.Abort:
        typer.secho("aborted", err=True)
        code = 130
    except KeyboardInterrupt:  # outside a command (a command's own is reported by OodbenchGroup.invoke)
        _interrupted(argv)
        code = 130
    except Exception as exc:  # raised outside a command (while parsing), or a CliError from one
        error = as_cli_error(exc)
        error.show()
        code = error.exit_code
    return code if isinstance(code, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point (``oodbench``): run the command, then exit 0, 2 (expected error) or 1 (unexpected)."""
    app(args=list(argv) if argv is not None else None, prog_name="oodbench")


if __name__ == "__main__":
    main()
