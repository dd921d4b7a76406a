"""`oodbench …` commands. Thin: parse arguments, call the library, print.

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

from .cli_params import parse_params, refuse_inside
from .errors import OodbenchError
from .names import suggest, unknown_parameter

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

    from .progress import interrupted_line

    typer.secho(interrupted_line(shlex.join(["oodbench", *argv])), fg=typer.colors.YELLOW, err=True)


app = typer.Typer(
    name="oodbench",
    cls=OodbenchGroup,
    help="Out-of-distribution detection research at ImageNet scale: extract, evaluate, analyse, audit, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def evaluate(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    fit: str = typer.Option(..., "--fit", help="Dataset id of the ID fit set (e.g. the train split)."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID test set."),
    ood: list[str] = typer.Option(..., "--ood", help="Dataset id of an OOD set (repeat for several)."),
    detectors: str | None = typer.Option(
        None, "--detectors", "-d", help="Comma-separated names; default: all registered."
    ),
    param: list[str] | None = typer.Option(
        None, "--param", "-p", help="Detector hyper-parameter DETECTOR.PARAM=VALUE (repeatable)."
    ),
    out: Path = typer.Option(
        Path("oodbench-run"), "--out", help="Run directory for results.parquet, scores, table.md, run.json."
    ),
    tpr: float = typer.Option(0.95, help="ID acceptance rate of the FPR threshold."),
    strict: bool = typer.Option(False, help="Fail (instead of skip) when a detector's requirements are not met."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    plugin: list[str] | None = typer.Option(
        None, "--plugin", help="Import MODULE (or a .py file) to register its detectors (repeatable)."
    ),
    save_detectors: Path | None = typer.Option(
        None, "--save-detectors", help="Keep each fitted detector in DIR/<name> (reload with `oodbench score`)."
    ),
    gram_dtype: str = typer.Option(
        "float64",
        "--gram-dtype",
        help="Precision of the Gram matrices the Gaussian-family fits share: float64, or float32 (about twice "
        "the speed, within a proven bound; docs/detectors.md).",
    ),
    convention: str = typer.Option(
        "oodbench",
        "--convention",
        help="Metric convention of the table: oodbench (ID positive), or openood (OOD-positive FPR@95 and "
        "trapezoidal AUPR, as OpenOOD v1.5 and pytorch-ood; its rows are added as openood.*).",
    ),
    aupr: bool = typer.Option(False, "--aupr", help="Add AUPR-In and AUPR-Out to the table's cells."),
    groups: str | None = typer.Option(
        None,
        "--groups",
        help="OOD groups with group means: a groups TOML file or a shipped name (default with --convention "
        "openood: openood-v1.5-imagenet, OpenOOD's near / far).",
    ),
    csid: list[str] | None = typer.Option(
        None,
        "--csid",
        help="Covariate-shifted ID set (e.g. imagenet-v2; repeatable): scored, and counted as ID in a "
        "full-spectrum table beside the standard one.",
    ),
    small_fit_set: str = typer.Option(
        "fail",
        "--small-fit-set",
        help="fail (default: name every parameter the fit set is too small for) or adapt (scale those defaults).",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Check every byte of the store entries against their checksums even if this run directory did already.",
    ),
) -> None:
    """Fit detectors on the fit set, score ID test and OOD sets, write tidy results and a table.

    Example:
      oodbench evaluate --store feats --model resnet50.tv_in1k --fit imagenet-train --id imagenet-val \\
          --ood ninco --ood ssb-hard -d msp,energy,knn -p knn.k=1000 --out runs/resnet50
    """
    from . import detectors as registry
    from .detectors.cli import warn_plugin_failures
    from .evaluation import evaluate_store

    registry.load_plugins(plugin or ())
    warn_plugin_failures()
    names = [d.strip() for d in detectors.split(",") if d.strip()] if detectors else registry.available()
    for name in names:
        if name not in registry.available():
            raise typer.BadParameter(
                f"--detectors: unknown detector {name!r}{suggest(name, registry.available())} "
                "(list them with `oodbench detectors`)"
            )
    overrides = parse_params(param)
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise typer.BadParameter(f"--param names detectors that are not evaluated: {', '.join(unknown)}")
    for name, given in overrides.items():
        unknown_param = unknown_parameter(name, given, registry.get_class(name).param_names())
        if unknown_param is not None:
            raise typer.BadParameter(f"--param {name}.{unknown_param[0]}: {unknown_param[1]}")
    if not store.is_dir():
        raise typer.BadParameter(f"--store {store}: {'not a directory' if store.exists() else 'no such directory'}")
    if not 0.0 < tpr <= 1.0:  # NaN fails this too; checked before anything is written
        raise typer.BadParameter(f"--tpr: the ID acceptance rate must lie in (0, 1], e.g. 0.95; got {tpr}")
    refuse_inside(("--out", out), ("--store", store))
    refuse_inside(("--save-detectors", save_detectors), ("--store", store))
    from .detectors._gaussian import GRAM_DTYPES

    if gram_dtype not in GRAM_DTYPES:
        raise typer.BadParameter(f"--gram-dtype: must be one of {', '.join(GRAM_DTYPES)}; got {gram_dtype!r}")
    from .rundir import RunDir

    RunDir(out).check_writable("--out")  # before any work, not after the detectors ran
    from .metrics import CONVENTIONS
    from .oodgroups import DEFAULT_GROUPS, load_groups

    if convention not in CONVENTIONS:
        raise typer.BadParameter(f"--convention: must be one of {', '.join(CONVENTIONS)}; got {convention!r}")
    group_spec = groups if groups is not None else (DEFAULT_GROUPS if convention == "openood" else None)
    ood_groups = load_groups(group_spec) if group_spec is not None else None
    plan = {name: overrides.get(name, {}) for name in names}
    result = evaluate_store(
        store,
        model,
        fit,
        id_dataset,
        ood,
        plan,
        out_dir=out,
        tpr=tpr,
        strict=strict,
        progress=progress,
        save_detectors=save_detectors,
        gram_dtype=gram_dtype,
        csid_datasets=list(csid or ()),
        convention=convention,
        aupr=aupr,
        groups=ood_groups,
        small_fit_set=small_fit_set,
        verify=verify,
    )
    from .quick_cli import SOME_FAILED, print_accuracy, report_detectors

    if result.verification:
        typer.echo(result.verification, err=True)
    sys.stdout.write(result.table_markdown)
    print_accuracy(result.accuracy)
    report_detectors(result.skipped, result.failed, result.adapted)
    typer.echo(f"results: {out / 'results.parquet'}  table: {out / 'table.md'}")
    if result.failed:
        raise typer.Exit(SOME_FAILED)


@app.command()
def demo(
    out: Path = typer.Option(Path("oodbench-demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Random seed (training and data split)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run the embedded end-to-end demo on scikit-learn's digits (offline; 3 minutes on 2 busy cores).

    Example:
      oodbench demo --out oodbench-demo
    """
    from .demo.run import print_summary, run_demo

    result = run_demo(out, seed, progress=progress)
    print_summary(result)


store_app = typer.Typer(help="Inspect a feature store.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command("ls")
def store_ls(store: Path = typer.Option(..., "--store", help="Feature store root.")) -> None:
    """List models and datasets in a store with their sizes and completeness.

    An unfinished entry says what it holds and how to finish it; an entry whose meta.json is damaged is listed
    with the problem (and the exit status is 2).

    Example:
      oodbench store ls --store oodbench-demo/store
    """
    from .errors import StoreError

    root = _open_store(store)
    if not root.models():
        typer.echo(f"{store}: no models in this store")
    unreadable = []
    for model_id in root.models():
        head = " (head)" if root.has_head(model_id) else ""
        typer.echo(f"{model_id}{head}")
        for dataset in root.datasets(model_id):
            try:
                meta = root.meta(model_id, dataset)
                if not meta.get("complete"):
                    typer.echo(f"  {dataset}: incomplete: {root.describe_incomplete(model_id, dataset)}")
                    continue
            except StoreError as exc:
                unreadable.append(f"{model_id}/{dataset}")
                typer.echo(f"  {dataset}: unreadable: {exc}")
                continue
            skipped = len(meta.get("skipped", []))
            if not meta["num_rows"]:
                typer.echo(
                    f"  {dataset}: complete, but holds no rows" + (f" ({skipped} items skipped)" if skipped else "")
                )
                continue
            shapes = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in meta["arrays"].items())
            typer.echo(f"  {dataset}: complete; {shapes}" + (f"; {skipped} skipped items" if skipped else ""))
    if unreadable:
        raise StoreError(f"{len(unreadable)} store entries are unreadable (listed above): {', '.join(unreadable)}")


@store_app.command("verify")
def store_verify(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str | None = typer.Option(None, "--model", help="Check only this model id (default: every model)."),
    dataset: list[str] | None = typer.Option(
        None, "--dataset", help="Check only this dataset id of --model (repeatable; default: all, and the head)."
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Check every byte of every complete entry and head against the checksums recorded when it was written.

    Lists each entry as ok, damaged (which array, which rows) or unfinished, then one summary line; the exit
    status is 2 when anything is damaged.

    Example:
      oodbench store verify --store oodbench-demo/store
    """
    import time

    from .errors import StoreError
    from .progress import progress_bar

    root = _open_store(store)
    if dataset and model is None:
        raise typer.BadParameter("--dataset needs --model (the model whose dataset to check)")
    models = root.models()
    if model is not None and model not in models:
        raise StoreError(f"--model {model!r}: no such model in {store} (models: {', '.join(models) or 'none'})")
    targets = []
    for model_id in [model] if model is not None else models:
        known = root.datasets(model_id)
        for name in dataset or []:
            if name not in known:
                raise StoreError(f"--dataset {name!r}: no entry {model_id}/{name} (datasets: {', '.join(known)})")
        targets += [(model_id, "dataset", name) for name in dataset or known]
        if not dataset and root.has_head(model_id):
            targets.append((model_id, "head", "head"))
    total = sum(p.stat().st_size for m, _, name in targets for p in (store / m / name).glob("*.npy"))
    started, nbytes, checked, damaged, legacy = time.perf_counter(), 0, 0, [], []
    with progress_bar(progress, rate_unit="MB", transient=True) as bar:
        task = bar.add_task("verifying (MB)", total=round(total / 1e6, 1))
        advance = lambda n: bar.advance(task, n / 1e6)  # noqa: E731
        for model_id, kind, name in targets:
            key = f"{model_id}/{name}"
            try:
                if kind == "dataset" and not root.meta(model_id, name).get("complete"):
                    typer.echo(f"{key}: unfinished, not checked: {root.describe_incomplete(model_id, name)}")
                    continue
                result = (
                    root.verify_head(model_id, advance=advance)
                    if kind == "head"
                    else root.verify(model_id, name, advance=advance)
                )
            except StoreError as exc:
                damaged.append(key)
                typer.echo(f"{key}: damaged: {exc}")
                continue
            checked += 1
            nbytes += result.nbytes
            for problem in result.problems:
                typer.echo(f"{key}: damaged: {problem}")
            if result.problems:
                damaged.append(key)
            elif not result.checksums:
                legacy.append(key)
                typer.echo(f"{key}: no checksums recorded (written by an older oodbench); sizes and headers ok")
            else:
                typer.echo(f"{key}: ok ({nbytes_text(result.nbytes)})")
    seconds = time.perf_counter() - started
    rate = f", {nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 and nbytes > 2**20 else ""
    summary = f"checked {checked} entries and heads ({nbytes_text(nbytes)}) in {seconds:.2f} s{rate}"
    if damaged:
        raise StoreError(f"{summary}: {len(damaged)} damaged ({', '.join(damaged)}); extract them again")
    typer.echo(summary + (": all intact" if not legacy else f": intact; {len(legacy)} without checksums"))


def nbytes_text(nbytes: int) -> str:
    """A byte count for people: 950 B, 12.3 kB, 4.5 MB, 10.2 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _open_store(store: Path) -> Any:
    """The Store at `store` (an expected error when it is not a directory)."""
    from .errors import StoreError
    from .store import Store

    if not store.is_dir():
        raise StoreError(f"--store {store}: {'not a directory' if store.exists() else 'no such directory'}")
    return Store(store)


# Each pipeline area owns its commands and adds them here.
from . import accuracy_cli as _accuracy_cli  # noqa: E402
from . import quick_cli as _quick_cli  # noqa: E402
from .annotate import cli as _annotate_cli  # noqa: E402
from .audit import cli as _audit_cli  # noqa: E402
from .audit import render as _audit_render  # noqa: E402
from .detectors import cli as _detectors_cli  # noqa: E402
from .extract import cli as _extract_cli  # noqa: E402
from .report import analyze as _analysis_cli  # noqa: E402
from .report import cli as _report_cli  # noqa: E402
from .runner import cli as _runner_cli  # noqa: E402
from .zeroshot import cli as _zeroshot_cli  # noqa: E402

for _area in (
    _detectors_cli,
    _extract_cli,
    _accuracy_cli,
    _quick_cli,
    _zeroshot_cli,
    _analysis_cli,
    _report_cli,
    _audit_cli,
    _annotate_cli,
    _runner_cli,
):
    _area.register(app)

from .cli_help import polish_help  # noqa: E402

polish_help(app)  # after every area registered its commands


def _openclip_text_embedder(*args: object) -> object:
    """The zeroshot commands' label embedder: extract's open_clip one (wired here: zeroshot never imports extract)."""
    from .extract.label_embedder import embedder_for

    return embedder_for(*args)


_zeroshot_cli.use_text_embedder(_openclip_text_embedder)


def _audit_html(*args: Any) -> str:
    """Audit documents' HTML: the report package renders it (wired here: audit sits below report)."""
    from .report.html_report import render_audit_html

    return render_audit_html(*args)


_audit_render.use_html_renderer(_audit_html)


def _exit_status(run: Callable[[], Any], argv: Sequence[str] = ()) -> int:
    """Run a command line (click in non-standalone mode); report any failure in one line; the exit status."""
    from .progress import forget_work

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
