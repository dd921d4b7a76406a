"""The runner's structure: kinds come from the registry the config is given, units are typed, keys are stable.

The key test recomputes every unit key of the demo plan from the content-address definitions (docs/runner.md,
"Stages and units"), so a refactoring of the planner that changed a key (and with it every user's cache) fails.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any

import pytest

from oodbench import __version__
from oodbench.core.errors import ConfigError
from oodbench.detectors import get_class
from oodbench.runner.config import parse_config
from oodbench.runner.kinds import DatasetKind
from oodbench.runner.ledger import Ledger, content_key
from oodbench.runner.plan import build_plan
from oodbench.runner.registry import KINDS, KindRegistry
from oodbench.runner.schema import PositiveInt, Table
from oodbench.runner.units import (
    AnalysisUnit,
    CombineUnit,
    ExtractUnit,
    FitUnit,
    MetricsUnit,
    ReportUnit,
    ScoreUnit,
    recorded_status,
)

from .helpers import demo_config
from .test_config import _set, mutate, timm_experiment


class _NpyFolder(DatasetKind):
    """A dataset kind known only to the registry a test passes (never registered into `KINDS`)."""

    name = "npy-folder"

    class Table(Table):
        kind: str
        root: str
        count: PositiveInt | None = None


def test_config_validates_against_the_registry_it_is_given(tmp_path: Path) -> None:
    data = mutate(timm_experiment(tmp_path), _set("datasets.noise", {"kind": "npy-folder", "root": "${data}/n"}))
    with pytest.raises(ConfigError, match=r"^datasets\.noise\.kind: unknown dataset kind 'npy-folder'"):
        parse_config(data)  # the default registry has no such kind
    own = _NpyFolder()
    kinds = KindRegistry(models=KINDS.model_kinds(), datasets={**KINDS.dataset_kinds(), "npy-folder": own})
    config = parse_config(data, kinds=kinds)
    noise = config.datasets["noise"]
    assert noise.kind_of is own  # the spec resolves its kind where the config found it
    assert noise.identity() == {"id": "noise", "kind": "npy-folder", "root": str(tmp_path / "data" / "n")}
    assert config.models["resnet50.tv_in1k"].kind_of is KINDS.model_kinds()["timm"]
    assert "npy-folder" not in KINDS.dataset_kinds()


def test_recorded_status_cached_stale_pending(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger")
    unit = MetricsUnit(label="m", key="k1")
    assert recorded_status(ledger, unit, outputs_present=True) == "pending"  # no record
    ledger.write("metrics", "m", "k1")
    assert recorded_status(ledger, unit, outputs_present=True) == "cached"
    assert recorded_status(ledger, unit, outputs_present=False) == "stale"  # recorded, outputs gone
    assert recorded_status(ledger, MetricsUnit(label="m", key="k2"), outputs_present=True) == "stale"  # other inputs
    assert recorded_status(ledger, AnalysisUnit(label="m", key="k1", analysis="a", params={}), True) == "pending"


def _expected_keys(config: Any) -> dict[str, str]:
    """Every unit key of a demo-like plan (one classifier, no subsets, no zero-shot), from the definitions."""
    from oodbench import detectors as registry
    from oodbench.detectors.shared import gram_key

    (model,) = config.models.values()
    keys: dict[str, str] = {}
    entry: dict[str, str] = {}
    for name in [config.fit, config.id_test, *config.ood]:
        spec = config.datasets[name]
        assert spec.parent is None and not spec.params.get("include") and not spec.params.get("exclude")
        # No parent entry, no list files: their parts of the key are None and {}.
        entry[name] = keys[f"extract:{model.id}/{name}"] = content_key(
            "extract", model.extract_identity(), spec.identity(), None, {}
        )
    score_keys = []
    for detector, params in config.detectors.items():
        # The detector's code version: oodbench's version and the hash of the module defining it.
        source = Path(inspect.getsourcefile(get_class(detector))).read_bytes()
        version = f"oodbench=={__version__}+{hashlib.sha256(source).hexdigest()[:16]}"
        fit = content_key("fit", entry[config.fit], detector, params, version)
        assert registry.detector_fingerprint(detector) is None  # built-in: no plugin part
        assert gram_key(registry.get_class(detector), config.gram_dtype) is None  # float64: no precision part
        keys[f"fit:{model.id}/{detector}"] = fit
        for name in [config.id_test, *config.ood]:
            # Scores do not depend on tpr: it enters the metrics' key only.
            score = keys[f"score:{model.id}/{detector}/{name}"] = content_key("score", fit, entry[name])
            score_keys.append(score)
    metrics = keys[f"metrics:{model.id}"] = content_key("metrics", sorted(score_keys), config.tpr)
    results = keys["metrics:all"] = content_key("results", [metrics])
    analyses = []
    for analysis, params in config.analysis.items():
        key = content_key("analysis", analysis, params, metrics, config.seed)
        keys[f"analysis:{analysis}/{model.id}"] = key
        analyses.append(key)
    keys["report:report"] = content_key("report", sorted([results, *analyses]), config.report, config.name, __version__)
    return keys


def test_demo_unit_keys_follow_their_definitions_and_units_are_typed(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "w")
    plan = build_plan(config)
    assert {u.id: u.key for u in plan.units} == _expected_keys(config)
    kinds = {stage: {type(u) for u in plan.stage(stage)} for stage in ("extract", "fit", "score", "report")}
    assert kinds == {"extract": {ExtractUnit}, "fit": {FitUnit}, "score": {ScoreUnit}, "report": {ReportUnit}}
    assert [type(u) for u in plan.stage("metrics")] == [MetricsUnit, CombineUnit]
    fit = next(u for u in plan.stage("fit") if isinstance(u, FitUnit) and u.detector == "knn")
    assert fit.params == config.detectors["knn"]
    entry = plan.get(f"extract:digits-cnn/{config.fit}")
    assert isinstance(entry, ExtractUnit) and entry.step == "extract" and entry.model_id == "digits-cnn"
    assert entry.model_key == content_key("model", config.models["digits-cnn"].extract_identity())
