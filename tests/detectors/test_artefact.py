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

from oodbench.core.errors import DetectorError
from oodbench.core.store import Store
from oodbench.detectors import (
    Array,
    Detector,
    Keyed,
    Optional,
    Requirements,
    Scalar,
    available,
    create,
    fit_provenance,
    load,
    read_meta,
    save,
)
from oodbench.detectors.artefact import ARRAYS_FILE, META_FILE

PROVENANCE = {"model": "tiny-net", "checkpoint": "sha256:abc", "preprocessing": {"resize": 8}}


def test_all_builtins_score_byte_identically_after_loading_in_a_fresh_process(problem, small_params, tmp_path):
    expected = {}
    for name in available():
        detector = create(name, **small_params.get(name, {})).fit(problem.fit, problem.head)
        save(detector, tmp_path / name)
        expected[name] = detector.score(problem.test)
    np.save(tmp_path / "features.npy", problem.test.features)
    np.save(tmp_path / "logits.npy", problem.test.logits)
    np.savez(tmp_path / "extras.npz", **problem.test.extras)  # the network-time detectors' arrays
    script = f"""
import numpy as np
from oodbench.detectors import available, load
from oodbench.core.outputs import Outputs
extras = dict(np.load({str(tmp_path / "extras.npz")!r}))
test = Outputs(np.load({str(tmp_path / "features.npy")!r}), np.load({str(tmp_path / "logits.npy")!r}), extras=extras)
for name in available():
    np.save({str(tmp_path)!r} + "/" + name + ".scores.npy", load({str(tmp_path)!r} + "/" + name).score(test))
"""
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    for name, scores in expected.items():
        loaded = np.load(tmp_path / f"{name}.scores.npy")
        assert loaded.dtype == np.float64 and loaded.tobytes() == scores.tobytes(), name


class Layouts(Detector):
    """Fitted state of every declared kind: arrays in C and Fortran order, numbers, optional and keyed values."""

    name = "test-layouts"
    requires = Requirements.of(fit=("features",), score=("features",))
    state = {
        "fortran_": Array("float64", (5, 4)),
        "bools_": Array("bool", (3, "D")),
        "ints_": Array("uint16", (5,)),
        "empty_": Array("float64", (0, 3)),
        "count_": Scalar(int, 0, "N"),
        "scale_": Scalar(float),
        "special_": Scalar(float, finite=False),
        "flag_": Scalar(bool),
        "maybe_": Optional(Array("float64", ("D",))),
        "per_layer_": Keyed({"a": Array("float32", ("D",)), "b": Scalar(float)}),
        "mean_": Array("float64", ("D",)),
    }

    def __init__(self, layers: tuple[str, ...] = ("a", "b"), bins: dict | None = None) -> None:
        self.layers = layers
        self.bins = bins

    def _fit(self, fit_set, head):
        features = np.asarray(fit_set.features, dtype=np.float64)
        self.fortran_ = np.asfortranarray(features[:5, :4])
        self.bools_ = features[:3] > 1.0
        self.ints_ = np.arange(5, dtype=np.uint16)
        self.empty_ = np.zeros((0, 3))
        self.count_ = len(fit_set)
        self.scale_ = 1e-300
        self.special_ = float("-inf")
        self.flag_ = True
        self.maybe_ = None
        self.per_layer_ = {"a": features[0].astype(np.float32), "b": -0.0}
        self.mean_ = features.mean(axis=0)

    def _score_chunk(self, chunk):
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64) - self.mean_, axis=1)


def test_declared_state_round_trips_values_types_and_layouts(problem, tmp_path):
    detector = Layouts(layers=("x",), bins={"x": 3}).fit(problem.fit)
    save(detector, tmp_path / "d")
    loaded = load(tmp_path / "d", detector_class=Layouts)
    assert loaded.get_params() == {"layers": ("x",), "bins": {"x": 3}}  # a tuple default brings the tuple back
    for key in ("fortran_", "bools_", "ints_", "empty_", "mean_"):
        before, after = getattr(detector, key), getattr(loaded, key)
        assert after.dtype == before.dtype and after.strides == before.strides and np.array_equal(after, before), key
    assert loaded.fortran_.flags.f_contiguous and loaded.fortran_.flags.writeable
    assert loaded.count_ == len(problem.fit) and loaded.scale_ == 1e-300 and loaded.special_ == float("-inf")
    assert loaded.flag_ is True and loaded.maybe_ is None and str(loaded.per_layer_["b"]) == "-0.0"
    assert loaded.fit_info_ == detector.fit_info_ and loaded.fit_info_.num_rows == len(problem.fit)
    np.testing.assert_array_equal(loaded.score(problem.test), detector.score(problem.test))
    with pytest.raises(DetectorError, match="detector 'test-layouts' .*is not registered"):
        load(tmp_path / "d")  # only the caller, never the file, names a class that is not registered


def test_saving_refuses_state_that_is_not_declared_or_not_as_declared(problem, tmp_path):
    with pytest.raises(DetectorError, match="not fitted: nothing to save"):
        save(create("knn"), tmp_path / "unfitted")
    detector = create("energy").fit(problem.fit)
    detector.holder_ = np.zeros(3)
    with pytest.raises(DetectorError, match="fitted state holder_ is not declared"):
        save(detector, tmp_path / "undeclared")
    detector = Layouts().fit(problem.fit)
    detector.mean_ = detector.mean_.astype(np.float32)
    with pytest.raises(DetectorError, match="cannot save mean_ is float32; the detector declares float64"):
        save(detector, tmp_path / "dtype")
    detector = Layouts().fit(problem.fit)
    detector.fortran_ = np.asarray(problem.fit.features, dtype=np.float64)[:10:2, :4]
    with pytest.raises(DetectorError, match="a strided view"):
        save(detector, tmp_path / "strided")
    detector = Layouts().fit(problem.fit)
    detector.mean_ = np.full(problem.fit.num_features, np.nan)
    with pytest.raises(DetectorError, match="holds 12 non-finite values"):
        save(detector, tmp_path / "nan")
    assert not (tmp_path / "nan" / META_FILE).exists()


@pytest.mark.parametrize("name", ["vim", "residual"])
def test_the_residual_space_is_checked_against_the_parameters(problem, tmp_path, name):
    """ViM and Residual keep dim_ and a D × (D − dim) basis: a file whose dim disagrees with its state is refused."""
    path = save(create(name, dim=5).fit(problem.fit, problem.head), tmp_path / name)
    meta = json.loads((path / META_FILE).read_text())
    (path / META_FILE).write_text(json.dumps(dict(meta, params={**meta["params"], "dim": 6})))
    with pytest.raises(DetectorError, match="dim_"):
        load(path)


def test_loading_refuses_tampering_and_the_earlier_format(problem, tmp_path):
    path = save(create("maha").fit(problem.fit), tmp_path / "maha")
    meta = json.loads((path / META_FILE).read_text())
    evil = dict(meta, state={**meta["state"], "x_": {"$object": "os:system", "state": {}}})
    (path / META_FILE).write_text(json.dumps(evil))
    with pytest.raises(DetectorError, match="the state holds x_, which maha does not declare"):
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
    (path / META_FILE).write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(DetectorError, match="format 1; this oodbench reads format 2 .*refit and save again"):
        read_meta(path)


def test_knn_ivf_and_the_background_gaussian_round_trip_bit_identically(problem, tmp_path):
    from oodbench.detectors._gaussian import ClassGaussians

    cases = {
        "ivf": create("knn", k=5, index="ivf", nlist=4, nprobe=2).fit(problem.fit),
        "rmaha": create("rmaha").fit(problem.fit),
    }
    # A rank-deficient covariance takes the pseudo-inverse path: the background is its own Gaussian.
    degenerate = problem.fit.features.copy()
    degenerate[:, -1] = degenerate[:, 0]
    fit = type(problem.fit)(degenerate, problem.fit.logits, problem.fit.labels)
    cases["rmaha-pinv"] = create("rmaha").fit(fit)
    assert isinstance(cases["rmaha-pinv"].gaussians_, ClassGaussians)
    assert cases["rmaha-pinv"].gaussians_.background is not None
    test = problem.test
    for label, detector in cases.items():
        loaded = load(save(detector, tmp_path / label))
        assert loaded.score(test).tobytes() == detector.score(test).tobytes(), label


def test_loading_refuses_another_version_unless_told(problem, tmp_path):
    path = save(create("energy").fit(problem.fit), tmp_path / "energy")
    meta = json.loads((path / META_FILE).read_text())
    meta["origin"]["version"] = "0.0.1"
    (path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DetectorError, match="saved with oodbench 0.0.1 but oodbench .* is installed"):
        load(path)
    assert load(path, check_versions=False).name == "energy"


def test_a_resave_keeps_the_fit_provenance(problem, tmp_path):
    path = save(create("energy").fit(problem.fit), tmp_path / "a", provenance={"model_id": "m", "checkpoint": "c"})
    loaded = load(path)
    assert loaded.fit_provenance_ == {"model_id": "m", "checkpoint": "c"}
    assert read_meta(save(loaded, tmp_path / "b"))["provenance"] == {"model_id": "m", "checkpoint": "c"}
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
    from oodbench.cli.main import app

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
    assert np.unique(direct).size > 290  # 300 random rows get their own distances, not one constant score
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


def test_the_api_records_the_fit_sets_provenance_and_score_uses_it(tiny_store, tmp_path):
    fit = tiny_store.read("tiny", "fit")
    path = save(create("energy").fit(fit), tmp_path / "api")
    provenance = read_meta(path)["provenance"]
    assert provenance["model_id"] == "tiny" and provenance["fit_dataset"] == "fit"
    assert provenance["checkpoint"] == "sha256:abc" and provenance["item_hash"] == "items-fit"
    assert provenance == fit_provenance(tiny_store, "tiny", "fit")
    result = cli("score", "--detector", str(path), "--store", str(tiny_store.root), "--dataset", "new")
    assert result.exit_code == 0 and "(fit on tiny/fit)" in result.output, result.output
    # A refit on outputs of unknown origin forgets the earlier fit's provenance.
    refit = create("energy").fit(fit).fit(fit.subset(slice(0, 100)))
    assert not hasattr(refit, "fit_provenance_")


def test_score_refuses_missing_provenance_on_either_side_unless_told(tiny_store, tmp_path, build_outputs, make):
    root = str(tiny_store.root)
    bare = save(create("energy").fit(tiny_store.read("tiny", "fit").subset(slice(0, 200))), tmp_path / "bare")
    base = ["score", "--detector", str(bare), "--store", root, "--dataset", "new", "--model", "tiny"]
    result = cli(*base)
    assert result.exit_code == 2 and "records no fit provenance" in result.output
    assert "--no-provenance-check" in result.output and len(result.output.strip().splitlines()) == 1
    allowed = cli(*base, "--no-provenance-check")
    assert allowed.exit_code == 0 and "warning: --no-provenance-check: the detector records no fit provenance" in (
        allowed.output
    )
    assert "(fit on unrecorded data)" in allowed.output
    # An entry without provenance, scored by a detector with it.
    tiny_store.write_outputs("tiny", "unknown", build_outputs(np.asarray(make(seed=5).test.features), tiny_store.read_head("tiny")),
                             provenance={}, item_hash="items-unknown")  # fmt: skip
    kept = save(create("energy").fit(tiny_store.read("tiny", "fit")), tmp_path / "kept")
    refused = cli("score", "--detector", str(kept), "--store", root, "--dataset", "unknown")
    assert refused.exit_code == 2 and "tiny/unknown records no provenance" in refused.output
    assert "--no-provenance-check" in refused.output
    assert (
        cli(
            "score", "--detector", str(kept), "--store", root, "--dataset", "unknown", "--no-provenance-check"
        ).exit_code
        == 0
    )
    # The override admits missing provenance, never provenance that disagrees.
    mismatch = cli(
        "score", "--detector", str(kept), "--store", root, "--dataset", "other-ckpt", "--no-provenance-check"
    )
    assert mismatch.exit_code == 2 and "provenance mismatch" in mismatch.output


def test_score_refuses_outputs_inside_its_inputs_and_writes_atomically(tiny_store, tmp_path, monkeypatch):
    root = tiny_store.root
    kept = save(create("energy").fit(tiny_store.read("tiny", "fit")), tmp_path / "kept")
    base = ["score", "--detector", str(kept), "--store", str(root), "--dataset", "new"]
    for out in (root / "scores", root / "tiny" / "new" / "scores", root, kept / "scores"):
        result = cli(*base, "--out", str(out))
        assert result.exit_code == 2 and "lies inside" in result.output, result.output
        assert not (out / "new.csv").exists() and not (root / "scores").exists()
    # A write that fails half-way (a full disk) leaves no file behind, not a truncated one.
    real_savetxt = np.savetxt

    def full_disk(path, *args, **kwargs):
        with open(path, "w") as handle:
            handle.write("item_index,sc")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savetxt", full_disk)
    out = tmp_path / "scored"
    result = cli(*base, "--out", str(out))
    assert result.exit_code == 2 and "No space left on device" in result.output, result.output
    assert sorted(p.name for p in out.iterdir()) == []
    monkeypatch.setattr(np, "savetxt", real_savetxt)
    assert cli(*base, "--out", str(out)).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["new.csv", "new.npy"]


@pytest.mark.parametrize("tpr", ["1.5", "nan", "0", "-0.1"])
def test_evaluate_refuses_a_bad_tpr_before_writing_anything(tiny_store, tmp_path, tpr):
    run = tmp_path / "run"
    result = cli("evaluate", "--store", str(tiny_store.root), "--model", "tiny", "--fit", "fit", "--id", "id",
                 "--ood", "ood", "-d", "energy", "--out", str(run), "--tpr", tpr, "--no-progress")  # fmt: skip
    assert result.exit_code == 2 and "--tpr" in result.output and "(0, 1]" in result.output, result.output
    assert not run.exists()


def test_evaluate_refuses_outputs_inside_the_store(tiny_store, tmp_path):
    root = tiny_store.root
    base = ["evaluate", "--store", str(root), "--model", "tiny", "--fit", "fit", "--id", "id", "--ood", "ood"]
    base += ["-d", "energy", "--no-progress"]
    for option, path in (
        ("--out", root / "run"),
        ("--out", root / "tiny" / "id" / "run"),
        ("--save-detectors", root / "kept"),
    ):
        extra = [] if option == "--out" else ["--out", str(tmp_path / "run")]
        result = cli(*base, *extra, option, str(path))
        assert result.exit_code == 2 and f"{option} {path} lies inside --store" in result.output, result.output
        assert not path.exists() and not (tmp_path / "run").exists()


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


def test_the_deprecated_method_still_saves_and_warns(tmp_path) -> None:
    """`Detector.save(dir)` keeps working for one release, through `detectors.save`, with a DeprecationWarning."""
    import oodbench.detectors as registry
    from oodbench.core.outputs import Outputs

    rng = np.random.default_rng(0)
    fit = Outputs(features=rng.normal(size=(40, 4)).astype(np.float32), labels=np.arange(40) % 2)
    detector = registry.create("knn", k=3).fit(fit)
    with pytest.warns(DeprecationWarning, match=r"oodbench\.detectors\.save"):
        detector.save(tmp_path / "old")
    reloaded = registry.load(tmp_path / "old")
    np.testing.assert_array_equal(reloaded.score(fit), detector.score(fit))


def test_an_ivf_knn_saved_without_its_centre_loads_and_probes_uncentred(problem, tmp_path):
    """`centre_` is optional state: a file that lacks it (lists built from uncentred rows) probes as it was built."""
    import hashlib

    from safetensors.numpy import load_file, save_file

    from oodbench.detectors.feature import _ivf_lists, ivf_kth_similarity, unit_float32

    detector = create("knn", k=5, index="ivf", nlist=4, nprobe=2).fit(problem.fit)
    path = save(detector, tmp_path / "ivf")
    meta = json.loads((path / "detector.json").read_text())
    assert meta["state"]["centre_"] is not None
    # As a file written before the detector declared it: neither the state entry nor its array.
    del meta["state"]["centre_"]
    arrays = load_file(str(path / "state.safetensors"))
    assert "centre_" in arrays
    save_file({k: v for k, v in arrays.items() if k != "centre_"}, str(path / "state.safetensors"))
    meta["arrays_sha256"] = hashlib.sha256((path / "state.safetensors").read_bytes()).hexdigest()
    (path / "detector.json").write_text(json.dumps(meta))
    loaded = load(path)
    assert loaded.centre_ is None
    queries = unit_float32(problem.test.features)  # as knn normalises them; probing with these very rows
    centroids, lists = _ivf_lists(loaded.index_)
    kth, _ = ivf_kth_similarity(queries, centroids, lists, 2, 5)
    np.testing.assert_array_equal(loaded.score(problem.test), -np.sqrt(np.maximum(2.0 - 2.0 * kth, 0.0)))
