"""What one evaluation computes, resolved and validated once: `EvaluationSpec`.

`oodbench evaluate`, `oodbench evaluate-model` (and `oodbench.evaluate_model`), `evaluate_store` and each model
of `oodbench run` build one `EvaluationSpec` from their options (command-line options, an experiment file or
Python arguments) and hand it to the engine (`evaluation.engine`); nothing downstream validates an option again.

It holds each detector twice: the parameters as given (only those are kept when a small fit set makes the
defaults scale, `--small-fit-set adapt`) and resolved (`get_params` after defaults, in JSON form), which is what
the score keys hash and run.json records, so that a changed default recomputes.

A frozen dataclass, not a pydantic model: every check is a lookup in the detector registry or a rule between
fields (distinct dataset names, a convention's default groups), which pydantic would run as custom validators
anyway. Building one for all 34 registered detectors took 18-57 ms on 2 busy cores, most of it creating the
detectors (which every front end needs) and, with the openood convention, reading its groups file (docs/runner.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import detectors as detector_registry
from ..core.errors import DetectorError, OodbenchError
from ..core.metrics import CONVENTIONS
from ..core.names import suggest, unknown_parameter
from ..core.oodgroups import DEFAULT_GROUPS, OodGroups, load_groups
from ..core.papers import POST_HOC_POOL
from ..detectors.catalog import peer_detectors
from ..detectors.fitsize import SMALL_FIT_SET
from ..detectors.shared import check_gram_dtype

__all__ = ["EvaluationSpec", "DetectorPlan", "resolve_params", "select_detectors"]

# {detector: parameters}: a list of names, a mapping to parameters, or None for every registered detector.
DetectorPlan = Sequence[str] | Mapping[str, Mapping[str, Any]] | None


def resolve_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A detector's parameters after defaults (`get_params`), in the JSON form run.json and the keys use."""
    detector = detector_registry.create(name, **params)
    return json.loads(json.dumps(detector.get_params(), default=str))


def select_detectors(text: str | Sequence[str] | None, *, option: str = "detectors") -> list[str]:
    """Detector names from a selection: names, ``all``, ``paper`` (the paper's 21 post-hoc detectors), ``peers``
    (those OpenOOD or pytorch-ood implement, as each detector's summary declares) and ``-NAME`` to leave one out.

    ``"all,-she,-openmax"`` is every registered detector but two; a selection starting with ``-NAME`` starts from
    ``all``. Unknown names are all reported in one error (with a suggestion each).
    """
    if text is None:
        return list(detector_registry.available())
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t and t.strip()]
    available = detector_registry.available()
    groups = {
        "all": lambda: list(available),
        "paper": lambda: [n for n in available if n in POST_HOC_POOL],
        "peers": lambda: peer_detectors(available),
    }
    chosen: list[str] = []
    unknown: list[str] = []
    if items and items[0].startswith("-"):
        chosen = list(available)
    for item in items:
        drop = item.startswith("-")
        name = item[1:].strip() if drop else item
        if name in groups:
            members = groups[name]()
        elif name in available:
            members = [name]
        else:
            unknown.append(f"{name!r}{suggest(name, [*available, *groups])}")
            continue
        if drop:
            chosen = [n for n in chosen if n not in members]
        else:
            chosen += [n for n in members if n not in chosen]
    if unknown:
        raise DetectorError(
            f"{option}: unknown detector{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            "(list them with `oodbench detectors`; all, paper and peers select groups, -NAME leaves one out)"
        )
    if not chosen:
        raise DetectorError(f"{option}: the selection {text!r} leaves no detector to evaluate")
    return chosen


def _plan(detectors: DetectorPlan, params: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """{name: parameters as given} from names or a mapping, plus `params` overrides (checked against the names)."""
    if detectors is None or isinstance(detectors, str):
        plan = {name: {} for name in select_detectors(detectors)}
    elif isinstance(detectors, Mapping):
        plan = {name: dict(given or {}) for name, given in detectors.items()}
    else:
        plan = {name: {} for name in select_detectors(list(detectors))}
    for name, given in (params or {}).items():
        if name not in plan:
            raise DetectorError(f"parameters given for detectors that are not evaluated: {name}")
        plan[name] = {**plan[name], **given}
    return plan


@dataclass(frozen=True)
class EvaluationSpec:
    """One evaluation's detectors (as given and resolved), datasets and options, validated when built."""

    detectors: Mapping[str, Mapping[str, Any]]  # the parameters as given: only these are kept by adapt
    resolved: Mapping[str, Mapping[str, Any]]  # `get_params` after defaults: score keys and run.json
    fit: str = "fit"
    id: str = "id"
    ood: tuple[str, ...] = ()
    csid: tuple[str, ...] = ()
    tpr: float = 0.95
    convention: str = "oodbench"
    aupr: bool = False
    groups: OodGroups | None = None
    small_fit_set: str = "fail"
    gram_dtype: str = "float64"
    strict: bool = False
    verify: bool = False
    adapted: Mapping[str, Any] = field(default_factory=dict)  # detector -> param -> {from, to} (a small fit set)

    @classmethod
    def build(
        cls,
        detectors: DetectorPlan = None,
        *,
        params: Mapping[str, Mapping[str, Any]] | None = None,
        fit: str = "fit",
        id: str = "id",  # noqa: A002 - the option's name (--id)
        ood: Sequence[str] = (),
        csid: Sequence[str] = (),
        tpr: float = 0.95,
        convention: str = "oodbench",
        aupr: bool = False,
        groups: str | OodGroups | None = None,
        small_fit_set: str = "fail",
        gram_dtype: str = "float64",
        strict: bool = False,
        verify: bool = False,
        require_ood: bool = True,
        default_groups: bool = True,
    ) -> EvaluationSpec:
        """Validate every option once (unknown detectors and parameters, ranges, names) and resolve parameters.

        `groups` is a groups file, a shipped name or `OodGroups`; with ``convention="openood"`` and no groups,
        OpenOOD's near / far groups unless `default_groups` is False (the Python functions' behaviour).
        `require_ood=False` builds a spec whose OOD sets come with the data.
        """
        if isinstance(tpr, bool) or not isinstance(tpr, (int, float)) or not 0.0 < float(tpr) <= 1.0:
            raise OodbenchError(f"tpr: must lie in (0, 1], e.g. 0.95; got {tpr}")  # NaN fails this too
        if convention not in CONVENTIONS:
            raise OodbenchError(f"convention: must be one of {', '.join(CONVENTIONS)}; got {convention!r}")
        if small_fit_set not in SMALL_FIT_SET:
            raise DetectorError(f"small_fit_set: must be one of {', '.join(SMALL_FIT_SET)}; got {small_fit_set!r}")
        check_gram_dtype(gram_dtype)  # says "gram_dtype must …"; front ends name their option (build_spec)
        if require_ood and not ood:
            raise OodbenchError("no OOD datasets given: pass at least one --ood")
        names = [fit, id, *csid, *ood]
        if len(set(names)) != len(names):
            raise OodbenchError(f"dataset names must be distinct; got {names}")
        plan = _plan(detectors, params)
        available = detector_registry.available()
        for name, given in plan.items():
            if name not in available:
                raise DetectorError(
                    f"unknown detector {name!r}{suggest(name, available)} (list them with `oodbench detectors`)"
                )
            problem = unknown_parameter(name, given, detector_registry.get_class(name).param_names())
            if problem is not None:
                raise DetectorError(f"{name}.{problem[0]}: {problem[1]}")
        resolved = {name: resolve_params(name, given) for name, given in plan.items()}
        default = DEFAULT_GROUPS if convention == "openood" and default_groups else None
        group_spec = groups if groups is not None else default
        loaded = load_groups(group_spec) if isinstance(group_spec, (str, bytes)) or _is_path(group_spec) else groups
        return cls(
            detectors=plan,
            resolved=resolved,
            fit=fit,
            id=id,
            ood=tuple(ood),
            csid=tuple(csid),
            tpr=float(tpr),
            convention=convention,
            aupr=bool(aupr),
            groups=loaded if isinstance(loaded, OodGroups) else None,
            small_fit_set=small_fit_set,
            gram_dtype=gram_dtype,
            strict=bool(strict),
            verify=bool(verify),
        )

    # ------------------------------------------------------------------ derived
    @property
    def datasets(self) -> list[str]:
        """Every dataset the evaluation reads: fit, ID test, covariate-shifted ID, OOD."""
        return [self.fit, self.id, *self.csid, *self.ood]

    @property
    def scored(self) -> list[str]:
        """The datasets every detector scores: ID test, covariate-shifted ID, OOD."""
        return [self.id, *self.csid, *self.ood]

    @property
    def conventions(self) -> list[str]:
        """The conventions of the result rows: oodbench's always, and the table's."""
        return list(dict.fromkeys(["oodbench", self.convention]))

    def with_datasets(self, *, fit: str, id: str, ood: Sequence[str], csid: Sequence[str] = ()) -> EvaluationSpec:  # noqa: A002
        """The same options over other dataset names (checked distinct)."""
        names = [fit, id, *csid, *ood]
        if len(set(names)) != len(names):
            raise OodbenchError(f"dataset names must be distinct; got {names}")
        if not ood:
            raise OodbenchError("no OOD datasets given: pass at least one --ood")
        return replace(self, fit=fit, id=id, ood=tuple(ood), csid=tuple(csid))

    def with_plan(self, plan: Mapping[str, Mapping[str, Any]], adapted: Mapping[str, Any]) -> EvaluationSpec:
        """The spec with the parameters a small fit set adapted (resolved again: the keys follow them); detectors
        missing from `plan` are left out."""
        given = {name: dict(plan[name]) for name in self.detectors if name in plan}
        return replace(
            self,
            detectors=given,
            resolved={name: resolve_params(name, params) for name, params in given.items()},
            adapted=dict(adapted),
        )


def _is_path(value: Any) -> bool:
    import os

    return isinstance(value, os.PathLike)
