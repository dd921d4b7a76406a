"""tempscale, entropy, gradnorm, ash_p, ash_b, residual, she, openmax, relation: slow float64 references (loops over
rows, autograd, independent root finders), closed forms, identities and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.special import xlogy

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create

from .conftest import outputs_of


def _energy(logits: np.ndarray) -> float:
    peak = float(np.max(logits))
    return peak + math.log(float(np.exp(logits - peak).sum()))


def _softmax(row: np.ndarray) -> np.ndarray:
    shifted = np.exp(row - row.max())
    return shifted / shifted.sum()


def well_classified(
    seed: int = 1, num_classes: int = 4, dim: int = 10, rows: int = 300
) -> tuple[Outputs, Head, Outputs]:
    """Gaussian classes with a nearest-mean head (W = μ_c, b = −‖μ_c‖²/2): most rows are classified correctly."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim)) * 2.0 + 1.0
    head = Head(centres.astype(np.float32), (-0.5 * (centres**2).sum(axis=1)).astype(np.float32))
    labels = rng.integers(0, num_classes, rows)
    fit = outputs_of(np.maximum(centres[labels] + rng.normal(size=(rows, dim)), 0.0), head, labels.astype(np.int64))
    test_labels = rng.integers(0, num_classes, 200)
    shifted = (centres[test_labels] + centres[(test_labels + 1) % num_classes]) / 2
    test_centres = np.where(np.arange(200)[:, None] < 100, centres[test_labels], shifted)
    test = outputs_of(np.maximum(test_centres + rng.normal(size=(200, dim)), 0.0), head)
    return fit, head, test


# ----------------------------------------------------------------------------- tempscale
def _nll_slope(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """d NLL / d(1/T), row by row in float64."""
    total = 0.0
    for row, label in zip(logits.astype(np.float64), labels, strict=True):
        p = _softmax(row / temperature)
        total += float(p @ row) - float(row[label])
    return total / len(labels)


def test_tempscale_finds_the_nll_minimiser(problem):
    detector = create("tempscale").fit(problem.fit)
    logits, labels = problem.fit.logits, problem.fit.labels
    beta = brentq(lambda b: _nll_slope(logits, labels, 1.0 / b), 1e-3, 1e3, xtol=1e-15, rtol=1e-15)
    # Both solve NLL'(β) = 0 to float64 precision; the root's condition (NLL'' ~ 0.1-1 here) keeps them ~1e-12 apart.
    assert detector.temperature_ == pytest.approx(1.0 / beta, rel=1e-10)

    def nll(temperature: float) -> float:
        return float(
            np.mean(
                [
                    _energy(r / temperature) - r[y] / temperature
                    for r, y in zip(logits.astype(float), labels, strict=True)
                ]
            )
        )

    t = detector.temperature_
    assert nll(t) <= min(nll(t * 1.001), nll(t / 1.001))
    expected = np.array([_softmax(r / t).max() for r in problem.test.logits.astype(np.float64)])
    np.testing.assert_allclose(detector.score(problem.test), expected, rtol=1e-13)


def test_tempscale_refuses_data_without_a_finite_optimum():
    logits = np.array([[3.0, 0.0], [0.0, 2.0], [4.0, 1.0]], dtype=np.float32)
    with pytest.raises(DetectorError, match="classified correctly"):
        create("tempscale").fit(Outputs(np.zeros((3, 1)), logits, np.array([0, 1, 0])))
    with pytest.raises(DetectorError, match="no better than a uniform guess"):
        create("tempscale").fit(Outputs(np.zeros((3, 1)), logits, np.array([1, 0, 1])))
    with pytest.raises(DetectorError, match=r"class indices in \[0, 2\)"):
        create("tempscale").fit(Outputs(np.zeros((3, 1)), logits, np.array([0, 1, 2])))


# ----------------------------------------------------------------------------- entropy
def test_entropy_matches_xlogy(problem):
    scores = create("entropy").fit(problem.fit).score(problem.test)
    expected = [float(xlogy(p, p).sum()) for p in (_softmax(r) for r in problem.test.logits.astype(np.float64))]
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-15)


def test_entropy_keeps_its_relative_precision_on_confident_rows():
    gaps = np.array([0.0, 5.0, 30.0, 60.0])
    logits = np.stack([np.zeros_like(gaps), gaps], axis=1)
    scores = create("entropy").fit(Outputs(np.zeros((1, 1)), logits[:1])).score(Outputs(np.zeros((4, 1)), logits))
    # Two classes with gap g: p = 1 / (1 + e^-g) and H = log(1 + e^-g) + g e^-g / (1 + e^-g).
    expected = -(np.log1p(np.exp(-gaps)) + gaps * np.exp(-gaps) / (1 + np.exp(-gaps)))
    np.testing.assert_allclose(scores, expected, rtol=1e-13)


# ----------------------------------------------------------------------------- gradnorm
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_gradnorm_equals_the_autograd_gradient_of_the_kl_to_uniform(problem, temperature):
    scores = create("gradnorm", temperature=temperature).fit(problem.fit).score(problem.test)
    layer = torch.nn.Linear(problem.weight.shape[1], problem.weight.shape[0]).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(problem.weight))
        layer.bias.copy_(torch.from_numpy(problem.bias))
    expected = []
    for z in problem.test.features.astype(np.float64):
        layer.zero_grad()
        log_p = torch.log_softmax(layer(torch.from_numpy(z)[None]) / temperature, dim=1)
        num_classes = log_p.shape[1]
        kl = (1.0 / num_classes) * (math.log(1.0 / num_classes) - log_p).sum()
        kl.backward()
        expected.append(float(layer.weight.grad.abs().sum()))
    # The test logits are the float32 head applied to float32 features: 1e-6 from the float64 product autograd uses.
    np.testing.assert_allclose(scores, expected, rtol=2e-6)


def test_gradnorm_closed_form_on_exact_logits():
    z = np.array([[1.0, -2.0, 0.5]])
    logits = np.array([[2.0, 0.0, -1.0, 0.0]])
    score = create("gradnorm").fit(Outputs(z, logits)).score(Outputs(z, logits))[0]
    p = _softmax(logits[0])
    assert score == pytest.approx(np.abs(p - 0.25).sum() * 3.5, rel=1e-15)


# ----------------------------------------------------------------------------- ash_p, ash_b
def _slow_ash(problem, percentile: float, variant: str) -> np.ndarray:
    scores = []
    for z in problem.test.features.astype(np.float64):
        kept = len(z) - int(np.round(len(z) * percentile / 100.0))
        order = sorted(range(len(z)), key=lambda i: (-z[i], i))[:kept]  # ties: lowest position first
        shaped = np.zeros_like(z)
        for i in order:
            shaped[i] = z[i] if variant == "p" else z.sum() / kept
        scores.append(_energy(problem.weight @ shaped + problem.bias))
    return np.array(scores)


@pytest.mark.parametrize("variant,percentile", [("p", 60.0), ("p", 85.0), ("b", 65.0), ("b", 90.0)])
def test_ash_variants_agree_with_slow_reference(problem, agree, variant, percentile):
    fast = create(f"ash_{variant}", percentile=percentile).fit(problem.fit, problem.head).score(problem.test)
    agree(fast, _slow_ash(problem, percentile, variant), problem.n_id, rtol=1e-5)  # head products in float32


def test_ash_b_keeps_exactly_k_entries_when_zeros_tie():
    weight = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    head = Head(weight.astype(np.float32), np.zeros(4, dtype=np.float32))
    z = np.array([[3.0, 0.0, 0.0, 0.0]], dtype=np.float32)  # keep 2 of 4: the 3 and the first zero
    detector = create("ash_b", percentile=50).fit(Outputs(z, head.logits(z)), head)
    score = detector.score(Outputs(z, head.logits(z)))[0]
    assert score == pytest.approx(_energy(np.array([1.5, 1.5, 0.0, 0.0])), rel=1e-12)


# ----------------------------------------------------------------------------- residual
def test_residual_matches_a_pinv_and_eig_reference(problem):
    detector = create("residual", dim=5).fit(problem.fit, problem.head)
    origin = -np.linalg.pinv(problem.weight) @ problem.bias
    centred = problem.fit.features.astype(np.float64) - origin
    values, vectors = np.linalg.eig(centred.T @ centred / len(centred))
    basis = vectors[:, np.argsort(-values.real)[5:]].real
    expected = -np.linalg.norm((problem.test.features.astype(np.float64) - origin) @ basis, axis=1)
    # Two float64 eigensolvers agree on the residual subspace to about ε·λ₁/(λ₅ − λ₆) (Davis-Kahan); on this problem
    # λ₁ = 27.7 and the gap is 0.040: 1.5e-13. rtol 1e-9 leaves a wide margin; a wrong subspace is off by O(1).
    np.testing.assert_allclose(detector.score(problem.test), expected, rtol=1e-9)


def test_residual_is_vims_feature_term(problem):
    vim = create("vim", dim=5).fit(problem.fit, problem.head)
    residual = create("residual", dim=5).fit(problem.fit, problem.head)
    energy = create("energy").fit(problem.fit).score(problem.test)
    np.testing.assert_allclose(vim.score(problem.test), energy + vim.alpha_ * residual.score(problem.test), rtol=1e-12)


# ----------------------------------------------------------------------------- she
def test_she_matches_class_patterns_by_loops():
    fit, head, test = well_classified()
    detector = create("she").fit(fit, head)
    patterns = {}
    for z, f, y in zip(fit.features.astype(np.float64), fit.logits, fit.labels, strict=True):
        if int(np.argmax(f)) == y:
            patterns.setdefault(int(y), []).append(z)
    assert not detector.fallback_classes_.any()
    expected = [
        float(z @ np.mean(patterns[int(np.argmax(f))], axis=0))
        for z, f in zip(test.features.astype(np.float64), test.logits, strict=True)
    ]
    np.testing.assert_allclose(detector.score(test), expected, rtol=1e-12)


def test_she_falls_back_to_all_rows_of_a_class_never_classified_correctly():
    head = Head(np.eye(2, dtype=np.float32), np.zeros(2, dtype=np.float32))
    z = np.array([[2.0, 1.0], [3.0, 0.0], [4.0, 1.0]], dtype=np.float32)  # all predicted 0; row 2 labelled 1
    detector = create("she").fit(Outputs(z, head.logits(z), np.array([0, 0, 1])), head)
    np.testing.assert_array_equal(detector.fallback_classes_, [False, True])
    np.testing.assert_allclose(detector.patterns_, [[2.5, 0.5], [4.0, 1.0]])
    three = Head(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], dtype=np.float32), np.zeros(3, dtype=np.float32))
    with pytest.raises(DetectorError, match="1 classes \\(2\\) have no fit row"):
        create("she").fit(Outputs(z, three.logits(z), np.array([0, 0, 1])), three)


# ----------------------------------------------------------------------------- openmax
def _weibull_mle(data: np.ndarray) -> tuple[float, float]:
    """Shape and scale of the two-parameter Weibull MLE: bisection on the profile equation in the shape."""
    logs = np.log(data)

    def equation(k: float) -> float:
        weights = np.exp(k * (logs - logs.max()))
        return float((weights * logs).sum() / weights.sum() - 1.0 / k - logs.mean())

    low, high = 1e-3, 1.0
    while equation(high) < 0:
        high *= 2
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if equation(middle) < 0 else (low, middle)
    k = 0.5 * (low + high)
    return k, float(data.max() * np.mean((data / data.max()) ** k) ** (1.0 / k))  # (mean x^k)^(1/k)


def _slow_openmax(fit: Outputs, test: Outputs, tail: int, alpha: int, eu: float, cos: float) -> np.ndarray:
    logits, labels = fit.logits.astype(np.float64), fit.labels
    num_classes = logits.shape[1]

    def distance(v, m):
        cosine = 1.0 - float(v @ m) / math.sqrt(float(v @ v) * float(m @ m))
        return eu * math.sqrt(float((v - m) @ (v - m))) + cos * cosine

    models = []
    for c in range(num_classes):
        rows = [r for r, y in zip(logits, labels, strict=True) if y == c and int(np.argmax(r)) == c]
        mean = np.mean(rows, axis=0)
        tail_values = sorted(distance(r, mean) for r in rows)[-tail:]
        shift = 10000.0 - min(tail_values)
        models.append((mean, shift, *_weibull_mle(np.array(tail_values) + shift)))
    alpha = min(alpha, num_classes)
    scores = []
    for row in test.logits.astype(np.float64):
        ranked = sorted(range(num_classes), key=lambda c: (-row[c], c))[:alpha]
        revised, unknown = list(row), 0.0
        for rank, c in enumerate(ranked, start=1):
            mean, shift, k, scale = models[c]
            w = (1.0 - math.exp(-(((distance(row, mean) + shift) / scale) ** k))) * (alpha + 1 - rank) / alpha
            revised[c] = row[c] * (1.0 - w)
            unknown += row[c] * w
        everything = np.array([unknown, *revised])
        log_unknown = unknown - _energy(everything)
        # log(1 - P_unknown), with its relative precision where P_unknown is tiny and where it is close to 1
        exact = (
            math.log1p(-math.exp(log_unknown))
            if log_unknown < -0.7
            else _energy(np.array(revised)) - _energy(everything)
        )
        scores.append(exact)
    return np.array(scores)


@pytest.mark.parametrize(
    "params", [{}, {"euclidean": 1.0, "cosine": 0.0, "tail": 25}, {"alpha": 2, "tail": 10, "euclidean": 0.3}]
)
def test_openmax_matches_a_slow_reference(params):
    fit, head, test = well_classified()
    detector = create("openmax", **params).fit(fit, head)
    full = {"tail": 20, "alpha": 10, "euclidean": 1 / 200, "cosine": 1.0, **params}
    expected = _slow_openmax(fit, test, full["tail"], full["alpha"], full["euclidean"], full["cosine"])
    # Both Weibull fits solve the likelihood equation to float64 precision in the shape (k ~ 1e4-1e5 after libMR's
    # shift); the exponent k·log(x/λ) then carries a relative error ~1e-11, and the scores (differences of
    # log-sum-exps of magnitude ~10, or log1p of a tiny P_unknown) ~1e-11 relative: rtol 1e-7 leaves a wide margin.
    np.testing.assert_allclose(detector.score(test), expected, rtol=1e-7)


def test_openmax_weibull_fits_are_at_least_as_likely_as_scipys():
    from scipy.stats import weibull_min

    from oodbench.detectors.patterns import _weibull_fits

    rng = np.random.default_rng(5)
    tails = np.sort(np.abs(rng.normal(3.0, rng.uniform(0.01, 2.0, (6, 1)), (6, 20))), axis=1)
    counts = np.array([20, 20, 20, 20, 7, 2])
    shapes, scales = _weibull_fits(tails, counts)
    for c in range(6):
        tail = tails[c, : counts[c]]
        shifted = tail + 10000.0 - tail.min()
        k, _, scale = weibull_min.fit(shifted, floc=0.0)
        ours = weibull_min.logpdf(shifted, shapes[c], scale=scales[c]).sum()
        # The MLE: no other (shape, scale) is more likely, scipy's included (up to the rounding of the sums, 1e-10).
        assert ours >= weibull_min.logpdf(shifted, k, scale=scale).sum() - 1e-10
        assert shapes[c] == pytest.approx(_weibull_mle(shifted)[0], rel=1e-9)


def test_openmax_refuses_a_class_without_a_tail():
    head = Head(np.eye(2, dtype=np.float32), np.zeros(2, dtype=np.float32))
    z = np.array([[2.0, 1.0], [3.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    with pytest.raises(DetectorError, match="class 1 has 1 fit rows"):
        create("openmax").fit(Outputs(z, head.logits(z), np.array([0, 0, 1])), head)


# ----------------------------------------------------------------------------- relation
def _slow_relation(fit: Outputs, test: Outputs, power: float, threshold: float, hop: int) -> np.ndarray:
    bank = []
    for z, f in list(zip(fit.features.astype(np.float64), fit.logits.astype(np.float64), strict=True))[::hop]:
        bank.append((np.float32(z / np.linalg.norm(z)).astype(np.float64), np.float32(_softmax(f)).astype(float)))
    scores = []
    for z, f in zip(test.features.astype(np.float64), test.logits.astype(np.float64), strict=True):
        unit, p = z / np.linalg.norm(z), _softmax(f)
        total = 0.0
        for bank_unit, bank_p in bank:
            edge = max(float(unit @ bank_unit), 0.0) * float(p @ bank_p)
            if edge > threshold:
                total += edge**power
        scores.append(total)
    return np.array(scores)


@pytest.mark.parametrize("params", [{}, {"power": 2.0, "threshold": 0.1, "hop": 3}])
def test_relation_matches_a_loop_over_pairs(params, monkeypatch):
    fit, head, test = well_classified()
    from oodbench.detectors.patterns import Relation

    monkeypatch.setattr(Relation, "bank_tile", 37)  # several bank tiles, one of them partial
    detector = create("relation", **params).fit(fit, head)
    full = {"power": 1.0, "threshold": 0.03, "hop": 1, **params}
    expected = _slow_relation(fit, test, full["power"], full["threshold"], full["hop"])
    assert detector.bank_features_.shape[0] == len(range(0, len(fit), full["hop"]))
    # Float64 products of the same float32 bank: only summation order differs (~1e-15 relative per edge).
    np.testing.assert_allclose(detector.score(test), expected, rtol=1e-11)
