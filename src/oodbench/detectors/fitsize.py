"""What a fit set is before any image goes through the model: its rows, classes, feature width and arrays.

A detector whose parameters the fit set cannot support says so through `Detector.size_problems(FitSize)`, so a
command checks every detector against the fit set before extracting anything and reports every problem at once.
`Detector.adapted_to(FitSize)` gives the parameter values a small fit set supports (``--small-fit-set adapt``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..core.errors import DetectorError

if TYPE_CHECKING:
    from ..core.outputs import Outputs

__all__ = [
    "FitSize",
    "SMALL_FIT_SET",
    "adapt_plan",
    "describe_changes",
    "plan_size_problems",
    "raise_size_problems",
    "unsupported_line",
]

SMALL_FIT_SET = ("fail", "adapt")  # what a run does when the fit set is too small for a detector's parameters


@dataclass(frozen=True)
class FitSize:
    """Rows, distinct classes (None: unknown), feature width D (None: unknown), array names of a fit set, and the
    number of classes C of the model's head or logits (None: unknown)."""

    rows: int
    classes: int | None = None
    features: int | None = None
    arrays: frozenset[str] = field(default_factory=frozenset)
    head_classes: int | None = None

    @staticmethod
    def of(fit_set: Outputs) -> FitSize:
        """The size of fit-set arrays at hand (classes are not counted: that would read every label)."""
        return FitSize(len(fit_set), None, fit_set.num_features, frozenset(fit_set.array_names()), fit_set.num_classes)

    def describe(self) -> str:
        """E.g. '84 rows, 7 classes'."""
        classes = "" if self.classes is None else f", {self.classes} class{'es' if self.classes != 1 else ''}"
        return f"{self.rows} row{'s' if self.rows != 1 else ''}{classes}"


def plan_size_problems(instances: Mapping[str, Any], size: FitSize) -> list[str]:
    """Every parameter of every detector that the fit set cannot support, as 'name: problem' lines."""
    return [f"{name}: {problem}" for name, detector in instances.items() for problem in detector.size_problems(size)]


def unsupported_line(size: FitSize, problems: Sequence[str], instances: Mapping[str, Any]) -> str:
    """`problems` (from `plan_size_problems`) as one sentence that blames the right thing.

    A problem that a fit set of any size would still have (``neco: dim=100 exceeds the feature dimension D=64``)
    is about the model's feature width, not the fit set: it is listed under "the features (D=64) are too narrow
    for", the others under "the fit set (650 rows) is too small for".
    """
    unlimited = replace(size, rows=2**40, classes=size.head_classes)
    lasting = set(plan_size_problems(instances, unlimited))
    narrow = [p for p in problems if p.removesuffix(" (no automatic choice)") in lasting]
    small = [p for p in problems if p not in narrow]
    parts = []
    if small:
        parts.append(f"the fit set ({size.describe()}) is too small for: {'; '.join(small)}")
    if narrow:
        parts.append(f"the features (D={size.features}) are too narrow for: {'; '.join(narrow)}")
    return "; and ".join(parts)


def adapt_plan(
    plan: Mapping[str, Mapping[str, Any]], instances: Mapping[str, Any], size: FitSize
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]], list[str]]:
    """Scale the parameters a small fit set cannot support; (new plan, what changed, what could not be adapted).

    Only parameters left at their defaults change: a value given explicitly stays, and if the fit set cannot
    support it, it is reported in the third element. `changed` maps detector -> parameter -> {"from", "to"}.
    """
    new_plan = {name: dict(params) for name, params in plan.items()}
    changed: dict[str, dict[str, dict[str, Any]]] = {}
    refused: list[str] = []
    for name, detector in instances.items():
        if not detector.size_problems(size):
            continue
        proposal = detector.adapted_to(size)
        explicit = sorted(set(proposal) & set(plan[name]))
        if explicit:
            given = ", ".join(f"{name}.{key}={plan[name][key]!r}" for key in explicit)
            refused.append(f"{name}: {given} was given explicitly and is kept (only defaults are adapted)")
            continue
        if not proposal:
            refused.extend(f"{name}: {problem} (no automatic choice)" for problem in detector.size_problems(size))
            continue
        current = detector.get_params()
        new_plan[name].update(proposal)
        changed[name] = {key: {"from": current[key], "to": value} for key, value in proposal.items()}
    return new_plan, changed, refused


def describe_changes(changed: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """E.g. 'knn.k 1000 -> 1; nnguide.alpha 0.01 -> 1.0, nnguide.k 100 -> 1'."""
    return "; ".join(
        ", ".join(f"{name}.{key} {change['from']!r} -> {change['to']!r}" for key, change in params.items())
        for name, params in changed.items()
    )


def raise_size_problems(name: str, problems: Sequence[str]) -> None:
    """Raise one DetectorError listing `problems` of detector `name` (nothing when there are none)."""
    if problems:
        raise DetectorError(f"{name}: {'; '.join(problems)}")
