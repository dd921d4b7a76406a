"""A plugin that declares no state: its fitted attributes are saved with their dtypes and shapes, and loading checks
a file against that record within bounds set by D, C and N. The one-file plugin of docs/plugins.md passes
check_detector, saves and loads, and appears in `oodbench detectors`, the runner's results and the report."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

from oodbench.core.errors import DetectorError
from oodbench.detectors import Array, Detector, Requirements, get_class, load, load_plugins, registry, save
from oodbench.detectors.testing import check_data, check_detector
from oodbench.util.atomic import sha256_file

ROOT = Path(__file__).resolve().parents[2]


def _docs_plugin() -> str:
    """The one-file detector shown in docs/plugins.md (the code block that starts with '# class_distance.py')."""
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# class_distance\.py\n.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "docs/plugins.md shows the one-file plugin once"
    return blocks[0]


@pytest.fixture
def plugin(tmp_path):
    """The docs' plugin file, loaded with --plugin semantics; the registry is restored afterwards."""
    saved, modules = registry._snapshot(), set(sys.modules)
    path = tmp_path / "class_distance.py"
    path.write_text(_docs_plugin(), encoding="utf-8")
    load_plugins([str(path)])
    yield path
    registry._restore(saved)
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.fixture
def saved(plugin, tmp_path):
    data = check_data()
    detector = get_class("class_distance")().fit(data.fit)
    directory = save(detector, tmp_path / "saved")
    return directory, detector, data


def test_the_docs_plugin_is_one_short_file_that_passes_check_detector(plugin):
    lines = plugin.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 40 and "state" not in plugin.read_text(encoding="utf-8").split("class ClassDistance")[1][:400]
    cls = get_class("class_distance")
    assert not cls.declares_state()
    check_detector(cls).raise_if_failed()


def test_its_state_is_recorded_and_loads_bit_identical(saved):
    directory, detector, data = saved
    meta = json.loads((directory / "detector.json").read_text())
    classes = len(np.unique(data.fit.labels))
    assert meta["inferred_state"] == {
        "classes_": {"array": "int64", "shape": [classes]},
        "means_": {"array": "float64", "shape": [classes, data.fit.num_features]},
        "scale_": {"scalar": "float"},
    }
    loaded = load(directory)
    assert type(loaded) is type(detector) and loaded.scale_ == detector.scale_
    np.testing.assert_array_equal(loaded.score(data.test), detector.score(data.test))


def _rewrite_meta(directory: Path, change) -> None:
    meta = json.loads((directory / "detector.json").read_text())
    change(meta)
    (directory / "detector.json").write_text(json.dumps(meta))


def _rewrite_arrays(directory: Path, change) -> None:
    arrays = load_file(str(directory / "state.safetensors"))
    change(arrays)
    save_file(arrays, str(directory / "state.safetensors"))
    _rewrite_meta(directory, lambda meta: meta.update(arrays_sha256=sha256_file(directory / "state.safetensors")))


def test_a_memory_bomb_is_refused_before_anything_is_read(saved):
    directory, _, data = saved
    bomb = {"array": "float64", "shape": [10**9]}
    _rewrite_meta(directory, lambda meta: meta["inferred_state"].update(means_=bomb))
    with pytest.raises(DetectorError, match=r"means_ has shape \(1000000000,\).* at most max\(D, C, N\) = 400"):
        load(directory)
    # Within each dimension's bound but too many values: D·N values where max(D, C, N)·max(D, C) = 400·16 are allowed.
    wide = {"array": "float64", "shape": [400, 400]}
    _rewrite_meta(directory, lambda meta: meta["inferred_state"].update(means_=wide))
    with pytest.raises(
        DetectorError, match=r"means_ holds 160,000 values; .* at most max\(D, C, N\)·max\(D, C\) = 6,400"
    ):
        load(directory)


def test_a_dtype_swap_is_refused(saved):
    directory, _, _ = saved
    _rewrite_arrays(directory, lambda arrays: arrays.update(means_=arrays["means_"].astype(np.float32)))
    with pytest.raises(DetectorError, match=r"means_ is float32; the detector declares float64"):
        load(directory)


def test_an_array_of_another_shape_than_recorded_is_refused(saved):
    directory, _, _ = saved
    _rewrite_arrays(directory, lambda arrays: arrays.update(means_=arrays["means_"][:, :-1].copy()))
    with pytest.raises(DetectorError, match=r"means_ has shape \(5, 15\)"):
        load(directory)


@pytest.mark.parametrize(
    "name,entry,message",
    [
        ("__class__", {"scalar": "int"}, "not a fitted attribute name"),
        ("fit_info_", {"scalar": "int"}, "not a fitted attribute name"),
        ("x_", {"array": "object", "shape": [3]}, "must be"),
        ("x_", {"array": "float64", "shape": [2, 2, 2, 2]}, "must be"),
        ("x_", {"scalar": "str"}, "must be"),
        ("x_", {"array": "float64", "shape": [-1]}, "at most"),
    ],
)
def test_a_record_that_is_not_numbers_of_bounded_shape_is_refused(saved, name, entry, message):
    directory, _, _ = saved
    _rewrite_meta(directory, lambda meta: meta["inferred_state"].update({name: entry}))
    with pytest.raises(DetectorError, match=message):
        load(directory)


def test_a_file_cannot_set_a_class_attribute_or_give_a_declaring_class_a_record(saved):
    directory, _, _ = saved
    cls = get_class("class_distance")
    cls.shadow_ = 1.0  # a class attribute a file must not overwrite on the instance
    try:
        _rewrite_meta(directory, lambda meta: meta["inferred_state"].update(shadow_={"scalar": "float"}))
        with pytest.raises(DetectorError, match="shadow_, which class_distance has as class attributes"):
            load(directory)
    finally:
        del cls.shadow_
    knn_dir = directory.parent / "knn"
    save(get_class("knn")(k=5).fit(check_data().fit), knn_dir)
    _rewrite_meta(knn_dir, lambda meta: meta.update(inferred_state={}))
    with pytest.raises(DetectorError, match="knn declares its state; the file's inferred_state is not its"):
        load(knn_dir)


class _Holds(Detector):
    """A detector whose fit keeps whatever `value` is."""

    requires = Requirements.of(fit=("features",), score=("features",))
    value: object = None

    def _fit(self, fit_set, head):
        self.held_ = type(self).value

    def _score_chunk(self, chunk):
        return -np.asarray(chunk.features, dtype=np.float64).sum(axis=1)


@pytest.mark.parametrize(
    "value,message",
    [
        ({"a": 1}, "held_ is a dict: an undeclared state holds numeric arrays and int/float/bool values only"),
        (None, "held_ is a NoneType"),
        (np.array(["a"]), "held_ is a str32 array"),
        (np.zeros((400, 400)), "held_ holds 160,000 values"),  # N × N: beyond max(D, C, N)·max(D, C)
    ],
)
def test_what_cannot_be_inferred_is_refused_at_save_and_by_check_detector(tmp_path, value, message):
    cls = type("Holds", (_Holds,), {"value": value})
    data = check_data()
    with pytest.raises(DetectorError, match=re.escape(message)):
        save(cls().fit(data.fit), tmp_path / "held")
    report = check_detector(cls, checks=["state_names"])
    assert not report.ok and message in str(report)


def test_a_declared_state_still_rules(tmp_path):
    """A class that declares its state keeps the strict check: an undeclared attribute is refused."""
    cls = type("Declared", (_Holds,), {"value": 1.0, "state": {"other_": Array("float64", ("D",))}})
    with pytest.raises(DetectorError, match="fitted state held_ is not declared"):
        save(cls().fit(check_data().fit), tmp_path / "declared")


def test_it_appears_in_the_detectors_listing(plugin):
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["detectors", "--plugin", str(plugin)])
    assert result.exit_code == 0 and "class_distance" in result.output
    table = CliRunner().invoke(app, ["detectors", "--plugin", str(plugin), "--markdown"])
    (line,) = [x for x in table.output.splitlines() if x.startswith("| `class_distance`")]
    assert "−min_c ‖z − μ_c‖ / s" in line and "fit: features, labels; score: features" in line


def test_it_runs_in_the_runner_and_reaches_the_report(tmp_path):
    """`plugins = ["class_distance.py"]` in the demo experiment: its scores, results rows and report rows."""
    from oodbench.core.results import read_rows
    from oodbench.runner.config import load_config
    from oodbench.runner.executor import run_experiment

    from ..runner.helpers import CONFIGS, FAST_DEMO

    snapshot, modules = registry._snapshot(), set(sys.modules)
    try:
        (tmp_path / "class_distance.py").write_text(_docs_plugin(), encoding="utf-8")
        text = (CONFIGS / "demo.toml").read_text(encoding="utf-8")
        (tmp_path / "exp.toml").write_text('plugins = ["class_distance.py"]\n' + text, encoding="utf-8")
        overrides = (
            *FAST_DEMO,
            "detectors.include=['class_distance','msp']",
            "detectors.exclude=[]",
            "detectors.params={}",
        )
        config = load_config(tmp_path / "exp.toml", overrides=overrides, workdir=tmp_path / "w")
        run_experiment(config, progress=False)
    finally:
        registry._restore(snapshot)
        for name in set(sys.modules) - modules:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
                del sys.modules[name]
    rows = [r for r in read_rows(tmp_path / "w" / "results.parquet") if r.detector == "class_distance"]
    assert {r.metric for r in rows} >= {"auroc", "fpr95"}
    noise = [r.value for r in rows if r.ood_dataset == "noise" and r.metric == "auroc"]
    assert noise and noise[0] > 0.9  # uniform noise is far from every digit class mean
    table = (tmp_path / "w" / "report" / "tables" / "table1.md").read_text(encoding="utf-8")
    assert "class_distance" in table and "class_distance" in (tmp_path / "w" / "report" / "report.html").read_text()
