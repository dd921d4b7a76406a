"""Zero-shot scores: closed forms on hand-made embeddings, slow float64 references, chunking invariance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench import detectors
from oodbench.core.errors import ZeroShotError
from oodbench.core.outputs import Outputs
from oodbench.zeroshot import scores as S


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------------------------- float32 error bounds
U = 2.0**-24  # unit roundoff of float32
EXP_ULPS = 4  # numpy's float32 exp is accurate to a few ulps (documented < 4); one ulp is at most 2u relative


def logit_error(dim: int, tau: float) -> float:
    """Bound on |z − hᵀt/τ| (h, t the exact unit vectors) for z = fl(fl(ĥᵀt̂) · fl(1/τ)) on float32 unit rows ĥ, t̂.

    - the float32 dot product of length D: |fl(ĥᵀt̂) − ĥᵀt̂| ≤ γ_D ‖ĥ‖‖t̂‖, γ_D = Du / (1 − Du) (Higham, Thm 3.5);
    - ĥ, t̂ scaled to unit norm in float32 (an exact power-of-two scaling, then divided by their norm): each
      within (D/2 + 2)u of the exact unit vector, so |ĥᵀt̂ − hᵀt| ≤ (D + 4)u and ‖ĥ‖‖t̂‖ ≤ 1 + (D + 4)u;
    - the scaling by fl(1/τ) in float32 (of ĥ, before the product): 2u relative on |z| ≤ (1 + (D + 4)u)/τ.
    """
    gamma = dim * U / (1 - dim * U)
    normalise = (dim + 4) * U
    return (gamma * (1 + normalise) + normalise + 2 * U * (1 + normalise)) / tau


def lse_error(dim: int, tau: float, num_labels: int) -> float:
    """Bound on |computed − exact| log Σ_l exp(z_l) of the streaming float32 reduction in scores.py.

    log-sum-exp is 1-Lipschitz in max-norm (the logit error); each term is exp(fl(z − peak)) with the subtraction
    rounded by u·|z − peak| ≤ u · 2.02/τ and exp by EXP_ULPS·2u; float64 sums and logs add num_labels · 2⁻⁵³.
    """
    return logit_error(dim, tau) + U * 2.02 / tau + EXP_ULPS * 2 * U + num_labels * 2.0**-53


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
    # Exact inputs, float64 throughout: the largest error is exp's argument, |z|·eps64 ≈ 2e-14 relative.
    assert out["maxlogit"][0] == pytest.approx(100.0, rel=1e-12)
    assert out["energy"][0] == pytest.approx(np.log(np.exp(100.0) + 1.0), rel=1e-12)
    assert out["margin"][0] == pytest.approx(p1 - p2, rel=1e-12)
    assert out["entropy"][0] == pytest.approx(p1 * log_p1 + p2 * log_p2, rel=1e-12)
    assert out["gen"][0] == pytest.approx(-(p1**0.1 * p2**0.1 + p2**0.1 * p1**0.1), rel=1e-12)


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
    # The ID and negative sums run the same float32 products and reductions on the same rows: equal up to the
    # float64 rounding of expit (a few ulps of 0.5).
    np.testing.assert_allclose(S.neglabel_scores(images, ids, ids.copy()), 0.5, rtol=1e-15)


def test_eoe_without_outliers_is_mcm_and_beta_zero_is_joint_mcm(random_set):
    images, ids, outliers = random_set
    empty = np.zeros((0, ids.shape[1]), dtype=np.float32)
    # Both take the same float32 products; the streaming pass then scales by 1/τ in float32 (u·|z| each, so
    # 2.02u/τ on z_l − z_max), shifts in float32 (2.02u/τ) and exponentiates in float32 (EXP_ULPS·2u), the logit
    # pass does all of it in float64. MCM = 1 / Σ_l exp(z_l − z_max) moves by Σ_{l≠max} p_l·δ_l ≤ (1 − MCM)·δ.
    mcm = S.logit_scores(images, ids, names=["mcm"])["mcm"]
    delta = 4.04 * U / 0.01 + EXP_ULPS * 2 * U
    # Plus float64 rounding: exp(max − lse) with lse = max + log s rounds lse by ulp(|z|) ≤ 2⁻⁵²·1.01/τ.
    rel64 = 2.0**-52 * (2.02 / 0.01 + 1)
    assert np.all(np.abs(S.eoe_scores(images, ids, empty) - mcm) <= 1.01 * delta * (1 - mcm) * mcm + 2 * rel64 * mcm)
    joint = softmax(unit(images) @ unit(np.r_[ids, outliers]).T / 0.01)
    p_id = joint[:, : len(ids)].max(axis=1)
    # exp(max_ID − lse_all) moves by (logit + lse) relative, see logit_error and lse_error.
    term = 1.01 * (logit_error(12, 0.01) + lse_error(12, 0.01, len(ids) + len(outliers)))
    np.testing.assert_allclose(S.eoe_scores(images, ids, outliers, beta=0.0), p_id, rtol=term, atol=0)


def test_glmcm_closed_forms(random_set):
    images, ids, _ = random_set
    mcm = S.logit_scores(images, ids, names=["mcm"])["mcm"]
    patches = np.repeat(unit(images)[:, None, :], 3, axis=1).astype(np.float16)
    np.testing.assert_allclose(S.glmcm_scores(images, patches, ids, lam=0.0), mcm, rtol=1e-12)
    # Every patch equal to the image up to fp16 rounding (2⁻¹¹ relative per component, so the renormalised patch
    # is within 2⁻¹⁰ of the image and each cosine within 2⁻¹⁰): each logit moves by ≤ dz and the local MCM by
    # (1 − MCM)·2dz in log, since MCM = 1 / Σ_l exp(z_l − z_max).
    dz = 2.0**-10 / 0.01 + 2 * logit_error(12, 0.01)
    bound = mcm * np.expm1(2 * dz * (1 - mcm)) + 1e-12
    assert np.all(np.abs(S.glmcm_scores(images, patches, ids, lam=1.0) - 2 * mcm) <= bound)


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
    # First-order bounds for a max-norm logit error e (the float64 steps after the product add ~1e-13 relative):
    # log p_c moves by ≤ 2e; entropy Σ p log p by e·Σ_c p_c|log p_c − H| (its gradient is p_c(log p_c − H));
    # each GEN factor p^γ, (1 − p)^γ by 2γe relative.
    e = 1.01 * logit_error(12, 0.01)
    log_p = np.log(p)
    entropy = reference["entropy"]
    bounds = {
        "mcm": 2 * e * p.max(1),
        "maxlogit": np.full(len(p), e),
        "energy": np.full(len(p), e),
        "gen": 4 * 0.1 * e * np.abs(gen),
        "entropy": e * np.sum(p * np.abs(log_p - entropy[:, None]), axis=1),
        "margin": 2 * e * (sorted_p[:, -1] + sorted_p[:, -2]),
    }
    # Plus float64 rounding: each p_j = exp(fl(z_j − lse)) is off by u64·(|z_j| + |lse| + 1) ≤ 2⁻⁵²(2.02/τ + 1)
    # relative, which moves Σ p log p by that times Σ p(|log p| + 1) and the other scores by that times their size.
    rel64 = 2.0**-52 * (2.02 / 0.01 + 1)
    for name, values in reference.items():
        size = np.sum(p * (np.abs(log_p) + 1), axis=1) if name == "entropy" else np.abs(values) + 1
        assert np.all(np.abs(got[name] - values) <= bounds[name] + 2 * rel64 * size), name

    a_id = np.exp(unit(images) @ unit(ids).T / 0.01).sum(1)
    a_neg = np.exp(unit(images) @ unit(negatives).T / 0.01)
    # A share expit(lse_ID − lse_neg) moves by ≤ 2·lse in log (see lse_error); e^x − 1 ≤ 1.01x at these sizes.
    share = 1.01 * 2 * lse_error(12, 0.01, len(ids) + len(negatives))
    np.testing.assert_allclose(
        S.neglabel_scores(images, ids, negatives, chunk_bytes=tiny_blocks), a_id / (a_id + a_neg.sum(1)), rtol=share
    )
    # 4 groups are wider than a label block (streamed one by one); 20 groups of widths 3 and 2 go q per block.
    for count in (4, 20):
        groups = S.neglabel_groups(len(negatives), count, seed=3)
        grouped = np.mean([a_id / (a_id + a_neg[:, g].sum(1)) for g in groups], axis=0)
        np.testing.assert_allclose(
            S.neglabel_scores(images, ids, negatives, groups=count, seed=3, chunk_bytes=tiny_blocks),
            grouped,
            rtol=share,
        )

    joint = softmax(unit(images) @ unit(np.r_[ids, negatives]).T / 0.01)
    p_id, p_out = joint[:, :6].max(1), joint[:, 6:].max(1)
    # Each term exp(max − lse_all) moves by (logit + lse) relative.
    term = 1.01 * (e + lse_error(12, 0.01, len(ids) + len(negatives)))
    got_eoe = S.eoe_scores(images, ids, negatives, beta=0.25, chunk_bytes=tiny_blocks)
    assert np.all(np.abs(got_eoe - (p_id - 0.25 * p_out)) <= term * (p_id + 0.25 * p_out))

    rng = np.random.default_rng(1)
    patches = rng.normal(size=(len(images), 5, images.shape[1])).astype(np.float16)
    local = np.array(
        [softmax(unit(patches[i].astype(np.float64)) @ unit(ids).T / 0.01).max(1).max() for i in range(len(images))]
    )
    # Global and local MCM each move by 2e relative (the patches are float16, exactly float32 and float64).
    np.testing.assert_allclose(
        S.glmcm_scores(images, patches, ids, lam=0.7, chunk_bytes=tiny_blocks), p.max(1) + 0.7 * local, rtol=2 * e
    )


def _all_scores(images, ids, negatives, patches, **kw):
    return {
        **S.logit_scores(images, ids, **kw),
        "glmcm": S.glmcm_scores(images, patches, ids, **kw),
        "neglabel": S.neglabel_scores(images, ids, negatives, groups=3, **kw),
        "eoe": S.eoe_scores(images, ids, negatives, **kw),
    }


def test_results_do_not_depend_on_chunking():
    # 700 images are 3 tiles of ROW_TILE = 256; a budget of 1 byte reads one tile at a time, 64 MiB all at once.
    # Bit for bit: every BLAS call and reduction sees the same fixed tile whatever the budget.
    rng = np.random.default_rng(11)
    images = rng.normal(size=(700, 12)).astype(np.float32)
    ids = rng.normal(size=(6, 12)).astype(np.float32)
    negatives = rng.normal(size=(53, 12)).astype(np.float32)
    patches = rng.normal(size=(700, 3, 12)).astype(np.float16)
    whole = _all_scores(images, ids, negatives, patches)
    for chunk_bytes in (1, 1500, 300_000):
        chunked = _all_scores(images, ids, negatives, patches, chunk_bytes=chunk_bytes)
        for name, values in whole.items():
            np.testing.assert_array_equal(chunked[name], values, err_msg=f"{name}, chunk_bytes={chunk_bytes}")


def test_label_blocks_change_results_only_within_the_float32_bound(random_set, monkeypatch):
    # LABEL_BLOCK is internal (not a parameter): another block width changes the shapes of the float32 products
    # (and so their last bits) and the streaming shifts, so the results agree within the float32 bound only.
    images, ids, negatives = random_set
    whole = S.neglabel_scores(images, ids, negatives, groups=3)
    eoe_whole = S.eoe_scores(images, ids, negatives)
    monkeypatch.setattr(S, "LABEL_BLOCK", 7)
    # Each run's log-sum-exps are within `lse` of the exact ones; a NegLabel share expit(lse_ID − lse_g) then moves
    # by at most (1 − s)·2·lse in log per run, so two runs differ by at most 4·lse relative (e^x − 1 ≤ 1.01x here).
    lse = lse_error(12, S.TAU, len(ids) + len(negatives))
    np.testing.assert_allclose(S.neglabel_scores(images, ids, negatives, groups=3), whole, rtol=1.01 * 4 * lse, atol=0)
    # EOE's two terms exp(max − lse_all) each move by (logit + lse) relative per run, weights 1 and β = 0.25.
    bound = 1.01 * 2 * (logit_error(12, S.TAU) + lse) * (1 + 0.25)
    np.testing.assert_allclose(S.eoe_scores(images, ids, negatives), eoe_whole, rtol=0, atol=bound)


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
    assert all(np.array_equal(a, b) for a, b in zip(groups, again, strict=True))
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
    # More negatives can only lower the exact ID share; each computed share is within 2·lse in log of its exact
    # value (lse_error), so the computed ones satisfy more ≤ score · e^(4·lse).
    lse = lse_error(6, 0.1, num_ids + num_negatives + 3)
    more = S.neglabel_scores(images, ids, np.r_[negatives, rng.normal(size=(3, 6)).astype(np.float32)], tau=0.1)
    assert np.all(more <= score * np.exp(1.01 * 4 * lse))
    # Without grouping the order of the negatives does not matter (exactly: up to the same bound, since the BLAS
    # may round a dot product differently in another column of the product).
    shuffled = S.neglabel_scores(images, ids, negatives[rng.permutation(num_negatives)], tau=0.1)
    np.testing.assert_allclose(shuffled, score, rtol=1.01 * 4 * lse)
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


# ----------------------------------------------------------------------------------------------- unusable rows
@pytest.mark.parametrize("which", ["image", "id", "negative", "outlier", "patch"])
def test_an_all_zero_row_is_refused_naming_the_array_and_row(random_set, which):
    # Before: an all-zero row was scored silently (a zero image got MCM = 1/C).
    images, ids, negatives = random_set
    images, ids, negatives = images.copy(), ids.copy(), negatives.copy()
    patches = np.repeat(images[:, None, :], 3, axis=1)
    if which == "image":
        images[5] = 0
        call, expected = (lambda: S.logit_scores(images, ids)), "image embedding row 5 is all zeros"
    elif which == "id":
        ids[2] = 0
        call, expected = (lambda: S.neglabel_scores(images, ids, negatives)), "ID label embeddings row 2 is all zeros"
    elif which == "negative":
        negatives[7] = 0
        call = lambda: S.neglabel_scores(images, ids, negatives)  # noqa: E731
        expected = "negative label embeddings row 7 is all zeros"
    elif which == "outlier":
        negatives[0] = 0
        call, expected = (lambda: S.eoe_scores(images, ids, negatives)), "outlier label embeddings row 0 is all zeros"
    else:
        patches[3, 1] = 0
        call, expected = (lambda: S.glmcm_scores(images, patches, ids)), "patch embedding 1 of image row 3 is all zeros"
    with pytest.raises(ZeroShotError, match=expected):
        call()


def test_a_finite_value_beyond_float32_is_reported_as_such(random_set):
    # Before: a float64 1e39 (finite) became inf in float32 and was reported as "contains NaN or inf".
    images, ids, negatives = random_set
    big = images.astype(np.float64)
    big[4, 2] = 1e39
    with pytest.raises(
        ZeroShotError, match=r"image embedding row 4 has a value of magnitude 1e\+39, above the float32"
    ):
        S.neglabel_scores(big, ids, negatives)
    big_ids = ids.astype(np.float64)
    big_ids[1, 0] = -1e39
    with pytest.raises(ZeroShotError, match=r"ID label embeddings row 1 has a value of magnitude 1e\+39"):
        S.logit_scores(images, big_ids)
    nan = images.copy()
    nan[6, 0] = np.nan
    with pytest.raises(ZeroShotError, match="image embedding row 6 contains NaN or inf"):
        S.logit_scores(nan, ids)


def test_huge_and_tiny_float32_rows_normalise_like_unit_rows(random_set):
    # |x| = 1e30 squares to inf and |x| = 1e-30 to 0 in float32: rows are scaled by their largest value first.
    # Before: the norm overflowed (or underflowed) and the row was scored as all zeros (or as inf/NaN).
    images, ids, negatives = random_set
    base = S.neglabel_scores(images, ids, negatives)
    # images · scale rounds each component once more (the scale is not a power of two): one more u per
    # component, well inside the logit bound, so the two runs agree within 4·lse (lse_error) relative.
    bound = 1.01 * 4 * lse_error(12, S.TAU, len(ids) + len(negatives))
    for scale in (np.float32(1e30), np.float32(1e-30)):
        np.testing.assert_allclose(S.neglabel_scores(images * scale, ids, negatives), base, rtol=bound)


def test_each_logit_score_alone_equals_the_joint_pass(random_set):
    # The scores share one pass and compute only what the requested names need: the same numbers either way.
    images, ids, _ = random_set
    together = S.logit_scores(images, ids, gen_top_m=3)
    for name in S.LOGIT_SCORES:
        np.testing.assert_array_equal(S.logit_scores(images, ids, names=[name], gen_top_m=3)[name], together[name])
    single = S.logit_scores(images, ids[:1])
    assert np.all(single["mcm"] == 1.0) and np.all(single["margin"] == 1.0) and np.all(single["entropy"] == 0.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), top_m=st.integers(1, 12), ties=st.booleans())
def test_gen_selects_its_top_m_on_the_cosines_as_on_the_logits(seed, top_m, ties):
    # logit_scores hands GEN the float32 cosines to select from (a float32 partition); selecting from the float64
    # exponentials instead must give the same top-M terms, ties at the M-th place included (equal cosines give
    # equal terms, whichever of them is taken), so GEN agrees to float64 summation order.
    rng = np.random.default_rng(seed)
    cosines = rng.uniform(-1, 1, size=(9, 12)).astype(np.float32)
    if ties:
        cosines = np.round(cosines * 4) / 4  # many exact ties, at the M-th place too
    z = cosines.astype(np.float64) / S.TAU
    via_cosines = S._scores_from_logits(z.copy(), ["gen"], 0.1, top_m, cosines=cosines.copy(), tau=S.TAU)["gen"]
    via_logits = S._scores_from_logits(z.copy(), ["gen"], 0.1, top_m)["gen"]
    np.testing.assert_allclose(via_cosines, via_logits, rtol=top_m * 2.0**-52, atol=0)


# ----------------------------------------------------------------------------------------------- NegLabel sweeps
def _exact_neglabel(images, ids, negatives, rows, groups=1, seed=0, tau=S.TAU):
    """float64 NegLabel of the negatives `rows`, groups as `neglabel_groups` draws them, in logs (no underflow)."""
    from scipy.special import expit as sigmoid
    from scipy.special import logsumexp as lse

    lse_id = lse(unit(images) @ unit(ids).T / tau, axis=1)
    z = unit(images) @ unit(negatives[rows]).T / tau
    parts = S.neglabel_groups(len(rows), groups, seed)
    return np.mean([sigmoid(lse_id - lse(z[:, part], axis=1)) for part in parts], axis=0)


@pytest.mark.parametrize("dense_columns", [128, 0])  # the dense 0/1 product, and the sparse one
@pytest.mark.parametrize("tau", [S.TAU, 0.1])  # shifted logits below float32's range (float64 exp), and within it
def test_neglabel_sweep_matches_a_float64_reference_per_run(random_set, tiny_blocks, monkeypatch, dense_columns, tau):
    monkeypatch.setattr(S, "_DENSE_GROUP_COLUMNS", dense_columns)
    images, ids, negatives = random_set
    # At τ = 0.01 some rows span more than float32's exponent range below their maximum (those blocks take the
    # float64 exponential); at τ = 0.1 no row can (2/τ = 20), so every block takes the float32 one.
    spread = np.ptp(unit(images) @ unit(negatives).T / tau, axis=1).max()
    assert (spread > 87.4) == (tau == S.TAU)
    prefix = list(range(20))
    runs = [(prefix, 1, 0), (list(range(53)), 1, 0), (prefix[:7], 1, 0), (list(range(50, 10, -3)), 4, 3), ([], 1, 0)]
    got = S.neglabel_sweep(images, ids, negatives, runs, tau=tau, chunk_bytes=tiny_blocks)
    # Each share expit(lse_ID − lse_g) moves by ≤ 2·lse in log (lse_error; the sweep's float64 exponentials are
    # within it); e^x − 1 ≤ 1.01x at these sizes.
    share = 1.01 * 2 * lse_error(12, tau, len(ids) + len(negatives))
    for (rows, groups, seed), values in zip(runs[:-1], got, strict=False):
        exact = _exact_neglabel(images, ids, negatives, rows, groups, seed, tau)
        np.testing.assert_allclose(values, exact, rtol=share)
        # and within 4·lse of the one-run path (each within 2·lse of the exact share)
        one_run = S.neglabel_scores(images, ids, negatives[rows], tau=tau, groups=groups, seed=seed)
        np.testing.assert_allclose(values, one_run, rtol=2 * share)
    assert np.array_equal(got[-1], np.ones(len(images)))  # no negatives: every share is 1, as neglabel_scores gives


def test_neglabel_sweep_keeps_a_group_far_below_another_runs_maximum():
    # One run's label sits on the image (z = +100), the other run's labels and the ID labels opposite it (z ≈ −100):
    # their terms are e^-200 of the row's maximum, below float32's range but not float64's, so the far run's share
    # is still the exact one (about 0.5 here, not 1 from an underflowed sum).
    image = np.array([[1.0, 0.0, 0.0]], dtype=np.float32)
    ids = np.array([[-1.0, 0.05, 0.0], [-1.0, 0.0, 0.05]], dtype=np.float32)
    negatives = np.array([[1.0, 0.0, 0.0], [-1.0, 0.04, 0.0], [-1.0, 0.0, 0.06]], dtype=np.float32)
    near, far = S.neglabel_sweep(image, ids, negatives, [([0], 1, 0), ([1, 2], 1, 0)])
    exact = _exact_neglabel(image, ids, negatives, [1, 2])
    assert 0.3 < exact[0] < 0.7
    np.testing.assert_allclose(far, exact, rtol=1e-4)  # z moves by ≤ logit_error(3, τ) ≈ 2e-5 in float32
    np.testing.assert_allclose(near, _exact_neglabel(image, ids, negatives, [0]), rtol=1e-4)


def test_neglabel_sweep_at_a_tiny_tau_is_the_per_run_path(random_set):
    # Below τ = 2.02/700 a far term could underflow float64 after the shift: each run goes through neglabel_scores.
    images, ids, negatives = random_set
    runs = [(list(range(10)), 1, 0), (list(range(5, 40)), 3, 1)]
    got = S.neglabel_sweep(images, ids, negatives, runs, tau=0.002)
    for (rows, groups, seed), values in zip(runs, got, strict=True):
        assert np.array_equal(
            values, S.neglabel_scores(images, ids, negatives[rows], tau=0.002, groups=groups, seed=seed)
        )


def test_neglabel_sweep_refuses_bad_runs(random_set):
    images, ids, negatives = random_set
    with pytest.raises(ZeroShotError, match="run 1: a row index lies outside the 53 negative labels"):
        S.neglabel_sweep(images, ids, negatives, [([0], 1, 0), ([53], 1, 0)])
    with pytest.raises(ZeroShotError, match="run 0: a negative label is listed twice"):
        S.neglabel_sweep(images, ids, negatives, [([4, 4], 1, 0)])
    with pytest.raises(ZeroShotError, match="cannot split 2 negative labels into 3 groups"):
        S.neglabel_sweep(images, ids, negatives, [([1, 2], 3, 0)])
