"""MSP, MaxLogit, KL-Matching, Energy, GEN: closed forms, slow references and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import create

logit_matrices = arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(2, 6)), elements=st.floats(-30, 30))


def _outputs(logits) -> Outputs:
    logits = np.asarray(logits, dtype=np.float64)
    return Outputs(np.zeros((logits.shape[0], 1)), logits)


def _softmax(row):
    peak = max(row)
    exps = [math.exp(v - peak) for v in row]
    return [e / sum(exps) for e in exps]


def _slow_gen(row, top_m, gamma):
    """−Σ over the top-M classes of p^γ (1 − p)^γ; the winner's 1 − p is the sum of the other probabilities."""
    probs = _softmax(row)
    order = sorted(range(len(probs)), key=lambda c: -probs[c])[: min(top_m, len(probs))]
    total = 0.0
    for c in order:
        complement = sum(probs[j] for j in range(len(probs)) if j != c) if c == order[0] else 1.0 - probs[c]
        total += probs[c] ** gamma * complement**gamma
    return -total


def test_closed_forms():
    logits = _outputs([[0.0, 0.0], [math.log(3.0), 0.0]])
    np.testing.assert_allclose(create("msp").fit(logits).score(logits), [0.5, 0.75])
    np.testing.assert_allclose(create("maxlogit").fit(logits).score(logits), [0.0, math.log(3.0)])
    np.testing.assert_allclose(create("energy").fit(logits).score(logits), [math.log(2.0), math.log(4.0)])
    np.testing.assert_allclose(
        create("energy", temperature=2.0).fit(logits).score(logits),
        [2 * math.log(2.0), 2 * math.log(math.sqrt(3.0) + 1.0)],
    )
    # GEN with gamma = 1 over all classes: -sum p (1 - p).
    np.testing.assert_allclose(create("gen", gamma=1.0, top_m=2).fit(logits).score(logits), [-0.5, -2 * 0.75 * 0.25])


@settings(max_examples=30, deadline=None)
@given(logit_matrices)
def test_against_slow_references(logits):
    outputs = _outputs(logits)
    probs = [_softmax(row) for row in logits]
    np.testing.assert_allclose(create("msp").fit(outputs).score(outputs), [max(p) for p in probs], rtol=1e-10)
    np.testing.assert_allclose(create("maxlogit").fit(outputs).score(outputs), logits.max(axis=1))
    energies = [max(row) + math.log(sum(math.exp(v - max(row)) for v in row)) for row in logits]
    np.testing.assert_allclose(create("energy").fit(outputs).score(outputs), energies, rtol=1e-10)
    gen = [_slow_gen(row, top_m=3, gamma=0.1) for row in logits]
    np.testing.assert_allclose(create("gen", top_m=3).fit(outputs).score(outputs), gen, rtol=1e-9, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(logit_matrices, st.floats(-50, 50))
def test_softmax_scores_ignore_a_common_logit_shift(logits, shift):
    plain, shifted = _outputs(logits), _outputs(logits + shift)
    for name in ("msp", "gen"):
        np.testing.assert_allclose(
            create(name).fit(plain).score(shifted), create(name).fit(plain).score(plain), rtol=1e-9, atol=1e-12
        )
    np.testing.assert_allclose(
        create("energy").fit(plain).score(shifted),
        create("energy").fit(plain).score(plain) + shift,
        rtol=1e-9,
        atol=1e-9,
    )


@settings(max_examples=30, deadline=None)
@given(logit_matrices, st.sampled_from([1.0, 0.5, 3.7, 1e-3]), st.sampled_from([np.float32, np.float64]))
def test_energy_and_msp_are_the_float64_formulas_bit_for_bit(logits, temperature, dtype):
    """The division skipped at T = 1 and msp's row maxima computed once change no bit of the scores."""
    logits = logits.astype(dtype)
    scaled = logits.astype(np.float64) / temperature
    peak = scaled.max(axis=1)
    lse = peak + np.log(np.exp(np.maximum(scaled - peak[:, None], -300.0)).sum(axis=1))
    outputs = Outputs(np.zeros((logits.shape[0], 1)), logits)
    np.testing.assert_array_equal(
        create("energy", temperature=temperature).fit(outputs).score(outputs), temperature * lse
    )
    np.testing.assert_array_equal(
        create("msp", temperature=temperature).fit(outputs).score(outputs), np.exp(peak - lse)
    )


def test_kl_matching_against_slow_reference():
    rng = np.random.default_rng(0)
    fit_logits = rng.normal(size=(60, 4)) * 3
    test_logits = rng.normal(size=(20, 4)) * 3
    fit_probs = [_softmax(row) for row in fit_logits]
    predicted = [int(np.argmax(p)) for p in fit_probs]
    templates = {
        c: np.mean([p for p, y in zip(fit_probs, predicted, strict=True) if y == c], axis=0) for c in set(predicted)
    }
    scores = []
    for row in test_logits:
        p = np.array(_softmax(row))
        scores.append(-min(float(np.sum(p * np.log(p / np.maximum(t, 1e-300)))) for t in templates.values()))
    fast = create("kl_matching").fit(_outputs(fit_logits)).score(_outputs(test_logits))
    # Classes never predicted get a one-hot template, which may be closer; only a predicted-class set exists here.
    assert set(predicted) == {0, 1, 2, 3}
    np.testing.assert_allclose(fast, scores, rtol=1e-9)


def test_logits_are_required():
    with pytest.raises(DetectorError, match="logits"):
        create("msp").fit(Outputs(np.ones((2, 2)))).score(Outputs(np.ones((2, 2))))
