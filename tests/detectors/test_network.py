"""ODIN, RankFeat, GRAM and the Mahalanobis ensemble on stored arrays, against explicit float64 loops; and the
whole path (tiny network → arrays → detector) against pytorch-ood where it has the method."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import create, get_class
from oodbench.detectors.testing import check_detector

LAYERS = ("a", "b")


def _data(seed: int, rows: int, classes: int = 4, widths=(6, 9)) -> Outputs:
    """Logits, labels, and per-layer extras for every detector of the family (Gaussian, with class structure)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows)
    logits = rng.normal(size=(rows, classes)) + 3.0 * np.eye(classes)[labels]
    extras = {"odin": (logits / 1000.0 + 1e-4 * rng.normal(size=logits.shape)).astype(np.float32)}
    for layer, width in zip(LAYERS, widths, strict=True):
        centres = rng.normal(size=(classes, width)) * 2.0
        extras[f"gram.{layer}"] = (centres[labels] + rng.normal(size=(rows, width))).astype(np.float32)
        extras[f"mds.{layer}"] = (centres[labels] + rng.normal(size=(rows, width)) * rng.uniform(0.5, 2, width)).astype(
            np.float32
        )
        extras[f"rankfeat.{layer}"] = (logits + rng.normal(size=logits.shape)).astype(np.float32)
    return Outputs(rng.normal(size=(rows, 3)).astype(np.float32), logits.astype(np.float32), labels, extras=extras)


@pytest.fixture(scope="module")
def fit():
    return _data(0, 300)


@pytest.fixture(scope="module")
def test_set():
    data = _data(1, 80)
    # The last 40 rows shifted: more of their statistics leave the fit set's ranges.
    scale = np.where(np.arange(80) >= 40, 1.5, 1.0).astype(np.float32)[:, None]
    extras = {k: v * scale if k.startswith(("gram", "mds")) else v for k, v in data.extras.items()}
    return Outputs(data.features, data.logits, data.labels, extras=extras)


@pytest.mark.parametrize("name", ["odin", "rankfeat", "gram", "mds_ensemble"])
def test_check_detector_with_the_test_layers(name):
    params = {} if name == "odin" else {"layers": LAYERS}
    report = check_detector(get_class(name), params)
    assert report.ok, str(report)


# ----------------------------------------------------------------------------------------------- ODIN, RankFeat
def test_odin_is_the_max_softmax_of_the_stored_tempered_logits(fit, test_set):
    scores = create("odin").fit(fit).score(test_set)
    for row, tempered in enumerate(test_set.extras["odin"].astype(np.float64)):
        expected = max(math.exp(v) for v in tempered) / sum(math.exp(v) for v in tempered)
        assert scores[row] == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize("layers,temperature", [(("a",), 1.0), (LAYERS, 1.0), (LAYERS, 2.5)])
def test_rankfeat_is_the_energy_of_the_averaged_logits(fit, test_set, layers, temperature):
    scores = create("rankfeat", layers=layers, temperature=temperature).fit(fit).score(test_set)
    for row in range(len(test_set)):
        logits = [
            sum(float(test_set.extras[f"rankfeat.{layer}"][row, c]) for layer in layers) / len(layers)
            for c in range(test_set.num_classes)
        ]
        expected = temperature * math.log(sum(math.exp(v / temperature) for v in logits))
        assert scores[row] == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------------------------- GRAM
def _gram_reference(fit: Outputs, test: Outputs, layers, holdout: float, seed: int) -> np.ndarray:
    """The paper's procedure with loops: per predicted class min/max, deviations, normalised by a held-out mean."""
    rows = len(fit)
    held = sorted(np.random.default_rng(seed).choice(rows, size=max(1, round(holdout * rows)), replace=False))
    kept = [i for i in range(rows) if i not in set(held)]
    classes = fit.num_classes
    predicted = [int(np.argmax(fit.logits[i])) for i in range(rows)]

    def deviation(values, low, high):
        total = 0.0
        for v, lo, hi in zip(values, low, high, strict=True):
            if v < lo:
                total += (lo - v) / abs(lo + 1e-6)
            if v > hi:
                total += (v - hi) / abs(hi + 1e-6)
        return total

    bounds, expected = {}, {}
    for layer in layers:
        values = fit.extras[f"gram.{layer}"].astype(np.float64)
        width = values.shape[1]
        low = [[math.inf] * width for _ in range(classes)]
        high = [[-math.inf] * width for _ in range(classes)]
        for i in kept:
            for j in range(width):
                low[predicted[i]][j] = min(low[predicted[i]][j], values[i, j])
                high[predicted[i]][j] = max(high[predicted[i]][j], values[i, j])
        everyone_low = [min(values[i, j] for i in kept) for j in range(width)]
        everyone_high = [max(values[i, j] for i in kept) for j in range(width)]
        for c in range(classes):
            if low[c][0] == math.inf:  # a class no kept row is predicted as
                low[c], high[c] = everyone_low, everyone_high
        bounds[layer] = (low, high)
        mean = sum(deviation(values[i], low[predicted[i]], high[predicted[i]]) for i in held) / len(held)
        expected[layer] = mean if mean > 0 else 1.0
    scores = []
    for i in range(len(test)):
        c = int(np.argmax(test.logits[i]))
        total = 0.0
        for layer in layers:
            low, high = bounds[layer]
            total += deviation(test.extras[f"gram.{layer}"][i].astype(np.float64), low[c], high[c]) / expected[layer]
        scores.append(-total)
    return np.array(scores)


@pytest.mark.parametrize("holdout,seed", [(0.1, 0), (0.3, 5)])
def test_gram_matches_the_loops(fit, test_set, holdout, seed):
    detector = create("gram", layers=LAYERS, holdout=holdout, seed=seed).fit(fit)
    scores = detector.score(test_set)
    reference = _gram_reference(fit, test_set, LAYERS, holdout, seed)
    # Sums of a few dozen float64 terms in another order: relative error ≲ 50 · 2^-53 ≈ 6e-15.
    np.testing.assert_allclose(scores, reference, rtol=1e-12, atol=1e-12)
    assert scores[:40].mean() > scores[40:].mean()  # the shifted rows deviate more


def test_gram_fills_an_unpredicted_class_with_the_overall_range(fit):
    # Class 3 is never predicted in this fit set: its range is the range over all classes.
    logits = np.array(fit.logits)
    logits[:, 3] = -100.0
    tweaked = Outputs(fit.features, logits, fit.labels, extras=dict(fit.extras))
    detector = create("gram", layers=("a",), holdout=0.1).fit(tweaked)
    kept = np.ones(len(fit), dtype=bool)
    kept[np.sort(np.random.default_rng(0).choice(len(fit), size=30, replace=False))] = False
    values = fit.extras["gram.a"][kept].astype(np.float64)
    np.testing.assert_array_equal(detector.low_["a"][3], values.min(axis=0))
    np.testing.assert_array_equal(detector.high_["a"][3], values.max(axis=0))


# ----------------------------------------------------------------------------------------------- MDS ensemble
def _mds_reference(fit: Outputs, test: Outputs, layers, weights) -> np.ndarray:
    total = np.zeros(len(test))
    for layer, weight in zip(layers, weights, strict=True):
        z = fit.extras[f"mds.{layer}"].astype(np.float64)
        classes = sorted(set(fit.labels.tolist()))
        means = {c: z[fit.labels == c].mean(axis=0) for c in classes}
        scatter = sum(
            np.outer(z[i] - means[int(fit.labels[i])], z[i] - means[int(fit.labels[i])]) for i in range(len(z))
        )
        precision = np.linalg.pinv(scatter / len(z))
        x = test.extras[f"mds.{layer}"].astype(np.float64)
        for i in range(len(test)):
            total[i] -= weight * min((x[i] - means[c]) @ precision @ (x[i] - means[c]) for c in classes)
    return total


@pytest.mark.parametrize("weights", [None, (0.25, 2.0)])
def test_mds_ensemble_matches_the_loops(fit, test_set, weights):
    scores = create("mds_ensemble", layers=LAYERS, weights=weights).fit(fit).score(test_set)
    reference = _mds_reference(fit, test_set, LAYERS, weights or (1.0, 1.0))
    # Condition numbers of these covariances are below 1e2: float64 solves agree to ≲ 1e2 · 1e-16 · D.
    np.testing.assert_allclose(scores, reference, rtol=1e-9)


def test_mds_ensemble_of_one_layer_is_maha_on_that_layer(fit, test_set):
    ensemble = create("mds_ensemble", layers=("b",)).fit(fit).score(test_set)
    as_features = [
        Outputs(o.extras["mds.b"], None, o.labels if o is fit else None) for o in (fit, test_set)
    ]  # the same arrays as penultimate features
    maha = create("maha").fit(as_features[0]).score(as_features[1])
    np.testing.assert_allclose(ensemble, maha, rtol=1e-12)


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("rankfeat", {"layers": "layer4"}, "layers must be a sequence"),
        ("rankfeat", {"layers": ()}, "non-empty sequence of layer names"),
        ("mds_ensemble", {"layers": tuple(f"l{i}" for i in range(17))}, "at most 16 layers"),
        ("gram", {"layers": ("a", "a")}, "distinct non-empty names"),
        ("gram", {"layers": LAYERS, "holdout": 1.0}, "holdout must be a fraction"),
        ("mds_ensemble", {"layers": LAYERS, "weights": (1.0,)}, "1 weights for 2 layers"),
        ("mds_ensemble", {"layers": LAYERS, "weights": (1.0, math.nan)}, "finite numbers"),
    ],
)
def test_bad_parameters_are_refused(fit, name, params, message):
    with pytest.raises(DetectorError, match=message):
        create(name, **params).fit(fit)


def test_a_missing_layer_is_named(fit):
    with pytest.raises(DetectorError, match="extra.gram.layer4"):
        create("gram").fit(fit)


def test_arrays_no_set_has_are_one_reason_naming_the_setting_that_extracts_them():
    """No set holds any of a detector's arrays: one reason with the --net setting (its layers when not the default),
    which `net_setting` reads back; some held: which set lacks which array; other reasons are kept beside it."""
    from oodbench.detectors.network import net_setting

    plain = {"features", "logits", "labels"}
    tests = {"id": plain, "ood": plain}
    expected = {
        ("odin", ()): "odin",
        ("rankfeat", ()): "rankfeat",
        ("gram", ("layer3", "layer4")): "gram:layers=layer3+layer4",
        ("mds_ensemble", ()): "mds",
    }
    for (name, layers), setting in expected.items():
        detector = create(name, **({"layers": layers} if layers else {}))
        (reason,) = detector.unmet(plain, tests, has_head=True)
        assert reason == f"its arrays are not extracted (--net {setting})" and net_setting(reason) == setting
    held = create("gram", layers=LAYERS).unmet(plain | {"extra.gram.a", "extra.gram.b"}, tests, has_head=True)
    assert held == ["id lacks extra.gram.a, extra.gram.b", "ood lacks extra.gram.a, extra.gram.b"]
    unlabelled = create("mds_ensemble").unmet({"features"}, tests, has_head=True)
    assert unlabelled == ["its arrays are not extracted (--net mds)", "fit set lacks labels"]
    assert net_setting("; ".join(unlabelled)) is None and net_setting("fit set lacks labels") is None
    assert create("odin").unmet(plain, has_head=True) == []  # nothing to score: nothing lacking


# ----------------------------------------------------------------------------------------------- pytorch-ood
@pytest.fixture(scope="module")
def tiny_resnet():
    from oodbench.extract.backbones.timm_backbone import load_timm

    backbone = load_timm("test_resnet", pretrained=False, image_size=48, num_classes=5)
    torch.manual_seed(3)
    # 160 fit images: more than the 48 channels of layer2, so the class covariance is invertible for pytorch-ood.
    return backbone, torch.randn(160, *backbone.input_size()), torch.randn(16, *backbone.input_size())


@pytest.mark.parametrize("epsilon,temperature", [(0.0014, 1000.0), (0.05, 1.0)])
def test_odin_agrees_with_pytorch_ood(tiny_resnet, epsilon, temperature):
    detector_module = pytest.importorskip("pytorch_ood.detector")
    from oodbench.extract.posthoc_net import NetSpec, network_arrays

    backbone, _, pixels = tiny_resnet
    std = backbone.preprocessing["std"]
    spec = NetSpec.of("odin", epsilon=epsilon, temperature=temperature)
    stored = network_arrays(backbone.model, pixels, [spec], std=std)["extra.odin"]
    empty = np.zeros((len(pixels), 1))
    ours = create("odin").fit(Outputs(empty)).score(Outputs(empty, extras={"odin": stored}))
    odin = detector_module.ODIN(backbone.model, eps=epsilon, temperature=temperature, norm_std=list(std))
    theirs = -odin(pixels).numpy()
    # Both run the network in float32; the scores (≤ 1) agree to a few float32 ulps of 1 (measured: ≤ 2.6e-8),
    # far below the spread of the scores (6e-6 at T = 1000, 7e-3 at T = 1).
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=8 * 2**-24)
    assert np.ptp(ours) > 10 * 8 * 2**-24  # the agreement is informative: ten times finer than the spread


def test_rankfeat_agrees_with_pytorch_ood(tiny_resnet):
    detector_module = pytest.importorskip("pytorch_ood.detector")
    from oodbench.extract.posthoc_net import NetSpec, network_arrays

    backbone, _, pixels = tiny_resnet
    stored = network_arrays(backbone.model, pixels, [NetSpec.of("rankfeat")])["extra.rankfeat.layer4"]
    empty = np.zeros((len(pixels), 1))
    ours = create("rankfeat").fit(Outputs(empty)).score(Outputs(empty, extras={"rankfeat.layer4": stored}))
    model = backbone.model
    theirs = detector_module.RankFeat(backbone=model.forward_features, head=model.forward_head)(pixels).numpy()
    # pytorch-ood's outlier score is minus the energy; both float32 SVDs of the same maps (measured: 7e-8 relative).
    np.testing.assert_allclose(ours, -theirs, rtol=1e-6)


def test_mds_ensemble_agrees_with_pytorch_ood(tiny_resnet):
    detector_module = pytest.importorskip("pytorch_ood.detector")
    from oodbench.extract.posthoc_net import NetSpec, network_arrays

    backbone, fit_pixels, test_pixels = tiny_resnet
    # Layers whose class scatter is well conditioned (condition numbers 39 and 99 on these images): pytorch-ood
    # inverts it in float32 with a 1e-6 ridge, ours takes the float64 pseudo-inverse. (The random network's
    # layer2 output has a null direction, where an inverse and a pseudo-inverse differ by design.)
    layers = ("layer1", "layer2.0.conv1")
    spec = [NetSpec.of("mds", layers=layers)]
    fit_arrays = network_arrays(backbone.model, fit_pixels, spec)
    test_arrays = network_arrays(backbone.model, test_pixels, spec)
    labels = np.arange(len(fit_pixels)) % 5
    fit_set = Outputs(np.zeros((len(fit_pixels), 1)), labels=labels, extras={k[6:]: v for k, v in fit_arrays.items()})
    test = Outputs(np.zeros((len(test_pixels), 1)), extras={k[6:]: v for k, v in test_arrays.items()})
    ours = create("mds_ensemble", layers=layers).fit(fit_set).score(test)
    reference = detector_module.MultiMahalanobis([torch.nn.Identity()] * len(layers))
    reference.fit_structured(
        [torch.from_numpy(fit_arrays[f"extra.mds.{layer}"]) for layer in layers], torch.from_numpy(labels)
    )
    theirs = reference.predict_structured([torch.from_numpy(test_arrays[f"extra.mds.{layer}"]) for layer in layers])
    # pytorch-ood's covariance is the class scatter without dividing by N (plus 1e-6 I) and its score is half the
    # squared distance: its outlier score is −ours / (2N), up to its float32 inverse (relative error ≲ condition
    # number · D · 2^-24 ≈ 100 · 48 · 6e-8 ≈ 3e-4) and the ridge (1e-6 against a smallest eigenvalue ≈ 9e-3).
    np.testing.assert_allclose(theirs.double().numpy(), -ours / (2 * len(fit_pixels)), rtol=1e-3)
