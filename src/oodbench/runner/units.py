"""The units of a plan: one dataclass per kind of work, the content keys they pass downstream, and the status rule.

A unit's stage is fixed by its class (`ExtractUnit` and `HeadUnit` are ``extract`` units, `ZeroShotUnit` is a
``score`` unit, `CombineUnit` a ``metrics`` unit …); what a kind of unit needs to run is a typed field of its class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .ledger import Ledger

__all__ = [
    "STAGES",
    "DONE",
    "Unit",
    "ExtractUnit",
    "HeadUnit",
    "ExtractStageUnit",
    "FitUnit",
    "ScoreUnit",
    "ZeroShotUnit",
    "MetricsUnit",
    "CombineUnit",
    "AnalysisUnit",
    "ReportUnit",
    "UnitKeys",
    "recorded_status",
]

STAGES = ("extract", "fit", "score", "metrics", "analysis", "report")
# Statuses: cached (done, key matches, outputs verify) · pending (never done) · stale (done with another key) ·
# skipped (done: the detector's requirements are not met by the model's arrays; the reason is recorded).
DONE = ("cached", "skipped")


@dataclass(kw_only=True)
class Unit:
    """One unit of work: label (model/detector/dataset …), content key, status, size, what it reads."""

    stage: ClassVar[str]
    label: str
    key: str
    status: str = "pending"
    model: str | None = None
    dataset: str | None = None
    detector: str | None = None
    deps: tuple[str, ...] = ()
    items: int | None = None
    nbytes: int | None = None
    note: str = ""

    @property
    def id(self) -> str:
        """Unique id, ``<stage>:<label>``."""
        return f"{self.stage}:{self.label}"

    @property
    def todo(self) -> bool:
        """True when the unit must (re)run."""
        return self.status not in DONE


@dataclass(kw_only=True)
class ExtractUnit(Unit):
    """One store entry of a model: extracted from the dataset's images, or derived from a parent entry's rows.

    `model` is the store id (a probe's frozen backbone); `model_id` the config's model that planned it.
    """

    stage: ClassVar[str] = "extract"
    step: Literal["extract", "derive"]
    model_id: str
    model_key: str  # the model's identity alone: a change of it resets the model's store entries
    adopt: Mapping[str, Any] | None = None  # fingerprint of an entry made outside the runner, taken as this output
    model_changed: bool = False  # recorded with another model identity
    estimated_bytes: bool = False  # nbytes estimated from the model's other entries


@dataclass(kw_only=True)
class HeadUnit(Unit):
    """The training of a model's head on its extracted arrays (a probe), writing the head and its entries."""

    stage: ClassVar[str] = "extract"
    step: ClassVar[str] = "head"
    model_id: str


# The units of the extract stage: store entries and heads (both name the config's model as `model_id`).
ExtractStageUnit = ExtractUnit | HeadUnit


@dataclass(kw_only=True)
class FitUnit(Unit):
    """One detector fitted on one classifier's fit set (it runs with the score units it feeds)."""

    stage: ClassVar[str] = "fit"
    params: Mapping[str, Any]


@dataclass(kw_only=True)
class ScoreUnit(Unit):
    """One detector's per-image scores of one dataset."""

    stage: ClassVar[str] = "score"


@dataclass(kw_only=True)
class ZeroShotUnit(Unit):
    """A VLM's zero-shot scores (its run directory): `columns` on each of `datasets`, `patches` says how GL-MCM runs."""

    stage: ClassVar[str] = "score"
    columns: list[str]
    datasets: list[str]
    patches: str


@dataclass(kw_only=True)
class MetricsUnit(Unit):
    """One classifier's run directory made from its score units."""

    stage: ClassVar[str] = "metrics"


@dataclass(kw_only=True)
class CombineUnit(Unit):
    """Every model's result rows in one file."""

    stage: ClassVar[str] = "metrics"


@dataclass(kw_only=True)
class AnalysisUnit(Unit):
    """One analysis (``subsample`` or ``intervals``) of one model's run, with its parameters."""

    stage: ClassVar[str] = "analysis"
    analysis: str
    params: Mapping[str, Any]


@dataclass(kw_only=True)
class ReportUnit(Unit):
    """The report of every model's run."""

    stage: ClassVar[str] = "report"


@dataclass
class UnitKeys:
    """The content keys planned so far, by what they identify; a unit's key hashes the keys of what it reads."""

    entries: dict[tuple[str, str], str] = field(default_factory=dict)  # (model or store id, dataset): a store entry
    fits: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, detector)
    zeroshot: dict[str, str] = field(default_factory=dict)  # VLM id: its zero-shot run
    metrics: dict[str, str] = field(default_factory=dict)  # model id: its run directory (a VLM's is its zero-shot run)
    results: str | None = None  # every model's rows
    analyses: dict[tuple[str, str], str] = field(default_factory=dict)  # (analysis, model id)

    def report_inputs(self) -> list[str]:
        """The keys the report reads (the combined results and every analysis), sorted."""
        return sorted([*([self.results] if self.results is not None else []), *self.analyses.values()])


def recorded_status(ledger: Ledger, unit: Unit, outputs_present: bool) -> str:
    """The status from the unit's ledger record: cached when it carries the unit's key and the outputs are there,
    stale when there is a record all the same (other inputs, or outputs gone), pending when there is none."""
    record = ledger.read(unit.stage, unit.label)
    if record is not None and record.get("key") == unit.key and outputs_present:
        return "cached"
    return "stale" if record is not None else "pending"
