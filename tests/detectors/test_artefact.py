"""Fitted detectors as artefacts: save/load round trips (bit-identical, also in a fresh process), the codec,
refusals (tampering, foreign classes, versions), provenance, `evaluate --save-detectors` and `oodbench score`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from oodbench.detectors import Detector, Requirements, available, create, fit_provenance, load, read_meta
from oodbench.detectors.artefact import ARRAYS_FILE, META_FILE
from oodbench.errors import DetectorError
from oodbench.store import Store

PROVENANCE = {"model": "tiny-net", "checkpoint": "sha256:abc", "preprocessing": {"resize": 8}}


def test_all_builtins_score_byte_identically_after_loading_in_a_fresh_process(problem, small_params, tmp_path):
    expected = {}
    for name in available():
        detector = create(name, **small_params.get(name, {})).fit(problem.fit, problem.head)
        detector.save(tmp_path / name)
        expected[name] = detector.score(problem.test)
    np.save(tmp_path / "features.npy", problem.test.features)
    np.save(tmp_path / "logits.npy", problem.test.logits)
    np.savez(tmp_path / "extras.npz", **problem.test.extras)  # the network-time detectors' arrays
    script = f"""
import numpy as np
from oodbench.detectors import available, load
from oodbench.outputs import Outputs
extras = dict(np.load({str(tmp_path / "extras.npz")!r}))
test = Outputs(np.load({str(tmp_path / "features.npy")!r}), np.load({str(tmp_path / "logits.npy")!r}), extras=extras)
for name in available():
    np.save({str(tmp_path)!r} + "/" + name + ".scores.npy", load({str(tmp_path)!r} + "/" + name).score(test))
"""
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    for name, scores in expected.items():
        loaded = np.load(tmp_path / f"{name}.scores.npy")
        assert loaded.dtype == np.float64 and loaded.tobytes() == scores.tobytes(), name


class Holder:
    """A plain class outside oodbench: not allowed in a saved state."""


class Everything(Detector):
    """Fitted state of every supported kind (the codec's round trip)."""

    name = "test-everything"
    requires = Requirements.of(fit=("features",), score=("features",))

    def __init__(self, layers: tuple[str, ...] = ("a", "b"), bins: dict | None = None) -> None:
        self.layers = layers
        self.bins = bins

    def _fit(self, fit_set, head):
        features = np.asarray(fit_set.features, dtype=np.float64)
        self.fortran_ = np.asfortranarray(features[:5, :4])
        self.reversed_ = features[:6, :4][:, ::-1]  # negative column stride
        self.strided_ = features[:8:2, ::3]
        self.bools_ = features[:3] > 1.0
        self.ints_ = np.arange(5, dtype=np.uint16)
        self.scalar_ = np.float32(1.25)
        self.special_ = [float("nan"), float("inf"), -0.0, 1e-300]
        self.tuple_ = (1, "two", None, (3.5,))
        self.set_ = frozenset({"x", "y"})
        self.int_keys_ = {0: np.zeros(2), 7: "seven"}
        self.dollar_keys_ = {"$array": 1}
        self.dtype_ = np.dtype("float32")
        self.empty_ = np.zeros((0, 3))
        self.mean_ = features.mean(axis=0)

    def _score_chunk(self, chunk):
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64) - self.mean_, axis=1)


def test_the_codec_round_trips_values_types_and_layouts(problem, tmp_path):
    detector = Everything(layers=("x",), bins={"x": 3}).fit(problem.fit)
    detector.save(tmp_path / "d")
    loaded = load(tmp_path / "d")
    assert loaded.get_params() == {"layers": ("x",), "bins": {"x": 3}}
    for key in ("fortran_", "reversed_", "strided_", "bools_", "ints_", "empty_", "mean_"):
        before, after = getattr(detector, key), getattr(loaded, key)
        assert after.dtype == before.dtype and after.strides == before.strides and np.array_equal(after, before), key
    assert type(loaded.scalar_) is np.float32 and loaded.scalar_ == np.float32(1.25)
    assert np.isnan(loaded.special_[0]) and loaded.special_[1:3] == [float("inf"), -0.0]
    assert str(loaded.special_[2]) == "-0.0" and loaded.special_[3] == 1e-300
    assert loaded.tuple_ == (1, "two", None, (3.5,)) and loaded.set_ == frozenset({"x", "y"})
    assert set(loaded.int_keys_) == {0, 7} and loaded.int_keys_[7] == "seven" and loaded.dollar_keys_ == {"$array": 1}
    assert loaded.dtype_ == np.float32 and loaded.fit_info_.num_features == problem.fit.num_features
    np.testing.assert_array_equal(loaded.score(problem.test), detector.score(problem.test))


def test_saving_refuses_unfitted_detectors_and_foreign_objects(problem, tmp_path):
    with pytest.raises(DetectorError, match="not fitted: nothing to save"):
        create("knn").save(tmp_path / "unfitted")
    detector = create("energy").fit(problem.fit)
    detector.holder_ = Holder()
    with pytest.raises(DetectorError, match="cannot save holder_: a .*Holder is not an array"):
        detector.save(tmp_path / "foreign")
    detector.holder_ = [1]
    detector.holder_.append(detector.holder_)
    with pytest.raises(DetectorError, match=r"cannot save holder_\[1\]: it refers back to itself"):
        detector.save(tmp_path / "cycle")
    detector.holder_ = np.array(["text"])
    with pytest.raises(DetectorError, match="arrays of dtype <U4 are not supported"):
        detector.save(tmp_path / "strings")


def test_loading_refuses_tampering_and_code_outside_oodbench(problem, tmp_path):
    path = create("maha").fit(problem.fit).save(tmp_path / "maha")
    meta = json.loads((path / META_FILE).read_text())
    # A state that names another module's callable must not be imported, let alone called.
    evil = dict(meta, state={**meta["state"], "x_": {"$object": "os:system", "state": {}}})
    (path / META_FILE).write_text(json.dumps(evil))
    with pytest.raises(DetectorError, match="os:system; only classes from oodbench are loaded"):
        load(path)
    (path / META_FILE).write_text(json.dumps(meta))
    load(path)
    with open(path / ARRAYS_FILE, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    with pytest.raises(DetectorError, match="does not match detector.json"):
        load(path)
    with pytest.raises(DetectorError, match="is not a saved detector"):
        load(tmp_path)
    (path / META_FILE).write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(DetectorError, match="format 99"):
        read_meta(path)


def test_loading_refuses_another_version_unless_told(problem, tmp_path):
    path = create("energy").fit(problem.fit).save(tmp_path / "energy")
    meta = json.loads((path / META_FILE).read_text())
    meta["origin"]["version"] = "0.0.1"
    (path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DetectorError, match="saved with oodbench 0.0.1 but oodbench .* is installed"):
        load(path)
    assert load(path, check_versions=False).name == "energy"


def test_a_resave_keeps_the_fit_provenance(problem, tmp_path):
    path = create("energy").fit(problem.fit).save(tmp_path / "a", provenance={"model_id": "m", "checkpoint": "c"})
    loaded = load(path)
    assert loaded.fit_provenance_ == {"model_id": "m", "checkpoint": "c"}
    assert read_meta(loaded.save(tmp_path / "b"))["provenance"] == {"model_id": "m", "checkpoint": "c"}
    assert "fit_provenance_" not in read_meta(tmp_path / "b")["state"]


# ----------------------------------------------------------------------------------------------- store + CLI
@pytest.fixture
def tiny_store(tmp_path, make, build_outputs):
    """A store with fit/id/ood entries of one model, a 'new' entry of the same checkpoint and one of another."""
    problem = make(seed=3)
    store = Store(tmp_path / "store")
    store.write_head("tiny", problem.head, provenance=PROVENANCE)
    n = problem.n_id
    entries = {
        "fit": problem.fit,
        "id": problem.test.subset(slice(0, n)),
        "ood": problem.test.subset(slice(n, None)),
        "new": build_outputs(np.asarray(make(seed=4).test.features), problem.head),
    }
    for name, outputs in entries.items():
        store.write_outputs("tiny", name, outputs, provenance=PROVENANCE, item_hash=f"items-{name}")
    other = {**PROVENANCE, "checkpoint": "sha256:def"}
    store.write_outputs("tiny", "other-ckpt", entries["new"], provenance=other, item_hash="items-other")
    return store


def cli(*args: str):
    from oodbench.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_evaluate_keeps_fitted_detectors_and_score_reuses_them_without_the_fit_set(tiny_store, tmp_path):
    root = str(tiny_store.root)
    kept = tmp_path / "kept"
    result = cli(
        "evaluate", "--store", root, "--model", "tiny", "--fit", "fit", "--id", "id", "--ood", "ood",
        "-d", "maha++,knn", "-p", "knn.k=5", "--out", str(tmp_path / "run"), "--save-detectors", str(kept),
        "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = read_meta(kept / "maha++")
    assert meta["provenance"]["fit_dataset"] == "fit" and meta["provenance"]["model_id"] == "tiny"
    assert meta["provenance"]["item_hash"] == "items-fit" and meta["provenance"]["checkpoint"] == "sha256:abc"
    assert meta["provenance"]["preprocessing"] == {"resize": 8} and meta["versions"]["oodbench"]
    assert read_meta(kept / "knn")["params"]["k"] == 5

    out = tmp_path / "scored"
    result = cli("score", "--detector", str(kept / "maha++"), "--store", root, "--dataset", "new", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "new: 300 rows scored by maha++ (fit on tiny/fit)" in result.output
    direct = create("maha++").fit(tiny_store.read("tiny", "fit")).score(tiny_store.read("tiny", "new"))
    assert np.load(out / "new.npy").tobytes() == direct.tobytes()
    table = np.loadtxt(out / "new.csv", delimiter=",", skiprows=1)
    assert table[:, 0].tolist() == list(range(300)) and table[:, 1].tobytes() == direct.tobytes()

    refused = cli("score", "--detector", str(kept / "maha++"), "--store", root, "--dataset", "other-ckpt")
    assert refused.exit_code == 2
    assert "provenance mismatch" in refused.output and "checkpoint='sha256:abc'" in refused.output
    assert "checkpoint='sha256:def'" in refused.output


def test_evaluate_refits_when_the_saved_detector_is_missing(tiny_store, tmp_path):
    root, run = str(tiny_store.root), str(tmp_path / "run")
    base = ["evaluate", "--store", root, "--model", "tiny", "--fit", "fit", "--id", "id", "--ood", "ood", "-d"]
    assert cli(*base, "energy", "--out", run, "--no-progress").exit_code == 0  # scores cached, nothing saved
    result = cli(*base, "energy", "--out", run, "--save-detectors", str(tmp_path / "kept"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert read_meta(tmp_path / "kept" / "energy")["detector"] == "energy"


def test_score_refuses_a_detector_without_provenance(tiny_store, tmp_path):
    path = create("energy").fit(tiny_store.read("tiny", "fit")).save(tmp_path / "bare")
    result = cli(
        "score", "--detector", str(path), "--store", str(tiny_store.root), "--dataset", "new", "--model", "tiny"
    )
    assert result.exit_code == 2 and "records no fit provenance" in result.output


def test_fit_provenance_reads_the_store_entry(tiny_store):
    provenance = fit_provenance(tiny_store, "tiny", "fit")
    assert provenance["model_id"] == "tiny" and provenance["item_hash"] == "items-fit"
    assert provenance["entry_provenance"] == PROVENANCE and provenance["head"] == PROVENANCE


def test_evaluate_takes_plugin_files_and_keys_their_scores_by_source(tiny_store, tmp_path):
    from oodbench.detectors import registry

    saved = registry._snapshot()
    plugin = tmp_path / "neg_norm.py"
    source = (
        "import numpy as np\nfrom oodbench.detectors import Detector, Requirements, register\n\n\n"
        '@register("neg_norm")\nclass NegNorm(Detector):\n    requires = Requirements.of(score=("features",))\n\n'
        "    def _score_chunk(self, chunk):\n"
        "        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64), axis=1)\n"
    )
    plugin.write_text(source)
    run = tmp_path / "run"
    args = ["evaluate", "--store", str(tiny_store.root), "--model", "tiny", "--fit", "fit", "--id", "id"]
    args += ["--ood", "ood", "-d", "neg_norm,energy", "--plugin", str(plugin), "--out", str(run), "--no-progress"]
    try:
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert any(line.startswith("| neg_norm") for line in result.output.splitlines()), result.output
        first = json.loads((run / "run.json").read_text())["score_keys"]
        plugin.write_text(source + "# a new version\n")
        registry._ORIGINS.pop("neg_norm")  # as a fresh process would see it
        assert cli(*args).exit_code == 0
        second = json.loads((run / "run.json").read_text())["score_keys"]
        assert second["energy"] == first["energy"] and second["neg_norm"] != first["neg_norm"]
    finally:
        registry._restore(saved)
