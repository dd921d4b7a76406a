"""Execute a plan: stage by stage, only the units that are not cached, in this process or fanned out on Ray.

Before any work the run checks that every dataset root it will read exists, so a missing input fails at once with
its key. Each stage is re-planned from disk
when it starts (what the previous stage wrote is then cached), and its pending units run in dependency waves.
Extraction runs in passes (`runner.passes`: the models of one dataset that fit on the device together read and
decode every image once); on Ray, one task per pass — the digits demo, which fills its whole store in one go, is
one task — and fitting/scoring one task per (model, detector); metrics, analyses and the report are
cheap and run in the driver. Workers need the work directory and store on a shared filesystem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError, OodbenchError
from ..util.progress import note_work, progress_bar
from .config import ExperimentConfig
from .plan import STAGES, Plan, build_plan, report_files
from .stages import (
    Context,
    record_adopted,
    reset_changed_models,
    run_analysis_unit,
    run_combine_unit,
    run_extract_pass,
    run_extract_unit,
    run_fit_score,
    run_metrics_unit,
    run_report_unit,
    run_zeroshot_unit,
)
from .units import (
    AnalysisUnit,
    CombineUnit,
    ExtractStageUnit,
    ExtractUnit,
    FitUnit,
    HeadUnit,
    MetricsUnit,
    ReportUnit,
    ScoreUnit,
    Unit,
    ZeroShotUnit,
)

__all__ = ["ENGINES", "RunReport", "run_experiment", "check_runnable", "check_outputs"]

ENGINES = ("local", "ray")
UnitHook = Callable[[Unit], None]


@dataclass
class RunReport:
    """What a run did: the units it executed and those it found cached, per stage."""

    executed: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in STAGES})
    cached: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in STAGES})
    skipped: dict[str, str] = field(default_factory=dict)  # score unit -> reason
    outputs: list[str] = field(default_factory=list)

    @property
    def total_executed(self) -> int:
        """Units executed over all stages."""
        return sum(len(v) for v in self.executed.values())


def check_outputs(config: ExperimentConfig) -> None:
    """Raise before any work when an output location (work directory, store) cannot be created or written."""
    from ..util.atomic import unwritable

    for key, path in (("experiment.workdir", config.workdir), ("experiment.store", config.store)):
        problem = unwritable(path)
        if problem is not None:
            raise ConfigError(f"{key}: {problem}")


def check_runnable(plan: Plan, stages: Sequence[str]) -> None:
    """Raise before any work when inputs are missing or --only skips prerequisites."""
    pending = [u for u in plan.units if u.todo and u.stage in stages]
    extract_datasets = {u.dataset for u in pending if u.stage == "extract"}
    zeroshot_pending = any(isinstance(u, ZeroShotUnit) for u in pending)

    def relevant(key: str) -> bool:
        if key.startswith("datasets."):
            return key.split(".")[1] in extract_datasets
        return zeroshot_pending if key.startswith("zeroshot") else True

    problems = {k: v for k, v in plan.problems.items() if relevant(k)}
    if problems:
        listed = "; ".join(f"{key}: {problem}" for key, problem in problems.items())
        raise ConfigError(f"{listed} (fix the experiment file or pass --set KEY=VALUE)")
    if len(stages) == 1:
        stage = stages[0]
        for unit in pending:
            for dep in unit.deps:
                try:
                    upstream = plan.get(dep)
                except KeyError:
                    continue
                if upstream.todo and upstream.stage != stage and upstream.stage != "fit":
                    # a stale unit did run, with other parameters, code or inputs than the plan's
                    why = (
                        "is out of date (its parameters, code or inputs changed)"
                        if upstream.status == "stale"
                        else ("has not run")
                    )
                    raise OodbenchError(
                        f"--only {stage}: {unit.id} needs {dep}, which {why}; "
                        f"run --only {upstream.stage} first (or run without --only)"
                    )


def _waves(units: Sequence[Unit]) -> list[list[Unit]]:
    """Units in dependency waves: each wave needs only units of earlier waves (or units already done)."""
    remaining = list(units)
    ids = {u.id for u in remaining}
    done: set[str] = set()
    waves: list[list[Unit]] = []
    while remaining:
        ready = [u for u in remaining if all(d not in ids or d in done for d in u.deps)]
        if not ready:
            raise OodbenchError(f"circular unit dependencies among {[u.id for u in remaining][:5]}")
        waves.append(ready)
        done.update(u.id for u in ready)
        remaining = [u for u in remaining if u.id not in done]
    return waves


def _extract_groups(
    config: ExperimentConfig, units: Sequence[ExtractStageUnit], device: str = "auto"
) -> list[list[ExtractStageUnit]]:
    """Units that run in one task: a model that fills its store in one call (the demo) with all its units, the
    models of one shared-decode pass over a dataset (`runner.passes`) together, any other unit alone."""
    from .passes import extraction_passes

    groups: dict[str, list[ExtractStageUnit]] = {}
    shareable: list[ExtractStageUnit] = []
    for unit in units:
        fills_store = config.models[unit.model_id].kind_of.fills_store
        if fills_store and unit.step == "extract":
            groups.setdefault(f"model:{unit.model}", []).append(unit)
        else:
            shareable.append(unit)
    return list(groups.values()) + [p.units for p in extraction_passes(config, shareable, device)]


FitScoreTask = tuple[FitUnit, list[ScoreUnit]]  # a fit unit and its pending score units


def _fit_score_tasks(plan: Plan) -> list[FitScoreTask]:
    """(fit unit, its pending score units) for every classifier detector with scores to compute."""
    todo: dict[tuple[str | None, str | None], list[ScoreUnit]] = {}
    for unit in plan.stage("score"):
        if unit.todo and isinstance(unit, ScoreUnit):
            todo.setdefault((unit.model, unit.detector), []).append(unit)
    fits = [f for f in plan.stage("fit") if isinstance(f, FitUnit)]
    return [(f, todo[(f.model, f.detector)]) for f in fits if (f.model, f.detector) in todo]


# ----------------------------------------------------------------------------------------------- executors
class UnitFailed(OodbenchError):
    """A unit raised: the message names the unit, then the cause."""


def _failed(unit_id: str, exc: BaseException) -> UnitFailed:
    return UnitFailed(f"{unit_id}: {exc}")


class _Local:
    """Runs unit groups one after the other in this process."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def extract(self, groups: Sequence[Sequence[ExtractStageUnit]]) -> Iterable[list[ExtractStageUnit]]:
        for group in groups:
            try:
                _run_group(self.ctx, group)
            except _GroupFailed as failed:
                raise _failed(failed.unit_id, failed.cause) from failed.cause
            yield list(group)

    def fit_score(self, tasks: Sequence[FitScoreTask]) -> Iterable[FitScoreTask]:
        for model_tasks in _by_model(tasks).values():
            for fit_unit, todo in model_tasks:
                _fit_score_one(self.ctx, fit_unit.id, *_fit_score_args(fit_unit, todo), _sharing(model_tasks))
                yield fit_unit, todo

    def close(self) -> None:
        pass


class _GroupFailed(Exception):
    def __init__(self, unit_id: str, cause: OodbenchError) -> None:
        super().__init__(unit_id)
        self.unit_id, self.cause = unit_id, cause


def _is_pass(config: ExperimentConfig, group: Sequence[ExtractStageUnit]) -> bool:
    """A shared-decode pass: several extraction units of one dataset (not one model filling its store)."""
    return len(group) > 1 and not config.models[group[0].model_id].kind_of.fills_store


def _run_group(ctx: Context, group: Sequence[ExtractStageUnit]) -> None:
    """Run one group of extraction units; a failure names its unit (the pass's models, for a shared pass)."""
    if _is_pass(ctx.config, group):
        try:
            run_extract_pass(ctx, group)
        except OodbenchError as exc:
            raise _GroupFailed(" + ".join(u.id for u in group), exc) from exc
        return
    for unit in group:
        try:
            run_extract_unit(ctx, unit)
        except OodbenchError as exc:
            raise _GroupFailed(unit.id, exc) from exc


def _ray_extract(config: ExperimentConfig, group: list[ExtractStageUnit], device: str) -> list[str]:
    ctx = Context(config, progress=False, device=device)
    if _is_pass(config, group):
        run_extract_pass(ctx, group)
    else:
        for unit in group:
            run_extract_unit(ctx, unit)
    return [u.id for u in group]


FitScoreArgs = tuple[str, str, Mapping[str, Any], list[dict[str, str]]]  # model, detector, params, score items


def _by_model(tasks: Sequence[FitScoreTask]) -> dict[str, list[FitScoreTask]]:
    """The fit+score tasks grouped by model, in their order."""
    groups: dict[str, list[FitScoreTask]] = {}
    for fit_unit, todo in tasks:
        groups.setdefault(fit_unit.model or "", []).append((fit_unit, todo))
    return groups


def _fit_score_args(fit_unit: FitUnit, todo: list[ScoreUnit]) -> FitScoreArgs:
    items = [{"label": u.label, "key": u.key, "dataset": u.dataset or ""} for u in todo]
    return fit_unit.model or "", fit_unit.detector or "", fit_unit.params, items


def _sharing(model_tasks: Sequence[FitScoreTask]) -> list[tuple[str, Mapping[str, Any]]]:
    """The (detector, params) of one model fitted in this run: their fits share one pass over its fit set."""
    return [(f.detector or "", f.params) for f, _ in model_tasks]


def _fit_score_one(
    ctx: Context,
    unit_id: str,
    model: str,
    detector: str,
    params: Mapping[str, Any],
    todo: list[dict[str, str]],
    share_with: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[str]:
    try:
        return run_fit_score(ctx, model, detector, params, todo, share_with=share_with)
    except OodbenchError as exc:
        raise _failed(unit_id, exc) from exc


def _ray_fit_score_model(
    config: ExperimentConfig, tasks: list[tuple[str, FitScoreArgs]], share_with: list[tuple[str, Mapping[str, Any]]]
) -> list[str]:
    """One Ray task per model: its detectors fitted one after another on one shared pass, as the local engine does
    (the same statistics, so the same scores to the bit; and the fit set read once per model, not per detector)."""
    ctx = Context(config, progress=False)
    done: list[str] = []
    for unit_id, args in tasks:
        done += _fit_score_one(ctx, unit_id, *args, share_with)
    return done


class _Ray:
    """Fans extraction and fit+score out as Ray tasks on a local or remote cluster."""

    def __init__(self, ctx: Context, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise OodbenchError("the Ray engine needs ray: pip install 'oodbench[ray]'") from None
        self.ray = ray
        self.ctx = ctx
        self.started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            ray.init(**kwargs)
            self.started = True
        engine = ctx.config.engine
        self.extract_task = ray.remote(num_gpus=engine["gpus_per_extract"], max_retries=0)(_ray_extract)
        self.fit_score_task = ray.remote(num_cpus=engine["cpus_per_score"], max_retries=0)(_ray_fit_score_model)

    def _as_completed(self, refs: dict[Any, Any], name: Callable[[Any], str]) -> Iterable[Any]:
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            try:
                self.ray.get(ready[0])
            except Exception as exc:  # Ray wraps the task's exception; keep its message, name the unit
                for ref in pending:
                    self.ray.cancel(ref)
                cause = getattr(exc, "cause", None) or exc
                if isinstance(cause, UnitFailed):  # already names its unit (one of a model's fit+score units)
                    raise UnitFailed(str(cause)) from exc
                raise _failed(name(refs[ready[0]]), cause) from exc
            yield refs[ready[0]]

    def extract(self, groups: Sequence[Sequence[ExtractStageUnit]]) -> Iterable[list[ExtractStageUnit]]:
        refs = {self.extract_task.remote(self.ctx.config, list(g), self.ctx.device): list(g) for g in groups}
        yield from self._as_completed(refs, lambda group: group[0].id)

    def fit_score(self, tasks: Sequence[FitScoreTask]) -> Iterable[FitScoreTask]:
        # One task per model (its units in order), so the model's detectors share one pass over its fit set.
        refs = {
            self.fit_score_task.remote(
                self.ctx.config,
                [(f.id, _fit_score_args(f, todo)) for f, todo in model_tasks],
                _sharing(model_tasks),
            ): model_tasks
            for model_tasks in _by_model(tasks).values()
        }
        for model_tasks in self._as_completed(refs, lambda group: group[0][0].id):
            yield from model_tasks

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


# ----------------------------------------------------------------------------------------------- the run
def check_only(only: str | None) -> None:
    """Refuse an `--only` stage that cannot run alone: the stages listed are exactly those that can."""
    if only == "fit":
        raise ConfigError(
            "--only fit: fitted detectors are not stored (k-NN keeps the whole fit set), so fitting runs "
            "with the scoring it serves; use --only score"
        )
    if only is not None and only not in STAGES:
        alone = [stage for stage in STAGES if stage != "fit"]
        raise ConfigError(f"--only: unknown stage {only!r}; stages: {', '.join(alone)}")


def run_experiment(
    config: ExperimentConfig,
    *,
    engine: str = "local",
    only: str | None = None,
    progress: bool = True,
    device: str = "auto",
    ray_address: str | None = None,
    on_unit: UnitHook | None = None,
) -> RunReport:
    """Run every pending unit of the experiment (or of one stage) and report what ran and what was cached."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine: unknown engine {engine!r}; use {' or '.join(ENGINES)}")
    check_only(only)
    stages = STAGES if only is None else (only,)
    check_outputs(config)
    plan = build_plan(config)
    check_runnable(plan, stages)
    ctx = Context(config, progress=progress, device=device)
    executor: _Local | _Ray = _Local(ctx)
    report = RunReport()
    try:
        if engine == "ray" and any(u.todo for u in plan.units if u.stage in ("extract", "fit", "score")):
            executor = _Ray(ctx, ray_address or config.engine["ray_address"])
        for stage in stages:
            if stage == "fit" and only is None:
                continue  # run together with the score units it feeds
            plan = build_plan(config)  # from disk: what earlier stages wrote is now cached
            _run_stage(stage, plan, ctx, executor, report, progress, on_unit, with_fit=stage == "score")
    finally:
        executor.close()
    report.outputs = [str(p) for p in _outputs(config)]
    return report


def _outputs(config: ExperimentConfig) -> list[Any]:
    return [f for f in report_files(config) if f.is_file()]


def _run_stage(
    stage: str,
    plan: Plan,
    ctx: Context,
    executor: _Local | _Ray,
    report: RunReport,
    progress: bool,
    on_unit: UnitHook | None,
    *,
    with_fit: bool,
) -> None:
    stage_units = plan.stage(stage) + (plan.stage("fit") if with_fit else [])
    _note_done(ctx, report, stage_units)
    pending = [u for u in stage_units if u.todo]
    if not pending:
        return
    with progress_bar(progress) as bar:
        task = bar.add_task(stage + (" (fit + score)" if with_fit else ""), total=len(pending))

        def finished(unit: Unit) -> None:
            report.executed[unit.stage].append(unit.id)
            bar.advance(task)
            done = sum(len(ids) for ids in report.executed.values())
            note_work("run", finished=f"{done} unit(s) this run", kept="every finished unit (in the ledger)")
            if on_unit is not None:
                on_unit(unit)

        if stage == "extract":
            _run_extractions(ctx, executor, [u for u in pending if isinstance(u, (ExtractUnit, HeadUnit))], finished)
            return
        if stage == "score":
            _run_fit_score(ctx, executor, plan, report, finished)
        for unit in pending:
            if unit.stage != stage or isinstance(unit, ScoreUnit):
                continue  # fit and score units ran above, with the executor
            try:
                _run_driver_unit(ctx, plan, unit)
            except OodbenchError as exc:
                raise _failed(unit.id, exc) from exc
            finished(unit)


def _note_done(ctx: Context, report: RunReport, units: Iterable[Unit]) -> None:
    """Count the units that need not run (with the reasons of skipped scores); record the entries the plan adopted."""
    for unit in units:
        if unit.todo:
            continue
        report.cached[unit.stage].append(unit.id)
        if unit.status == "skipped" and unit.stage == "score":
            report.skipped[unit.id] = unit.note
        if isinstance(unit, ExtractUnit) and unit.adopt is not None:
            record_adopted(ctx, unit)


def _run_extractions(
    ctx: Context, executor: _Local | _Ray, pending: list[ExtractStageUnit], finished: UnitHook
) -> None:
    """The pending extraction units in dependency waves, each wave in groups (passes, whole-store models)."""
    reset_changed_models(ctx, pending)
    for wave in _waves(pending):
        for group in executor.extract(_extract_groups(ctx.config, wave, ctx.device)):
            for unit in group:
                finished(unit)
    ctx._backbone = None  # free the last model (GPU memory) before scoring


def _run_fit_score(ctx: Context, executor: _Local | _Ray, plan: Plan, report: RunReport, finished: UnitHook) -> None:
    """Every detector with scores to compute, fitted and scored by the executor; skips are reported with why."""
    for fit_unit, todo in executor.fit_score(_fit_score_tasks(plan)):
        if fit_unit.todo:
            finished(fit_unit)
        for unit in todo:
            record = ctx.ledger.read("score", unit.label)
            if record and record.get("skipped"):
                report.skipped[unit.id] = record["skipped"]
            finished(unit)


def _run_driver_unit(ctx: Context, plan: Plan, unit: Unit) -> None:
    """Run one unit that is cheap enough for the driver: zero-shot scores, a run directory, an analysis, the report."""
    if isinstance(unit, ZeroShotUnit):
        run_zeroshot_unit(ctx, unit)
    elif isinstance(unit, MetricsUnit):
        run_metrics_unit(
            ctx, unit, [s for s in plan.stage("score") if isinstance(s, ScoreUnit) and s.model == unit.model]
        )
    elif isinstance(unit, CombineUnit):
        run_combine_unit(ctx, unit)
    elif isinstance(unit, AnalysisUnit):
        run_analysis_unit(ctx, unit)
    elif isinstance(unit, ReportUnit):
        run_report_unit(ctx, unit)
    else:
        raise OodbenchError(f"{unit.id}: a {type(unit).__name__} does not run in the driver")
