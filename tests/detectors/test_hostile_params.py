"""Integer parameters that would reach faiss, numpy shapes or torch are bounded in their type: a huge value in a
saved detector (``nprobe = 10**30`` ended in an unexpected OverflowError, exit 1) or at construction is one
`DetectorError` line, and `oodbench score` exits with status 2."""

from __future__ import annotations

import json
import shutil

import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.store import Store
from oodbench.detectors import create, load, save

from ..cli_once import invoke
from .hostile.cases import PROVENANCE, SOURCES, fit_data

pytestmark = pytest.mark.hostile

HUGE = [10**30, 2**63, 2**64 + 1, 2**41, -(2**63)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pytest.importorskip("faiss")
    root = tmp_path_factory.mktemp("params")
    fit, head = fit_data()
    name, params = SOURCES["knn_ivf"]
    save(create(name, **params).fit(fit, head), root / "knn_ivf", provenance=PROVENANCE)
    store = Store(root / "store")
    store.write_head("tiny", head, provenance=dict(PROVENANCE))
    store.write_outputs("tiny", "new", fit.subset(slice(0, 50)), provenance=dict(PROVENANCE), item_hash="items-new")
    return root


@pytest.mark.parametrize("value", HUGE, ids=str)
@pytest.mark.parametrize("param", ["nprobe", "k", "nlist", "seed"])
def test_a_saved_ivf_knn_with_a_huge_integer_parameter_is_refused(saved, tmp_path, param, value):
    folder = tmp_path / "det"
    shutil.copytree(saved / "knn_ivf", folder)
    meta = json.loads((folder / "detector.json").read_text())
    meta["params"][param] = value
    (folder / "detector.json").write_text(json.dumps(meta))
    with pytest.raises(DetectorError) as info:
        load(folder)
    assert "\n" not in str(info.value) and param in str(info.value)
    args = ["score", "--detector", str(folder), "--store", str(saved / "store"), "--dataset", "new", "--model", "tiny"]
    result = invoke(args)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize(
    "name, param",
    [("knn", "k"), ("knn", "nprobe"), ("knn", "seed"), ("nac", "seed"), ("gen", "top_m"), ("nac", "fit_rows")],
)
def test_constructing_a_detector_with_a_huge_integer_is_one_line(name, param):
    from oodbench.detectors import registry

    if name not in registry.available() or param not in registry.get_class(name).param_names():
        pytest.skip(f"{name} has no parameter {param}")
    with pytest.raises(DetectorError, match=param):
        create(name, **{param: 10**30}).validate_params()
