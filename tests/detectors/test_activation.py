"""ReAct, ASH-S, SCALE, DICE: hand-computed cases, slow per-sample references, invariances, requirements."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create


def _energy(logits: np.ndarray) -> float:
    peak = logits.max()
    return float(peak + math.log(np.exp(logits - peak).sum()))


def _identity_head(dim: int) -> Head:
    return Head(np.eye(dim, dtype=np.float32), np.zeros(dim, dtype=np.float32))


def _with_logits(features, head: Head) -> Outputs:
    features = np.asarray(features, dtype=np.float32)
    return Outputs(features, head.logits(features).astype(np.float32))


# ----------------------------------------------------------------------------- slow references
def slow_react(problem, percentile):
    threshold = np.percentile(np.asarray(problem.fit.features, dtype=np.float64).ravel(), percentile)
    scores = []
    for z in np.asarray(problem.test.features, dtype=np.float64):
        clipped = np.array([min(value, threshold) for value in z])
        scores.append(_energy(problem.weight @ clipped + problem.bias))
    return np.array(scores)


def slow_ash_s(problem, percentile):
    scores = []
    for z in np.asarray(problem.test.features, dtype=np.float64):
        kept = len(z) - int(np.round(len(z) * percentile / 100.0))
        order = sorted(range(len(z)), key=lambda i: -z[i])[:kept]
        pruned = np.zeros_like(z)
        for i in order:
            pruned[i] = z[i]
        shaped = pruned * math.exp(z.sum() / pruned.sum())
        scores.append(_energy(problem.weight @ shaped + problem.bias))
    return np.array(scores)


def slow_scale(problem, percentile):
    scores = []
    for z in np.asarray(problem.test.features, dtype=np.float64):
        kept = len(z) - int(np.round(len(z) * percentile / 100.0))
        top_sum = sum(sorted(z, reverse=True)[:kept])
        scaled = z * math.exp(z.sum() / top_sum)  # the whole vector, from the features (not the logits)
        scores.append(_energy(problem.weight @ scaled + problem.bias))
    return np.array(scores)


def slow_dice(problem, p):
    mean = np.asarray(problem.fit.features, dtype=np.float64).mean(axis=0)
    contribution = mean[None, :] * problem.weight
    threshold = np.percentile(contribution, p)
    scores = []
    for z in np.asarray(problem.test.features, dtype=np.float64):
        logits = [
            sum(z[d] * problem.weight[c, d] for d in range(len(z)) if contribution[c, d] > threshold) + problem.bias[c]
            for c in range(problem.weight.shape[0])
        ]
        scores.append(_energy(np.array(logits)))
    return np.array(scores)


# ----------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("percentile", [90.0, 70.0])
def test_react_agrees_with_slow_reference(problem, agree, percentile):
    fast = create("react", percentile=percentile).fit(problem.fit, problem.head).score(problem.test)
    agree(fast, slow_react(problem, percentile), problem.n_id, rtol=1e-5)  # head products run in float32


@pytest.mark.parametrize("percentile", [90.0, 65.0])
def test_ash_s_agrees_with_slow_reference(problem, agree, percentile):
    fast = create("ash_s", percentile=percentile).fit(problem.fit, problem.head).score(problem.test)
    # float32 head products over D = 12 (test problem): each logit within (D + 2)·eps32/2·Σ|w·z| ≈ 1e-6 of Σ|w·z|,
    # which is below 10·max|energy| here: rtol (and atol = rtol·max|score|) 1e-5.
    agree(fast, slow_ash_s(problem, percentile), problem.n_id, rtol=1e-5)


@pytest.mark.parametrize("percentile", [85.0, 60.0])
def test_scale_agrees_with_slow_reference(problem, agree, percentile):
    fast = create("scale", percentile=percentile).fit(problem.fit, problem.head).score(problem.test)
    agree(fast, slow_scale(problem, percentile), problem.n_id, rtol=1e-5)  # float32 logits vs float64 features


@pytest.mark.parametrize("p", [90.0, 50.0])
def test_dice_agrees_with_slow_reference(problem, agree, p):
    fast = create("dice", p=p).fit(problem.fit, problem.head).score(problem.test)
    agree(fast, slow_dice(problem, p), problem.n_id, rtol=1e-5)  # float32 head products: as ASH-S above


# ----------------------------------------------------------------------------- hand-computed cases
def test_react_hand_computed():
    head = _identity_head(2)
    fit = _with_logits([[0.0, 1.0], [2.0, 3.0]], head)  # activations 0, 1, 2, 3: the 50th percentile is 1.5
    detector = create("react", percentile=50).fit(fit, head)
    assert detector.threshold_ == pytest.approx(1.5)
    score = detector.score(_with_logits([[3.0, 0.0]], head))[0]
    assert score == pytest.approx(math.log(math.exp(1.5) + 1.0))


def test_ash_s_hand_computed():
    head = _identity_head(4)
    detector = create("ash_s", percentile=50).fit(_with_logits(np.ones((1, 4)), head), head)
    score = detector.score(_with_logits([[4.0, 3.0, 2.0, 1.0]], head))[0]
    factor = math.exp(10.0 / 7.0)  # s1 = 10, kept 4 + 3 = 7
    assert score == pytest.approx(_energy(np.array([4.0, 3.0, 0.0, 0.0]) * factor))


def test_scale_hand_computed():
    head = Head(np.eye(4, dtype=np.float32), np.array([0.5, -0.5, 0.0, 1.0], dtype=np.float32))
    detector = create("scale", percentile=50).fit(_with_logits(np.ones((1, 4)), head), head)
    z = np.array([4.0, 3.0, 2.0, 1.0])
    score = detector.score(_with_logits([z], head))[0]
    assert score == pytest.approx(_energy(z * math.exp(10.0 / 7.0) + head.bias))


def test_dice_hand_computed():
    weight = np.array([[1.0, -1.0], [2.0, 0.5]], dtype=np.float32)
    head = Head(weight, np.array([0.1, -0.2], dtype=np.float32))
    fit = _with_logits([[0.0, 1.0], [2.0, 3.0]], head)  # mean [1, 2]; contributions [[1, -2], [2, 1]]
    detector = create("dice", p=50).fit(fit, head)
    assert detector.threshold_ == pytest.approx(1.0)
    np.testing.assert_array_equal(detector.mask_, [[False, False], [True, False]])
    score = detector.score(_with_logits([[1.0, 1.0]], head))[0]
    assert score == pytest.approx(_energy(np.array([0.1, 2.0 - 0.2])))


# ----------------------------------------------------------------------------- invariances and properties
def test_react_at_100th_percentile_is_energy_inside_the_fit_range(problem):
    react = create("react", percentile=100).fit(problem.fit, problem.head)
    inside = problem.test.features.max(axis=1) <= problem.fit.features.max()
    rows = np.flatnonzero(inside)
    assert rows.size > 10
    subset = problem.test.subset(rows)
    energy = create("energy").fit(problem.fit).score(subset)
    # ReAct's float32 head products vs the stored logits (float64 rounded to float32): both within
    # (D + 3)·eps32/2·Σ|w·z| of the exact logits, ≈ 1e-6 of a scale below 10·|energy|.
    np.testing.assert_allclose(react.score(subset), energy, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.0, 10.0, allow_nan=False, width=32), min_size=3, max_size=12), st.floats(0.0, 99.0))
def test_ash_s_and_scale_follow_their_definition(values, percentile):
    dim = len(values)
    z = np.array(values, dtype=np.float32)
    if z.sum() == 0:
        return
    head = _identity_head(dim)
    kept = dim - int(np.round(dim * percentile / 100.0))
    if kept < 1:
        with pytest.raises(DetectorError):
            create("ash_s", percentile=percentile).fit(_with_logits(np.ones((1, dim)), head), head)
        return
    top = np.sort(z.astype(np.float64))[::-1][:kept]
    if top.sum() == 0:
        return
    factor = math.exp(float(z.astype(np.float64).sum()) / float(top.sum()))
    scale = create("scale", percentile=percentile).fit(_with_logits(np.ones((1, dim)), head), head)
    # Identity head: the float32 logits are z exactly and the rest is float64 (sums of ≤ 12 values, one exp of a
    # ratio ≤ 12, a log-sum-exp of ≤ 12 terms): ≤ ~40·eps64 ≈ 1e-14 relative.
    assert scale.score(_with_logits([z], head))[0] == pytest.approx(_energy(z.astype(np.float64) * factor), rel=1e-12)
    ash = create("ash_s", percentile=percentile).fit(_with_logits(np.ones((1, dim)), head), head)
    threshold = top[-1]
    pruned = np.where(z.astype(np.float64) > threshold, z.astype(np.float64), 0.0)  # float64, as the detector scales
    # Ties at the threshold: keep exactly as many as `kept` (any of the tied entries; they have equal value).
    tied = np.flatnonzero(z.astype(np.float64) == threshold)[: kept - int((z.astype(np.float64) > threshold).sum())]
    pruned[tied] = threshold
    # Identity head: pruned @ I is exact in float32, the scaling float64: the bound of SCALE above.
    assert ash.score(_with_logits([z], head))[0] == pytest.approx(_energy(pruned * factor), rel=1e-12)


def test_ash_s_all_zero_row_scores_the_bias_energy():
    head = Head(np.eye(3, dtype=np.float32), np.array([0.0, 1.0, 2.0], dtype=np.float32))
    detector = create("ash_s", percentile=50).fit(_with_logits(np.ones((1, 3)), head), head)
    assert detector.score(_with_logits(np.zeros((1, 3)), head))[0] == pytest.approx(_energy(head.bias.astype(float)))


# ----------------------------------------------------------------------------- requirements and parameters
@pytest.mark.parametrize("name", ["react", "ash_s", "scale", "dice"])
def test_head_is_required(problem, name):
    with pytest.raises(DetectorError, match="head"):
        create(name).fit(problem.fit)


def test_scale_needs_test_logits(problem):
    detector = create("scale").fit(problem.fit, problem.head)
    with pytest.raises(DetectorError, match="logits"):
        detector.score(Outputs(problem.test.features))


@pytest.mark.parametrize(
    "name,params",
    [
        ("react", {"percentile": 101}),
        ("ash_s", {"percentile": 100}),
        ("scale", {"percentile": -1}),
        ("dice", {"p": "high"}),
    ],
)
def test_bad_parameters_are_rejected(name, params):
    with pytest.raises(DetectorError, match=name if name != "dice" else "p"):
        create(name, **params)


def test_ash_s_percentile_that_prunes_everything_is_rejected(problem):
    with pytest.raises(DetectorError, match="prunes all"):
        create("ash_s", percentile=99.9).fit(problem.fit, problem.head)


@pytest.mark.parametrize("name", ["react", "ash_s", "scale", "dice"])
def test_rescaling_features_against_the_head_changes_nothing(problem, name):
    # z -> s z with W -> W / s keeps the logits; ReAct's threshold, ASH/SCALE's ratios and DICE's mask follow along.
    scale = 7.5
    head = Head((problem.weight / scale).astype(np.float32), problem.bias.astype(np.float32))

    def scaled(outputs: Outputs) -> Outputs:
        return Outputs(np.asarray(outputs.features) * np.float32(scale), outputs.logits, outputs.labels)

    plain = create(name).fit(problem.fit, problem.head).score(problem.test)
    moved = create(name).fit(scaled(problem.fit), head).score(scaled(problem.test))
    # The float32 features × 7.5 and W / 7.5 each round (eps32/2), then the float32 head products: as ASH-S above.
    np.testing.assert_allclose(moved, plain, rtol=1e-5)


def test_ash_s_breaks_ties_at_a_nonzero_cut_by_position():
    rng = np.random.default_rng(4)
    head = Head(rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, dtype=np.float32))
    detector = create("ash_s", percentile=50).fit(_with_logits(np.ones((1, 4)), head), head)
    z = np.array([3.0, 2.0, 2.0, 2.0])  # keep 2: the 3 and the first of the tied 2s
    kept = np.array([3.0, 2.0, 0.0, 0.0]) * math.exp(9.0 / 5.0)
    expected = _energy(head.weight.astype(np.float64) @ kept)
    # The product with W runs in float32 (D = 4 terms): each logit within (D + 2)·eps32/2·Σ|w·z| before the float64
    # scaling by e^1.8; the energy moves by at most the largest logit error.
    bound = math.exp(9.0 / 5.0) * 6 * np.finfo(np.float32).eps / 2 * float((np.abs(head.weight) @ np.abs(z)).max())
    assert abs(detector.score(_with_logits([z], head))[0] - expected) <= bound
