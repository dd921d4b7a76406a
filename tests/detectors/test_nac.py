"""NAC: bin edges, hand-computed coverage, autograd reference for the penultimate states, deeper-layer extras."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import create
from oodbench.detectors.nac import nac_bin_edges


def slow_edges(bins: int) -> list[float]:
    """The reference's edge list written out: log_1000 of an even grid on [1, sqrt 1000], mirrored, then 1.2."""
    half = bins // 2
    grid = [1.0 + i * (1000**0.5 - 1.0) / (half - 1) for i in range(half)]
    left = [np.log(g) / np.log(1000.0) for g in grid]
    edges = left[:-1] + [1.0 - v for v in reversed(left)]
    edges[-1] += 0.01
    return edges + [1.2]


def slow_states(features: np.ndarray, head, alpha: float) -> np.ndarray:
    """sigmoid(α · z ⊙ ∂L/∂z) with the gradient from autograd, L = cross-entropy to the uniform distribution."""
    z = torch.tensor(features, dtype=torch.float64, requires_grad=True)
    logits = z @ torch.tensor(head.weight, dtype=torch.float64).T + torch.tensor(head.bias, dtype=torch.float64)
    loss = -(torch.log_softmax(logits, dim=1)).mean(dim=1).sum()
    (gradient,) = torch.autograd.grad(loss, z)
    return torch.sigmoid(alpha * z * gradient).detach().numpy()


def slow_nac(fit_states: np.ndarray, test_states: np.ndarray, bins: int, r: int) -> np.ndarray:
    edges = slow_edges(bins)
    intervals = len(edges) - 1

    def interval(value: float) -> int | None:
        for j in range(intervals):
            if edges[j] <= value < edges[j + 1]:
                return j
        return None

    units = fit_states.shape[1]
    counts = np.zeros((intervals, units))
    for row in fit_states:
        for unit, value in enumerate(row):
            j = interval(value)
            if j is not None:
                counts[j, unit] += 1
    scores = []
    for row in test_states:
        covered = []
        for unit, value in enumerate(row):
            j = interval(value)
            covered.append(0.0 if j is None else min(counts[j, unit] / r, 1.0))
        scores.append(np.mean(covered))
    return np.array(scores)


def test_bin_edges():
    np.testing.assert_allclose(nac_bin_edges(4), [0.0, 0.5, 1.01, 1.2])
    for bins in (4, 10, 50):
        edges = nac_bin_edges(bins)
        assert edges.shape == (bins,)
        np.testing.assert_allclose(edges, slow_edges(bins), rtol=1e-12, atol=1e-15)
        assert np.all(np.diff(edges) > 0)
        # Inner edges are symmetric about 0.5 (the outer ones are 0, 1.01 and 1.2).
        inner = edges[1 : bins - 2]
        np.testing.assert_allclose(inner + inner[::-1], 1.0, atol=1e-12)
        assert edges[0] == 0.0 and edges[-2] == pytest.approx(1.01) and edges[-1] == 1.2


def test_coverage_hand_computed():
    # M = 4: intervals [0, .5), [.5, 1.01), [1.01, 1.2). Unit 0 fills [0, .5) twice and [.5, 1.01) once;
    # unit 1 fills [.5, 1.01) three times. With r = 2 the coverages are unit 0: [1, .5, 0], unit 1: [0, 1, 0].
    fit = Outputs(
        np.zeros((3, 1), dtype=np.float32), extras={"nac.block": np.array([[0.1, 0.9], [0.2, 0.8], [0.7, 0.6]])}
    )
    detector = create("nac", layers=("block",), bins=4, r=2, fit_rows=None).fit(fit)
    np.testing.assert_allclose(detector.coverage_["block"], [[1.0, 0.0], [0.5, 1.0], [0.0, 0.0]])
    test = Outputs(
        np.zeros((3, 1), dtype=np.float32), extras={"nac.block": np.array([[0.3, 0.3], [0.6, 0.6], [1.3, 0.6]])}
    )
    np.testing.assert_allclose(detector.score(test), [0.5, 0.75, 0.5])


def test_penultimate_states_match_autograd(problem):
    from oodbench.detectors.nac import penultimate_states

    features = np.asarray(problem.test.features, dtype=np.float64)
    ours = penultimate_states(features.astype(np.float32), problem.head.logits(features), problem.weight, alpha=50.0)
    # The product with W and the states are float32 (as the reference computes them).
    np.testing.assert_allclose(ours, slow_states(features, problem.head, 50.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alpha,bins,r", [(50.0, 50, 10), (5.0, 10, 3)])
def test_penultimate_nac_agrees_with_slow_reference(problem, agree, alpha, bins, r):
    fast = create("nac", alpha=alpha, bins=bins, r=r, fit_rows=None).fit(problem.fit, problem.head).score(problem.test)
    fit_states = slow_states(np.asarray(problem.fit.features, dtype=np.float64), problem.head, alpha)
    test_states = slow_states(np.asarray(problem.test.features, dtype=np.float64), problem.head, alpha)
    agree(fast, slow_nac(fit_states, test_states, bins, r), problem.n_id, rtol=1e-9)


def test_layers_average_and_fit_subset(problem, agree):
    rng = np.random.default_rng(1)
    deep_fit = 1.0 / (1.0 + np.exp(-rng.normal(size=(len(problem.fit), 6))))
    deep_test = 1.0 / (1.0 + np.exp(-1.5 * rng.normal(size=(len(problem.test), 6))))
    fit = Outputs(problem.fit.features, problem.fit.logits, problem.fit.labels, extras={"nac.layer3": deep_fit})
    test = Outputs(problem.test.features, problem.test.logits, extras={"nac.layer3": deep_test})
    params = dict(
        layers=("penultimate", "layer3"),
        alpha=50.0,
        bins={"penultimate": 50, "layer3": 10},
        r={"penultimate": 5, "layer3": 4},
        fit_rows=300,
        seed=7,
    )
    detector = create("nac", **params).fit(fit, problem.head)
    rows = np.sort(np.random.default_rng(7).choice(len(problem.fit), size=300, replace=False))
    fit_states = slow_states(np.asarray(problem.fit.features, dtype=np.float64)[rows], problem.head, 50.0)
    test_states = slow_states(np.asarray(problem.test.features, dtype=np.float64), problem.head, 50.0)
    slow = (slow_nac(fit_states, test_states, 50, 5) + slow_nac(deep_fit[rows], deep_test, 10, 4)) / 2
    agree(detector.score(test), slow, problem.n_id, rtol=1e-9)


def test_deeper_layers_need_their_extras(problem):
    with pytest.raises(DetectorError, match="extra.nac.layer3"):
        create("nac", layers=("penultimate", "layer3")).fit(problem.fit, problem.head)
    fit = Outputs(problem.fit.features, extras={"nac.layer3": np.full((len(problem.fit), 4), 0.5)})
    detector = create("nac", layers=("layer3",), fit_rows=None).fit(fit)
    with pytest.raises(DetectorError, match="extra.nac.layer3"):
        detector.score(problem.test)
    wrong_width = Outputs(problem.test.features, extras={"nac.layer3": np.full((len(problem.test), 5), 0.5)})
    with pytest.raises(DetectorError, match="5 units"):
        detector.score(wrong_width)


def test_penultimate_needs_head_and_logits(problem):
    with pytest.raises(DetectorError, match="head"):
        create("nac").fit(problem.fit)
    with pytest.raises(DetectorError, match="logits"):
        create("nac").fit(Outputs(problem.fit.features), problem.head)


@pytest.mark.parametrize(
    "params,match",
    [
        ({"layers": ()}, "layers"),
        ({"layers": "penultimate"}, "layers"),
        ({"layers": ("a", "a")}, "distinct"),
        ({"bins": 5}, "even"),
        ({"bins": 2}, "bins"),
        ({"r": 0}, "r must"),
        ({"alpha": -1.0}, "alpha"),
        ({"bins": {"other": 50}}, "per layer"),
        ({"fit_rows": 0}, "fit_rows"),
    ],
)
def test_bad_parameters(params, match):
    with pytest.raises(DetectorError, match=match):
        create("nac", **params)
