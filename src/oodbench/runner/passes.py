"""Extraction passes: the pending extraction units of one dataset whose models share one decode of every image.

Per dataset, the models whose kind extracts through the default pipeline are packed first-fit, in the config's
order, into passes whose estimated device memory (`oodbench.extract.passes`) fits the budget: ``engine.pass_memory_gb``
or 80 % of the free memory of the run's device. A model of unknown size, one that does not fit alone, derived
subsets, probe heads and models that fill their store in one call run alone, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import ExperimentConfig
from .units import ExtractStageUnit

__all__ = ["Pass", "extraction_passes", "pass_budget"]


@dataclass
class Pass:
    """Units extracted in one pass over a dataset (one unit: a single-model extraction), with their estimated bytes."""

    units: list[ExtractStageUnit]
    nbytes: int | None = None

    @property
    def shared(self) -> bool:
        """True when several models share the decode."""
        return len(self.units) > 1


def pass_budget(config: ExperimentConfig, device: str = "auto") -> int:
    """Bytes the models of one pass may take on the run's device."""
    from ..extract.backbones.base import resolve_device
    from ..extract.passes import BUDGET_FRACTION, device_memory

    configured = config.engine.get("pass_memory_gb")
    if configured:
        return int(float(configured) * 2**30)
    return int(device_memory(resolve_device(device)) * BUDGET_FRACTION)


def extraction_passes(config: ExperimentConfig, units: Sequence[ExtractStageUnit], device: str = "auto") -> list[Pass]:
    """The extraction units in passes, in plan order of each pass's first unit."""
    from ..extract.passes import pack_passes

    budget: int | None = None
    by_dataset: dict[str, list[tuple[ExtractStageUnit, int | None]]] = {}
    passes: list[Pass] = []
    slot: dict[str, int] = {}
    for unit in units:
        model = config.models[unit.model_id]
        if unit.step != "extract" or not model.kind_of.shares_decode(model):
            passes.append(Pass([unit]))
            continue
        footprint = model.kind_of.footprint(model)
        assert unit.dataset is not None
        if unit.dataset not in slot:
            slot[unit.dataset] = len(passes)
            passes.append(Pass([]))  # placeholder: the dataset's passes go where its first unit stands
        by_dataset.setdefault(unit.dataset, []).append((unit, None if footprint is None else footprint.nbytes))
    expanded: list[Pass] = []
    where = {index: dataset for dataset, index in slot.items()}
    for index, item in enumerate(passes):
        if index not in where:
            expanded.append(item)
            continue
        members = by_dataset[where[index]]
        if budget is None:
            budget = pass_budget(config, device)
        for group in pack_passes([size for _, size in members], budget):
            sizes = [members[i][1] for i in group]
            total = None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)
            expanded.append(Pass([members[i][0] for i in group], total))
    return expanded
