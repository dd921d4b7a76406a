"""Linear probes on cached embeddings: accuracy on real digits, determinism, early stopping, store round trip, CLI."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from typer.testing import CliRunner

from oodbench import Outputs, Store
from oodbench.errors import ExtractError
from oodbench.extract.cli import register
from oodbench.extract.probe import ProbeConfig, fit_probe, run_probe, train_probe


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
        np.testing.assert_allclose(out.logits, head.logits(np.asarray(out.features)), rtol=1e-5, atol=1e-5)
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
