"""Zero-shot scores: closed forms on hand-made embeddings, slow float64 references, chunking invariance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench import detectors
from oodbench.errors import ZeroShotError
from oodbench.outputs import Outputs
from oodbench.zeroshot import scores as S


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def random_set():
    rng = np.random.default_rng(7)
    images = rng.normal(size=(37, 12)).astype(np.float32)
    ids = rng.normal(size=(6, 12)).astype(np.float32)
    negatives = rng.normal(size=(53, 12)).astype(np.float32)
    return images, ids, negatives


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Force many label blocks and row chunks so every streaming path is exercised."""
    monkeypatch.setattr(S, "LABEL_BLOCK", 5)
    return 2000  # chunk_bytes: a handful of rows per chunk


# ----------------------------------------------------------------------------------------------- closed forms
def test_logit_scores_closed_form_two_orthogonal_labels():
    # h = e1, labels e1 and e2: z = [1/τ, 0] = [100, 0].
    h = np.array([[1.0, 0.0, 0.0]])
    t = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = S.logit_scores(h, t, tau=0.01)
    p1 = 1.0 / (1.0 + np.exp(-100.0))
    p2 = np.exp(-100.0) / (1.0 + np.exp(-100.0))
    log_p1, log_p2 = -np.log1p(np.exp(-100.0)), -100.0 - np.log1p(np.exp(-100.0))
    assert out["mcm"][0] == pytest.approx(p1, rel=1e-12)
    assert out["maxlogit"][0] == pytest.approx(100.0, rel=1e-6)
    assert out["energy"][0] == pytest.approx(np.log(np.exp(100.0) + 1.0), rel=1e-6)
    assert out["margin"][0] == pytest.approx(p1 - p2, rel=1e-12)
    assert out["entropy"][0] == pytest.approx(p1 * log_p1 + p2 * log_p2, rel=1e-6)
    assert out["gen"][0] == pytest.approx(-(p1**0.1 * p2**0.1 + p2**0.1 * p1**0.1), rel=1e-6)


def test_uniform_image_gives_uniform_softmax():
    # An image orthogonal to all C labels: every probability 1/C.
    h = np.array([[0.0, 0.0, 0.0, 1.0]])
    t = np.eye(4)[:3]
    out = S.logit_scores(h, t)
    assert out["mcm"][0] == pytest.approx(1 / 3)
    assert out["margin"][0] == pytest.approx(0.0, abs=1e-15)
    assert out["entropy"][0] == pytest.approx(-np.log(3))
    assert out["energy"][0] == pytest.approx(np.log(3))


def test_neglabel_without_negatives_is_one(random_set):
    images, ids, _ = random_set
    empty = np.zeros((0, ids.shape[1]), dtype=np.float32)
    assert np.array_equal(S.neglabel_scores(images, ids, empty), np.ones(len(images)))


def test_neglabel_with_negatives_copying_the_id_labels_is_one_half(random_set):
    images, ids, _ = random_set
    np.testing.assert_allclose(S.neglabel_scores(images, ids, ids.copy()), 0.5, rtol=1e-6)


def test_eoe_without_outliers_is_mcm_and_beta_zero_is_joint_mcm(random_set):
    images, ids, outliers = random_set
    empty = np.zeros((0, ids.shape[1]), dtype=np.float32)
    # Streaming sums exponentials in float32 (after the max shift), the logit-space pass in float64.
    np.testing.assert_allclose(
        S.eoe_scores(images, ids, empty), S.logit_scores(images, ids, names=["mcm"])["mcm"], rtol=1e-6
    )
    joint = softmax(unit(images) @ unit(np.r_[ids, outliers]).T / 0.01)
    np.testing.assert_allclose(
        S.eoe_scores(images, ids, outliers, beta=0.0), joint[:, : len(ids)].max(axis=1), rtol=1e-4, atol=1e-12
    )


def test_glmcm_closed_forms(random_set):
    images, ids, _ = random_set
    mcm = S.logit_scores(images, ids, names=["mcm"])["mcm"]
    patches = np.repeat(unit(images)[:, None, :], 3, axis=1).astype(np.float16)
    np.testing.assert_allclose(S.glmcm_scores(images, patches, ids, lam=0.0), mcm, rtol=1e-12)
    # Every patch equal to the image (up to fp16 rounding): local MCM ≈ global MCM.
    np.testing.assert_allclose(S.glmcm_scores(images, patches, ids, lam=1.0), 2 * mcm, rtol=5e-3)


# ----------------------------------------------------------------------------------------------- slow references
def test_every_score_matches_a_float64_reference(random_set, tiny_blocks):
    images, ids, negatives = random_set
    z = unit(images) @ unit(ids).T / 0.01
    p = softmax(z)
    got = S.logit_scores(images, ids, gen_top_m=4, chunk_bytes=tiny_blocks)
    sorted_p = np.sort(p, axis=1)
    # GEN's 1 − p_j as the exact sum of the other probabilities (1.0 − p rounds to 0 when p_j ≈ 1 at τ = 0.01).
    gen = np.array([-sum(row[j] ** 0.1 * np.delete(row, j).sum() ** 0.1 for j in np.argsort(row)[-4:]) for row in p])
    reference = {
        "mcm": p.max(1),
        "maxlogit": z.max(1),
        "energy": np.log(np.exp(z).sum(1)),
        "gen": gen,
        "entropy": np.sum(p * np.log(p), axis=1),
        "margin": sorted_p[:, -1] - sorted_p[:, -2],
    }
    for name, values in reference.items():
        np.testing.assert_allclose(got[name], values, rtol=1e-4, atol=1e-9, err_msg=name)

    a_id = np.exp(unit(images) @ unit(ids).T / 0.01).sum(1)
    a_neg = np.exp(unit(images) @ unit(negatives).T / 0.01)
    np.testing.assert_allclose(
        S.neglabel_scores(images, ids, negatives, chunk_bytes=tiny_blocks), a_id / (a_id + a_neg.sum(1)), rtol=1e-4
    )
    # 4 groups are wider than a label block (streamed one by one); 20 groups of widths 3 and 2 go q per block.
    for count in (4, 20):
        groups = S.neglabel_groups(len(negatives), count, seed=3)
        grouped = np.mean([a_id / (a_id + a_neg[:, g].sum(1)) for g in groups], axis=0)
        np.testing.assert_allclose(
            S.neglabel_scores(images, ids, negatives, groups=count, seed=3, chunk_bytes=tiny_blocks), grouped, rtol=1e-4
        )

    joint = softmax(unit(images) @ unit(np.r_[ids, negatives]).T / 0.01)
    np.testing.assert_allclose(
        S.eoe_scores(images, ids, negatives, beta=0.25, chunk_bytes=tiny_blocks),
        joint[:, :6].max(1) - 0.25 * joint[:, 6:].max(1),
        rtol=1e-4,
        atol=1e-9,
    )

    rng = np.random.default_rng(1)
    patches = rng.normal(size=(len(images), 5, images.shape[1])).astype(np.float16)
    local = np.array(
        [softmax(unit(patches[i].astype(np.float64)) @ unit(ids).T / 0.01).max(1).max() for i in range(len(images))]
    )
    np.testing.assert_allclose(
        S.glmcm_scores(images, patches, ids, lam=0.7, chunk_bytes=tiny_blocks), p.max(1) + 0.7 * local, rtol=1e-4
    )


def test_results_do_not_depend_on_chunking(random_set, monkeypatch):
    images, ids, negatives = random_set
    whole = S.neglabel_scores(images, ids, negatives, groups=3)
    eoe_whole = S.eoe_scores(images, ids, negatives)
    monkeypatch.setattr(S, "LABEL_BLOCK", 7)
    np.testing.assert_allclose(S.neglabel_scores(images, ids, negatives, groups=3, chunk_bytes=1500), whole, rtol=1e-6)
    np.testing.assert_allclose(S.eoe_scores(images, ids, negatives, chunk_bytes=1500), eoe_whole, rtol=1e-6)


def test_logit_scores_agree_with_the_supervised_detectors_on_clip_logits(random_set):
    # τ = 0.1 keeps every probability away from 1, where the detectors' GEN rounds 1 − p to 0 (ours does not).
    images, ids, _ = random_set
    z = (S.unit_rows(images) @ S.unit_rows(ids).T).astype(np.float64) / 0.1
    outputs = Outputs(features=images, logits=z)
    ours = S.logit_scores(images, ids, tau=0.1)
    for mine, theirs in (("mcm", "msp"), ("maxlogit", "maxlogit"), ("energy", "energy"), ("gen", "gen")):
        expected = detectors.create(theirs).fit(outputs).score(outputs)
        np.testing.assert_allclose(ours[mine], expected, rtol=1e-10, err_msg=mine)


def test_neglabel_grouping_is_seeded_and_covers_every_negative():
    groups = S.neglabel_groups(103, 10, seed=0)
    again = S.neglabel_groups(103, 10, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(groups, again))
    assert sorted(np.concatenate(groups).tolist()) == list(range(103))
    assert {len(g) for g in groups} == {10, 11}
    # The permutation is numpy's PCG64 one: pinned so CPU/GPU/any platform give the same groups.
    assert np.array_equal(np.concatenate(groups), np.random.default_rng(0).permutation(103))


# ----------------------------------------------------------------------------------------------- properties
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 20))
def test_neglabel_properties(seed, num_ids, num_negatives):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(5, 6)).astype(np.float32)
    ids = rng.normal(size=(num_ids, 6)).astype(np.float32)
    negatives = rng.normal(size=(num_negatives, 6)).astype(np.float32)
    score = S.neglabel_scores(images, ids, negatives, tau=0.1)
    assert np.all((score > 0) & (score <= 1))
    # More negatives can only lower the ID share.
    more = S.neglabel_scores(images, ids, np.r_[negatives, rng.normal(size=(3, 6)).astype(np.float32)], tau=0.1)
    assert np.all(more <= score + 1e-12)
    # Without grouping the order of the negatives does not matter.
    shuffled = S.neglabel_scores(images, ids, negatives[rng.permutation(num_negatives)], tau=0.1)
    np.testing.assert_allclose(shuffled, score, rtol=1e-12)
    eoe = S.eoe_scores(images, ids, negatives, beta=0.25, tau=0.1)
    assert np.all((eoe >= -0.25) & (eoe <= 1.0))


# ----------------------------------------------------------------------------------------------- registry and errors
def test_compute_score_dispatch_and_errors(random_set):
    images, ids, negatives = random_set
    assert S.available_scores() == ["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "glmcm", "neglabel", "eoe"]
    np.testing.assert_allclose(
        S.compute_score("gen", images, ids, gamma=0.5, top_m=2),
        S.logit_scores(images, ids, names=["gen"], gen_gamma=0.5, gen_top_m=2)["gen"],
    )
    np.testing.assert_allclose(
        S.compute_score("neglabel", images, ids, vocab_text=negatives, groups=2),
        S.neglabel_scores(images, ids, negatives, groups=2),
    )
    with pytest.raises(ZeroShotError, match="needs the embeddings"):
        S.compute_score("neglabel", images, ids)
    with pytest.raises(ZeroShotError, match="needs patch embeddings"):
        S.compute_score("glmcm", images, ids)
    with pytest.raises(ZeroShotError, match="no parameter"):
        S.compute_score("mcm", images, ids, beta=1.0)
    with pytest.raises(ZeroShotError, match="unknown zero-shot score"):
        S.get_score("odin")
    with pytest.raises(ZeroShotError, match="same model"):
        S.logit_scores(images, ids[:, :5])
    with pytest.raises(ZeroShotError, match="tau"):
        S.logit_scores(images, ids, tau=0.0)
    with pytest.raises(ZeroShotError, match="groups"):
        S.neglabel_scores(images, ids, negatives[:3], groups=4)
    bad = images.copy()
    bad[4, 2] = np.nan
    with pytest.raises(ZeroShotError, match="row 4"):
        S.neglabel_scores(bad, ids, negatives)
    with pytest.raises(ZeroShotError, match=r"\(N=37, P, D=12\)"):
        S.glmcm_scores(images, np.zeros((37, 4, 11)), ids)
