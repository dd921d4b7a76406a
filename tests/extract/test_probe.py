"""Linear probes on cached embeddings: accuracy on real digits, determinism, early stopping, store round trip, CLI."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import typer
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from typer.testing import CliRunner

from oodbench import Outputs, Store
from oodbench.core.errors import ExtractError
from oodbench.extract.cli import register
from oodbench.extract.probe import ProbeConfig, fit_probe, run_probe, train_probe

from .. import reference


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data.target))
    features = data.data[order].astype(np.float32)
    labels = data.target[order].astype(np.int64)
    return features[:1400], labels[:1400], features[1400:], labels[1400:]


def test_probe_classifies_held_out_digits_like_sklearn(digits):
    x, y, x_test, y_test = digits
    result = fit_probe(x, y, seed=0)
    assert result.method == "lbfgs"
    assert result.train_rows + result.val_rows == 1400 and 120 <= result.val_rows <= 160
    predicted = result.head.logits(x_test).argmax(axis=1)
    accuracy = float((predicted == y_test).mean())
    assert accuracy > 0.93
    reference = LogisticRegression(max_iter=2000).fit(x / 16.0, y).predict(x_test / 16.0)
    assert float((predicted == reference).mean()) > 0.9
    # The stopping epoch is the one with the lowest held-out loss in the history.
    losses = [h["val_loss"] for h in result.history]
    assert result.best_epoch == int(np.argmin(losses)) + 1
    assert result.val_loss == pytest.approx(min(losses))


def test_probe_is_seeded(digits):
    x, y, _, _ = digits
    a, b = train_probe(x, y, seed=3), train_probe(x, y, seed=3)
    c = train_probe(x, y, seed=4)
    assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    assert not np.array_equal(a.weight, c.weight)


def test_minibatch_probe(digits):
    x, y, x_test, y_test = digits
    result = fit_probe(x, y, method="minibatch", batch_size=128, lr=0.05, max_epochs=40, patience=4)
    assert result.method == "minibatch"
    assert float((result.head.logits(x_test).argmax(1) == y_test).mean()) > 0.9


def test_separable_clusters_closed_form():
    rng = np.random.default_rng(1)
    centres = np.array([[5.0, 0.0], [-5.0, 0.0], [0.0, 5.0]])
    labels = np.repeat(np.arange(3), 40)
    features = (centres[labels] + rng.normal(scale=0.5, size=(120, 2))).astype(np.float32)
    head = train_probe(features, labels, num_classes=4)  # an unused fourth class is allowed
    assert head.weight.shape == (4, 2)
    assert (head.logits(centres).argmax(axis=1) == np.arange(3)).all()


def test_probe_input_errors(digits):
    x, y, _, _ = digits
    with pytest.raises(ExtractError, match="val_fraction"):
        ProbeConfig(val_fraction=1.5)
    with pytest.raises(ExtractError, match="non-negative"):
        train_probe(x, -np.ones_like(y))
    with pytest.raises(ExtractError, match="two or more"):
        train_probe(x[:3], np.array([0, 1, 2]))


def _frozen_store(tmp_path, digits):
    x, y, x_test, y_test = digits
    store = Store(tmp_path / "store")
    prov = {
        "model": "vit_small_patch14_dinov2.lvd142m",
        "checkpoint": "pretrained:timm/x",
        "preprocessing": {"size": 8},
        "kind": "timm",
    }
    store.write_outputs("dino", "fit", Outputs(x, labels=y), provenance=prov, shard_size=500)
    store.write_outputs("dino", "test", Outputs(x_test, labels=y_test), provenance=prov)
    store.write_outputs("dino", "ood", Outputs(x_test[:50] * 0.5 + 3), provenance=prov)
    return store


def test_run_probe_writes_head_and_logits(tmp_path, digits):
    store = _frozen_store(tmp_path, digits)
    report = run_probe(store, "dino", "fit", apply_to=["test", "ood"], shard_size=300)
    assert report.trained and report.probe_id == "dino+probe" and report.datasets == ["fit", "test", "ood"]
    head = store.read_head("dino+probe")
    for dataset in ("fit", "test", "ood"):
        out = store.read("dino+probe", dataset)
        source = store.read("dino", dataset)
        np.testing.assert_array_equal(out.features, source.features)
        reference.assert_float32_logits_of_head(out.logits, np.asarray(out.features), head)
        assert (out.labels is None) == (source.labels is None)
        assert np.array_equal(
            store.read_array("dino+probe", dataset, "index"), store.read_array("dino", dataset, "index")
        )
    prov = store.meta("dino+probe", "test")["provenance"]
    assert prov["kind"] == "probe" and prov["backbone"]["model"] == "vit_small_patch14_dinov2.lvd142m"
    assert prov["probe"]["fit_dataset"] == "fit" and prov["checkpoint"].startswith("pretrained:timm/x+probe:")
    store.check_compatible(("dino+probe", "fit"), ("dino+probe", "test"), ("dino+probe", "ood"))
    accuracy = float((store.read("dino+probe", "test").logits.argmax(1) == digits[3]).mean())
    assert accuracy > 0.93
    again = run_probe(store, "dino", "fit", apply_to=["test"])
    assert not again.trained
    with pytest.raises(ExtractError, match="trained differently"):
        run_probe(store, "dino", "fit", config=ProbeConfig(seed=9))
    with pytest.raises(ExtractError, match="no labels"):
        run_probe(store, "dino", "ood", probe_id="other")


def test_probe_cli(tmp_path, digits):
    store = _frozen_store(tmp_path, digits)
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(
        app,
        [
            "probe",
            "--store",
            str(store.root),
            "--model-id",
            "dino",
            "--fit-dataset",
            "fit",
            "--apply-to",
            "ood",
            "--probe-id",
            "dino-lin",
            "--max-epochs",
            "30",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "probe trained (lbfgs)" in result.output
    assert store.exists("dino-lin", "ood") and store.has_head("dino-lin")
    assert "Example" in CliRunner().invoke(app, ["probe", "--help"]).output


def _gaussian_classes(n: int, seed: int, classes: int = 10, dim: int = 32):
    """Overlapping Gaussian classes (test accuracy well below 1, so a probe that stops early is visible)."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(123).normal(scale=0.45, size=(classes, dim))
    labels = rng.integers(0, classes, n)
    return (means[labels] + rng.normal(size=(n, dim))).astype(np.float32), labels.astype(np.int64)


def test_probe_beyond_the_memory_budget_converges_like_scikit_learn(monkeypatch):
    """The path taken when the training features exceed the in-memory budget (forced here by a zero budget) must
    reach scikit-learn's best-C accuracy. Tolerance: the two classifiers' accuracies differ by the share of test rows
    on which exactly one is right; with d the disagreement rate, that difference has standard deviation <= sqrt(d/n),
    and we allow 3 of them (plus one row)."""
    import oodbench.extract.probe as probe

    monkeypatch.setattr(probe, "FULL_BATCH_BYTES", 0)
    x, y = _gaussian_classes(6000, seed=0)
    x_test, y_test = _gaussian_classes(3000, seed=1)
    result = fit_probe(x, y)
    ours = result.head.logits(x_test).argmax(1)
    best = None
    for c in (0.001, 0.01, 0.1, 1.0):
        predicted = LogisticRegression(C=c, max_iter=3000).fit(x, y).predict(x_test)
        accuracy = float((predicted == y_test).mean())
        if best is None or accuracy > best[0]:
            best = (accuracy, predicted)
    reference_accuracy, reference = best
    disagreement = float((ours != reference).mean())
    bound = 3 * np.sqrt(max(disagreement, 1 / len(y_test)) / len(y_test)) + 1 / len(y_test)
    assert abs(float((ours == y_test).mean()) - reference_accuracy) <= bound, (ours == y_test).mean()
    assert result.method != "lbfgs" and not result.stopped_at_cap


def test_streamed_lbfgs_is_the_in_memory_optimiser(digits):
    x, y, _, _ = digits
    in_memory = fit_probe(x, y, method="lbfgs", weight_decay=1e-3)
    streamed = fit_probe(x, y, method="streamed", weight_decay=1e-3, chunk_rows=97)
    assert streamed.method == "streamed"
    # Same objective, gradients summed over chunks in another order: float32 rounding only, on a converged problem.
    # float32 L-BFGS stops where its gradient is lost in rounding, ~1e-7 of the gradient's terms; the weight decay
    # λ = 1e-3 bounds the curvature below, so the minimisers differ by ≲ 1e-7/λ = 1e-4 of the weights' scale (1e-3
    # is 10× that), and the validation loss, first-order in the weights, by as much relatively.
    scale = float(np.abs(in_memory.head.weight).max())
    np.testing.assert_allclose(streamed.head.weight, in_memory.head.weight, atol=1e-3 * scale)
    assert streamed.val_loss == pytest.approx(in_memory.val_loss, rel=1e-3)


def test_weight_decay_is_chosen_on_the_held_out_rows(digits):
    x, y, _, _ = digits
    result = fit_probe(x[:300], y[:300], weight_decays=(1e-1, 1e-3, 1e-6))
    assert [row["weight_decay"] for row in result.search] == [1e-1, 1e-3, 1e-6]
    losses = {row["weight_decay"]: row["val_loss"] for row in result.search}
    assert result.weight_decay == min(losses, key=losses.get)
    assert result.val_loss == pytest.approx(min(losses.values()))
    fixed = fit_probe(x[:300], y[:300], weight_decay=1e-6)
    assert fixed.weight_decay == 1e-6 and len(fixed.search) == 1


def test_epoch_cap_on_an_improving_run_warns(digits):
    from oodbench.extract.probe import ProbeCapWarning

    x, y, _, _ = digits
    with pytest.warns(ProbeCapWarning, match="max_epochs=2"):
        result = fit_probe(x, y, method="minibatch", batch_size=256, lr=1e-3, max_epochs=2, weight_decay=1e-4)
    assert result.stopped_at_cap and result.best_epoch == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProbeCapWarning)
        assert not fit_probe(x, y, weight_decay=1e-3).stopped_at_cap


def test_single_class_fit_set_is_refused(digits):
    x, _, _, _ = digits
    with pytest.raises(ExtractError, match="single class"):
        fit_probe(x[:50], np.full(50, 3))


def _probe_ids(store: Store) -> list[str]:
    return [m for m in store.models() if "probe" in m]


def test_apply_to_entries_are_checked_before_training(tmp_path, digits):
    store = _frozen_store(tmp_path, digits)
    x_test = digits[2]
    prov = store.meta("dino", "test")["provenance"]
    bad = x_test[:40].copy()
    bad[7, 3] = np.nan
    store.write_outputs("dino", "nan", Outputs(bad, check_finite=False), provenance=prov)
    store.write_outputs("dino", "narrow", Outputs(x_test[:40, :32]), provenance=prov)
    with pytest.raises(ExtractError, match="no store entry dino/tset"):
        run_probe(store, "dino", "fit", apply_to=["test", "tset"], config=ProbeConfig(weight_decay=1e-3))
    with pytest.raises(ExtractError, match=r"dino/nan: features contain NaN or inf \(first at row 7\)"):
        run_probe(store, "dino", "fit", apply_to=["test", "nan"], config=ProbeConfig(weight_decay=1e-3))
    with pytest.raises(ExtractError, match=r"dino/narrow: features have shape \(40, 32\); the probe reads 64"):
        run_probe(store, "dino", "fit", apply_to=["narrow"], config=ProbeConfig(weight_decay=1e-3))
    # Nothing was trained or written: no head, no entry (complete or not) under the probe id.
    assert not store.has_head("dino+probe") and not (store.root / "dino+probe").exists()
