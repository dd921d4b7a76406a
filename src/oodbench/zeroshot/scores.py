"""Zero-shot OOD scores from cached vision-language embeddings; every score is higher for more in-distribution images.

Notation (the Fi-ImageNet-1k paper's Eq. 1-3): h is the ℓ2-normalised image embedding, t_c the ID label
embeddings, z_c = hᵀt_c / τ the scaled cosine logits (τ = 0.01) and a(x, t) = exp(hᵀt / τ).

- ``mcm``: max_c softmax(z)_c; ``maxlogit``: max_c z_c; ``energy``: log Σ_c exp z_c; ``gen``: −Σ_{top-M} p^γ(1−p)^γ;
  ``entropy``: Σ_c p_c log p_c (negative entropy); ``margin``: top-1 minus top-2 probability.
- ``glmcm``: MCM + λ · max over patches of the per-patch MCM (patch embeddings in the joint space).
- ``neglabel``: Σ_ID a / (Σ_ID a + Σ_neg a), averaged over g seeded groups of negatives when g > 1.
- ``eoe``: max ID probability − β · max outlier probability, both under one softmax over ID ∪ outlier labels.

Everything runs over row tiles of images and column blocks of labels with streaming log-sum-exp, so no more than
one (tile × label-block) array is ever in memory, whatever the number of images or labels. Similarities are
computed in float32 (BLAS). The vocabulary scores exponentiate in float32 after subtracting the running maximum
(values in (0, 1]) and accumulate in float64; the logit-space scores work in float64 on the ID logits.

Results do not depend on ``chunk_bytes``, by construction: the images are cut into fixed tiles of ``ROW_TILE``
rows at fixed offsets (0, ROW_TILE, 2·ROW_TILE, …), every BLAS call and every reduction sees one whole tile, and
``chunk_bytes`` only decides how many whole tiles are read at once. A BLAS sums a dot product in an order that
depends on the shapes of the call (a one-row product takes another kernel than a 37-row one), so cutting rows
anywhere else would change the float32 similarities in their last bits and, through exp(z / τ), the scores at
~1e-5 relative.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import expit

from ..core.errors import ZeroShotError
from ..core.numerics import logsumexp
from ..core.papers import Paper
from ..util.chunking import DEFAULT_CHUNK_BYTES, iter_chunks, rows_per_chunk

__all__ = [
    "TAU",
    "LOGIT_SCORES",
    "ZeroShotScore",
    "SCORES",
    "available_scores",
    "get_score",
    "compute_score",
    "logit_scores",
    "glmcm_scores",
    "neglabel_scores",
    "neglabel_sweep",
    "eoe_scores",
    "neglabel_groups",
    "unit_rows",
]

TAU = 0.01
LOGIT_SCORES = ("mcm", "maxlogit", "energy", "gen", "entropy", "margin")
# Labels per column block of the streaming reductions.
LABEL_BLOCK = 4096
# Image rows per tile: the unit of every BLAS call and reduction (see the module docstring); a multiple of every
# BLAS micro-kernel height. Chunks read from the (memory-mapped) arrays are whole tiles.
ROW_TILE = 256


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _row_magnitudes(array: np.ndarray) -> np.ndarray:
    """max |value| per row of a 2-D array: NaN where a row holds a NaN, inf where it holds an inf."""
    if not array.size:
        return np.zeros(array.shape[0], dtype=array.dtype)
    # Two reductions instead of np.abs(array).max(): no temporary the size of the array. Both propagate NaN.
    return np.maximum(array.max(axis=1), -array.min(axis=1))


def _bad_row(array: np.ndarray, magnitude: np.ndarray | None = None) -> tuple[int, str] | None:
    """(first bad row, what is wrong with it) of a 2-D array the scores cannot use, or None."""
    magnitude = _row_magnitudes(array) if magnitude is None else magnitude
    finite = np.isfinite(magnitude)
    if not finite.all():
        return int(np.flatnonzero(~finite)[0]), "contains NaN or inf"
    if array.dtype.itemsize > 4:
        above = magnitude > _FLOAT32_MAX
        if above.any():
            row = int(np.flatnonzero(above)[0])
            return row, (
                f"has a value of magnitude {magnitude[row]:.3g}, above the float32 range (largest {_FLOAT32_MAX:.3g}) "
                "the scores compute in; rescale the embeddings"
            )
    zero = magnitude == 0
    if zero.any():
        return int(np.flatnonzero(zero)[0]), "is all zeros: an embedding with no direction (a failed or padded row?)"
    return None


def _unit(values: np.ndarray, magnitude: np.ndarray | None = None) -> np.ndarray:
    """Rows of a checked array scaled to unit ℓ2 norm in float32 (`magnitude`: their max |value|, if known).

    Each row is first scaled by the power of two that brings its largest |value| into [0.5, 1): exact, so the
    result is bit for bit x / ‖x‖ wherever that is computable, and squares of values near the float32 limit
    cannot overflow nor squares of tiny values underflow.
    """
    values = np.asarray(values, dtype=np.float32)
    if magnitude is None:
        magnitude = _row_magnitudes(values.reshape(-1, values.shape[-1])).reshape(values.shape[:-1])
    _, exponent = np.frexp(magnitude[..., None])
    scaled = np.ldexp(values, -exponent).astype(np.float32, copy=False)
    # Norms by einsum: np.linalg.norm squares the rows into a temporary first.
    scaled /= np.sqrt(np.einsum("...d,...d->...", scaled, scaled))[..., None]
    return scaled


def unit_rows(array: np.ndarray, what: str = "embedding", first_row: int = 0) -> np.ndarray:
    """Rows scaled to unit ℓ2 norm as float32 (a copy).

    A row that cannot be normalised — NaN or inf, a value beyond the float32 range, all zeros — raises a
    ZeroShotError naming `what` and the row (numbered from `first_row`).
    """
    values = np.asarray(array)
    values2d = values.reshape(-1, values.shape[-1]) if values.ndim != 2 else values
    magnitude = _row_magnitudes(values2d)
    bad = _bad_row(values2d, magnitude)
    if bad is not None:
        raise ZeroShotError(f"{what} row {first_row + bad[0]} {bad[1]}")
    return _unit(values, magnitude.reshape(values.shape[:-1]))


def _check_texts(name: str, texts: object, dim: int | None, *, allow_empty: bool = False) -> np.ndarray:
    array = np.asarray(texts)
    if array.ndim != 2:
        raise ZeroShotError(f"{name} must be a 2-D array (labels, D); got shape {array.shape}")
    if array.shape[0] == 0 and not allow_empty:
        raise ZeroShotError(f"{name} is empty: at least one label embedding is needed")
    if not np.issubdtype(array.dtype, np.floating):
        raise ZeroShotError(f"{name} must be floating point; got {array.dtype}")
    if dim is not None and array.shape[1] != dim:
        raise ZeroShotError(
            f"{name} has D={array.shape[1]} but the image embeddings have D={dim}; were they made by the same model?"
        )
    if array.shape[0] == 0:
        return array.astype(np.float32)
    return unit_rows(array, name)


def _check_images(images: object) -> np.ndarray:
    array = images if isinstance(images, np.ndarray) else np.asarray(images)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ZeroShotError(f"image embeddings must be a non-empty 2-D array (N, D); got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ZeroShotError(f"image embeddings must be floating point; got {array.dtype}")
    return array


def _check_tau(tau: float) -> float:
    if not isinstance(tau, (int, float, np.floating)) or not np.isfinite(tau) or tau <= 0:
        raise ZeroShotError(f"tau must be a positive number; got {tau!r}")
    return float(tau)


def _chunk_rows(row_width: int, chunk_bytes: int) -> int:
    """Rows read at once: as many whole tiles as fit `chunk_bytes` at `row_width` float64 values a row, at least one."""
    return max(1, rows_per_chunk(row_width, budget_bytes=chunk_bytes) // ROW_TILE) * ROW_TILE


def _chunks_of_tiles(num_rows: int, row_width: int, chunk_bytes: int) -> Iterator[tuple[slice, list[slice]]]:
    """(chunk, its tiles): chunks of whole tiles to read at once, and the fixed tiles inside each one."""
    for chunk in iter_chunks(num_rows, _chunk_rows(row_width, chunk_bytes)):
        yield chunk, list(iter_chunks(chunk.stop - chunk.start, ROW_TILE))


def _image_tile(block: np.ndarray, tile: slice, offset: int) -> np.ndarray:
    """Unit rows of `block[tile]` (a tile of a chunk starting at image row `offset`), checked (see `unit_rows`)."""
    return unit_rows(block[tile], "image embedding", offset + tile.start)


def _scaled(h: np.ndarray, tau: float) -> np.ndarray:
    """The tile's unit rows times 1/τ (float32), so that one product gives z = hᵀt/τ with no pass over z."""
    return h * np.float32(1.0 / tau)


def _logits(
    h: np.ndarray, texts: np.ndarray, tau: float, out: np.ndarray | None = None, cosines: np.ndarray | None = None
) -> np.ndarray:
    """z = hᵀt / τ as float64: the float32 cosines, divided by τ in float64 (exactly the logits a classifier
    head would hand the supervised detectors); into `out` and, for the cosines, `cosines` when given."""
    z = np.empty((h.shape[0], texts.shape[0])) if out is None else out
    return np.divide(np.matmul(h, texts.T, out=cosines), tau, out=z, dtype=np.float64)  # converted and divided


def _block_width(num_labels: int, dim: int) -> int:
    """Float64-equivalent values per image row of one (rows × label-block) working set."""
    return 2 * min(max(num_labels, 1), LABEL_BLOCK) + dim


def _streaming_lse(hs: np.ndarray, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log Σ_l exp z_l, max_l z_l) per row over all labels, one label block at a time; `hs` = h/τ (`_scaled`).

    Exponentials are taken in float32 after subtracting the running maximum (so they lie in (0, 1] and terms
    that underflow are below 1e-38 of the largest); sums accumulate in float64.
    """
    peak = np.full(hs.shape[0], -np.inf)
    total = np.zeros(hs.shape[0])
    for cols in iter_chunks(texts.shape[0], LABEL_BLOCK):
        z = hs @ texts[cols].T
        new_peak = np.maximum(peak, z.max(axis=1))
        z -= new_peak.astype(np.float32)[:, None]
        np.exp(z, out=z)
        total = total * np.exp(peak - new_peak) + z.sum(axis=1, dtype=np.float64)
        peak = new_peak
    return peak + np.log(total), peak


def _equal_width_runs(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(width, count) runs of consecutive equal group sizes (array_split gives at most two)."""
    runs: list[tuple[int, int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1] = (size, runs[-1][1] + 1)
        else:
            runs.append((int(size), 1))
    return runs


def _group_lse(hs: np.ndarray, grouped: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """log Σ exp z over each group of `grouped`'s consecutive rows (group g has sizes[g] labels): (rows, groups).

    Groups of equal width w are taken LABEL_BLOCK // w at a time as one (rows, q, w) block, so per-group maxima
    and sums are plain axis reductions; a group wider than a block is streamed on its own.
    """
    out = np.empty((hs.shape[0], len(sizes)))
    start = first_group = 0
    for width, count in _equal_width_runs(sizes):
        if width > LABEL_BLOCK:
            for j in range(count):
                columns = slice(start + j * width, start + (j + 1) * width)
                out[:, first_group + j] = _streaming_lse(hs, grouped[columns])[0]
        else:
            per_block = max(1, LABEL_BLOCK // width)
            for offset in range(0, count, per_block):
                q = min(per_block, count - offset)
                columns = slice(start + offset * width, start + (offset + q) * width)
                z = (hs @ grouped[columns].T).reshape(hs.shape[0], q, width)
                peak = z.max(axis=2)
                z -= peak[..., None]
                np.exp(z, out=z)
                out[:, first_group + offset : first_group + offset + q] = peak + np.log(z.sum(axis=2, dtype=np.float64))
        start += width * count
        first_group += count
    return out


# ---------------------------------------------------------------------------------------------- logit-space scores
class _LogitTile:
    """Buffers for one tile's logits, reused from tile to tile (fresh (rows × C) arrays per tile cost page faults)."""

    def __init__(self, num_labels: int, entropy: bool) -> None:
        self.cosines = np.empty((ROW_TILE, num_labels), dtype=np.float32)
        self.logits = np.empty((ROW_TILE, num_labels))
        self.exps = np.empty((ROW_TILE, num_labels)) if entropy else None

    def logits_of(self, h: np.ndarray, texts: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
        """(z, cosines) for a tile: the float32 cosines hᵀt and z = cosines / τ in float64 (the same values as
        `_logits`), both views of the reused buffers."""
        rows = h.shape[0]
        cosines = self.cosines[:rows]
        return _logits(h, texts, tau, out=self.logits[:rows], cosines=cosines), cosines


def _scores_from_logits(
    z: np.ndarray,
    names: Sequence[str],
    gen_gamma: float,
    gen_top_m: int,
    *,
    cosines: np.ndarray | None = None,
    tau: float = 1.0,
    exps: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The logit-space scores of float64 logits `z` (rows × C), sharing one shifted exponential pass.

    `z` is overwritten (it becomes z − max z). When `cosines` is given, z = cosines / τ exactly (float64 division
    of the float32 cosines) and GEN selects its top M there, overwriting them: a float32 partition costs half a
    float64 one, and the order of the cosines is the order of the logits. `exps`, if given, is a buffer like z for
    the exponentials (entropy needs z − max z and its exponentials at once; the others take them in place).

    With e = exp(z − max z) (the top term is exactly 1) and s = Σ e ≥ 1: lse = max z + log s, p = e/s, MCM = 1/s,
    Σ p log p = Σ e·(z − max z)/s − log s (both terms small where p_max ≈ 1: no cancellation, no logarithm per
    element). The other probabilities' sum is summed with the winner set to 0 rather than taken as 1 − p_max:
    at τ = 0.01 p_max is often within 1e-17 of 1, where 1 − p_max rounds to 0 and GEN would lose its largest term.
    Only what the requested scores need is computed; no (rows × C) array is normalised.
    """
    count, num_labels = z.shape
    rows = np.arange(count)
    winner = z.argmax(axis=1)
    peak = z[rows, winner]
    out: dict[str, np.ndarray] = {}
    if "maxlogit" in names:
        out["maxlogit"] = peak.copy()
    if set(names) <= {"maxlogit"}:
        return out
    shifted = np.subtract(z, peak[:, None], out=z)
    entropy = "entropy" in names
    if entropy:
        e = np.exp(shifted, out=exps if exps is not None else np.empty_like(shifted))
    else:
        e = np.exp(shifted, out=shifted)
    # e of the winner is exactly exp(0) = 1: the others' sum is summed without it, so that it keeps its digits.
    e[rows, winner] = 0.0
    others_e = e.sum(axis=1)
    total = 1.0 + others_e
    log_total = np.log(total)
    if "mcm" in names:
        out["mcm"] = 1.0 / total
    if "energy" in names:
        out["energy"] = peak + log_total
    if entropy:
        # The winner's term e·(z − max z) is 1·0: zeroing it above changes nothing.
        out["entropy"] = np.einsum("ij,ij->i", e, shifted) / total - log_total
    if "margin" in names:
        # top-1 minus top-2 probability; a single class has no second (margin = p = 1).
        second = e.max(axis=1) if num_labels > 1 else np.zeros(count)
        out["margin"] = (1.0 - second) / total
    if "gen" in names:
        m = min(gen_top_m, num_labels)
        if cosines is not None:
            cosines.partition(num_labels - m, axis=1)  # in place: the cosines are not needed after this
            top_e = np.exp(cosines[:, num_labels - m :] / np.float64(tau) - peak[:, None])
        else:
            e[rows, winner] = 1.0
            e.partition(num_labels - m, axis=1)  # in place: GEN is the last score to read e
            top_e = e[:, num_labels - m :]
        top = top_e / total[:, None]
        complement = 1.0 - top
        complement[rows, top.argmax(axis=1)] = others_e / total  # Σ_{c ≠ winner} p_c
        # One power of the product instead of two: p^γ(1 − p)^γ = (p(1 − p))^γ. Since p(1 − p) ≥ min(p, 1 − p)/2,
        # the product underflows only where a factor would.
        complement *= top
        out["gen"] = -np.power(complement, gen_gamma, out=complement).sum(axis=1)
    return {name: out[name] for name in names}


def logit_scores(
    images: np.ndarray,
    id_text: np.ndarray,
    *,
    names: Sequence[str] = LOGIT_SCORES,
    tau: float = TAU,
    gen_gamma: float = 0.1,
    gen_top_m: int = 100,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, np.ndarray]:
    """Logit-space scores (mcm, maxlogit, energy, gen, entropy, margin) over the ID labels, computed in one pass."""
    unknown = sorted(set(names) - set(LOGIT_SCORES))
    if unknown:
        raise ZeroShotError(f"unknown logit-space score(s) {unknown}; available: {', '.join(LOGIT_SCORES)}")
    if not (isinstance(gen_top_m, (int, np.integer)) and gen_top_m >= 1) or not gen_gamma > 0:
        raise ZeroShotError(
            f"gen needs gamma > 0 and an integer top_m >= 1; got gamma={gen_gamma!r}, top_m={gen_top_m!r}"
        )
    images = _check_images(images)
    texts = _check_texts("ID label embeddings", id_text, images.shape[1])
    tau = _check_tau(tau)
    out = {name: np.empty(images.shape[0]) for name in names}
    buffers = _LogitTile(texts.shape[0], entropy="entropy" in names)
    # Every ID logit of a row is needed at once (top-M, top-2, entropy); rows per chunk keep rows × C bounded.
    for chunk, tiles in _chunks_of_tiles(images.shape[0], 4 * texts.shape[0] + images.shape[1], chunk_bytes):
        block = np.asarray(images[chunk])
        for tile in tiles:
            z, cosines = buffers.logits_of(_image_tile(block, tile, chunk.start), texts, tau)
            rows = slice(chunk.start + tile.start, chunk.start + tile.stop)
            tile_exps = None if buffers.exps is None else buffers.exps[: z.shape[0]]
            scores = _scores_from_logits(z, names, gen_gamma, gen_top_m, cosines=cosines, tau=tau, exps=tile_exps)
            for name, values in scores.items():
                out[name][rows] = values
    return out


def glmcm_scores(
    images: np.ndarray,
    patches: np.ndarray,
    id_text: np.ndarray,
    *,
    tau: float = TAU,
    lam: float = 1.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """GL-MCM: global MCM plus λ times the largest per-patch MCM over the image's patches."""
    images = _check_images(images)
    patches = patches if isinstance(patches, np.ndarray) else np.asarray(patches)
    if patches.ndim != 3 or patches.shape[0] != images.shape[0] or patches.shape[2] != images.shape[1]:
        raise ZeroShotError(
            f"patch embeddings must have shape (N={images.shape[0]}, P, D={images.shape[1]}); got {patches.shape}"
        )
    if not np.isfinite(lam):
        raise ZeroShotError(f"lam must be a finite number; got {lam!r}")
    texts = _check_texts("ID label embeddings", id_text, images.shape[1])
    tau = _check_tau(tau)
    num_patches = patches.shape[1]
    out = np.empty(images.shape[0])
    width = 3 * num_patches * texts.shape[0] + num_patches * images.shape[1]
    for chunk, tiles in _chunks_of_tiles(images.shape[0], width, chunk_bytes):
        block, patch_block = np.asarray(images[chunk]), np.asarray(patches[chunk])
        for tile in tiles:
            rows = slice(chunk.start + tile.start, chunk.start + tile.stop)
            z = _logits(_image_tile(block, tile, chunk.start), texts, tau)
            global_mcm = np.exp(z.max(axis=1) - logsumexp(z))
            flat = patch_block[tile].reshape(-1, patches.shape[2])
            magnitude = _row_magnitudes(flat)
            bad = _bad_row(flat, magnitude)
            if bad is not None:
                image, patch = divmod(bad[0], num_patches)
                raise ZeroShotError(f"patch embedding {patch} of image row {rows.start + image} {bad[1]}")
            local = _unit(flat, magnitude)
            zl = _logits(local, texts, tau)
            local_mcm = np.exp(zl.max(axis=1) - logsumexp(zl)).reshape(-1, num_patches).max(axis=1)
            out[rows] = global_mcm + lam * local_mcm
    return out


# ---------------------------------------------------------------------------------------------- vocabulary scores
def neglabel_groups(num_negatives: int, groups: int, seed: int = 0) -> list[np.ndarray]:
    """Indices of the negatives in each of `groups` near-equal groups of a seeded permutation (platform-independent)."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ZeroShotError(f"groups must be an integer >= 1; got {groups!r}")
    if num_negatives and groups > num_negatives:
        raise ZeroShotError(f"cannot split {num_negatives} negative labels into {groups} groups")
    order = np.random.default_rng(seed).permutation(num_negatives) if groups > 1 else np.arange(num_negatives)
    return np.array_split(order, groups)


def neglabel_scores(
    images: np.ndarray,
    id_text: np.ndarray,
    neg_text: np.ndarray,
    *,
    tau: float = TAU,
    groups: int = 1,
    seed: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """NegLabel: share of Σ a(x, ·) on the ID labels with the negatives in the denominator, averaged over groups."""
    images = _check_images(images)
    texts = _check_texts("ID label embeddings", id_text, images.shape[1])
    negatives = _check_texts("negative label embeddings", neg_text, images.shape[1], allow_empty=True)
    tau = _check_tau(tau)
    if negatives.shape[0] == 0:
        neglabel_groups(0, groups, seed)  # validates `groups`
        return np.ones(images.shape[0])
    parts = neglabel_groups(negatives.shape[0], groups, seed)
    sizes = [len(p) for p in parts]
    grouped = negatives[np.concatenate(parts)]  # each group becomes a contiguous run of rows
    out = np.empty(images.shape[0])
    width = _block_width(texts.shape[0] + grouped.shape[0], images.shape[1])
    for chunk, tiles in _chunks_of_tiles(images.shape[0], width, chunk_bytes):
        block = np.asarray(images[chunk])
        for tile in tiles:
            hs = _scaled(_image_tile(block, tile, chunk.start), tau)
            lse_id, _ = _streaming_lse(hs, texts)
            # Σ_ID a / (Σ_ID a + Σ_g a) = sigmoid(lse_ID − lse_g), exact and overflow-free.
            shares = expit(lse_id[:, None] - _group_lse(hs, grouped, sizes))
            out[chunk.start + tile.start : chunk.start + tile.stop] = shares.mean(axis=1)
    return out


# Above 2/τ ≈ 700 a term exp(z − max) of a far group could underflow float64 (e^-745); such τ take the per-run path.
_SWEEP_MAX_RANGE = 700.0
# exp(x) of a float32 x at or above this is a normal float32 (its full relative precision): ln(2^-126) ≈ −87.34.
_FLOAT32_EXP_FLOOR = -87.0
# Group columns up to which a dense 0/1 product sums a label block (BLAS); beyond, a sparse one (cost ∝ members).
_DENSE_GROUP_COLUMNS = 128


def neglabel_sweep(
    images: np.ndarray,
    id_text: np.ndarray,
    vocab_text: np.ndarray,
    runs: Sequence[tuple[Sequence[int], int, int]],
    *,
    tau: float = TAU,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[np.ndarray]:
    """NegLabel for several negative sets drawn from the rows of one label matrix, in one pass over the images.

    `runs` holds (row indices into `vocab_text`, groups, seed) per run (a vocabulary's sweep points: M prefixes,
    k siblings per class, its union): each is `neglabel_scores(images, id_text, vocab_text[rows], groups=, seed=)`.
    Every image's similarities to each label are computed and exponentiated once, whatever the number of runs that
    hold the label, and each run's group sums are one product with a 0/1 membership matrix.
    """
    images = _check_images(images)
    texts = _check_texts("ID label embeddings", id_text, images.shape[1])
    vocab = _check_texts("negative label embeddings", vocab_text, images.shape[1], allow_empty=True)
    tau = _check_tau(tau)
    members, parts = _sweep_members(vocab.shape[0], runs)
    used = np.unique(np.concatenate([rows for rows in members if rows.size] or [np.zeros(0, np.int64)]))
    if 2.02 / tau > _SWEEP_MAX_RANGE or used.size == 0:
        given = np.asarray(vocab_text)
        return [
            neglabel_scores(images, id_text, given[rows], tau=tau, groups=g, seed=seed, chunk_bytes=chunk_bytes)
            for rows, (_, g, seed) in zip(members, runs, strict=True)
        ]
    labels = vocab[used]
    position = np.full(vocab.shape[0], -1, dtype=np.int64)
    position[used] = np.arange(used.size)
    membership, average = _sweep_matrices(members, parts, position, used.size)
    out = np.empty((images.shape[0], len(runs)))
    width = _block_width(texts.shape[0] + labels.shape[0], images.shape[1]) + membership.shape[1]
    for chunk, tiles in _chunks_of_tiles(images.shape[0], width, chunk_bytes):
        block = np.asarray(images[chunk])
        for tile in tiles:
            hs = _scaled(_image_tile(block, tile, chunk.start), tau)
            lse_id, _ = _streaming_lse(hs, texts)
            peak, sums = _streaming_member_sums(hs, labels, membership)
            # A run with no negatives has group columns that sum to 0: log 0 = −inf, so its share is exactly 1.
            with np.errstate(divide="ignore"):
                shares = expit(lse_id[:, None] - (peak[:, None] + np.log(sums)))
            out[chunk.start + tile.start : chunk.start + tile.stop] = shares @ average
    return [out[:, r].copy() for r in range(len(runs))]


def _sweep_members(
    num_labels: int, runs: Sequence[tuple[Sequence[int], int, int]]
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Each run's rows (checked to lie in the label matrix, without repeats) and its groups (`neglabel_groups`)."""
    members, parts = [], []
    for number, (rows, groups, seed) in enumerate(runs):
        array = np.asarray(rows, dtype=np.int64).reshape(-1)
        if array.size and (array.min() < 0 or array.max() >= num_labels):
            raise ZeroShotError(f"run {number}: a row index lies outside the {num_labels} negative labels")
        if np.unique(array).size != array.size:
            raise ZeroShotError(f"run {number}: a negative label is listed twice")
        members.append(array)
        parts.append(neglabel_groups(array.size, groups, seed))  # validates `groups`
    return members, parts


def _sweep_matrices(
    members: list[np.ndarray], parts: list[list[np.ndarray]], position: np.ndarray, num_used: int
) -> tuple[Any, np.ndarray]:
    """(labels × group columns) 0/1 membership and (group columns × runs) averaging matrix."""
    from scipy import sparse

    label_of, column_of = [], []
    average = np.zeros((sum(len(groups) for groups in parts), len(members)))
    column = 0
    for number, (rows, groups) in enumerate(zip(members, parts, strict=True)):
        for part in groups:
            label_of.append(position[rows[part]])
            column_of.append(np.full(part.size, column, dtype=np.int64))
            average[column, number] = 1.0 / len(groups)
            column += 1
    matrix = sparse.csr_array(
        (np.ones(sum(a.size for a in label_of)), (np.concatenate(label_of), np.concatenate(column_of))),
        shape=(num_used, column),
    )
    return (matrix.toarray() if column <= _DENSE_GROUP_COLUMNS else matrix), average


def _streaming_member_sums(hs: np.ndarray, labels: np.ndarray, membership: Any) -> tuple[np.ndarray, np.ndarray]:
    """(max_l z_l, Σ_l exp(z_l − max) · membership[l, j]) per row over all labels, one label block at a time.

    One maximum serves every group, so a term may lie far below it: a block whose shifted logits all stay above
    float32's smallest normal exponent is exponentiated in float32 (as `_streaming_lse` does), any other in float64,
    where every term, down to e^-(2/τ), is representable for 2/τ < `_SWEEP_MAX_RANGE`. Sums are float64.
    """
    peak = np.full(hs.shape[0], -np.inf)
    sums = np.zeros((hs.shape[0], membership.shape[1]))
    for cols in iter_chunks(labels.shape[0], LABEL_BLOCK):
        z = hs @ labels[cols].T
        new_peak = np.maximum(peak, z.max(axis=1))
        z -= new_peak.astype(np.float32)[:, None]
        if z.min() >= _FLOAT32_EXP_FLOOR:
            terms = np.exp(z, out=z).astype(np.float64)
        else:
            terms = np.exp(z.astype(np.float64))
        sums *= np.exp(peak - new_peak)[:, None]
        part = membership[cols]
        sums += terms @ part if isinstance(part, np.ndarray) else (part.T @ terms.T).T
        peak = new_peak
    return peak, sums


def eoe_scores(
    images: np.ndarray,
    id_text: np.ndarray,
    outlier_text: np.ndarray,
    *,
    tau: float = TAU,
    beta: float = 0.25,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """EOE: max ID probability − β · max outlier probability under one softmax over ID and outlier labels."""
    images = _check_images(images)
    texts = _check_texts("ID label embeddings", id_text, images.shape[1])
    outliers = _check_texts("outlier label embeddings", outlier_text, images.shape[1], allow_empty=True)
    tau = _check_tau(tau)
    if not np.isfinite(beta):
        raise ZeroShotError(f"beta must be a finite number; got {beta!r}")
    out = np.empty(images.shape[0])
    width = _block_width(texts.shape[0] + outliers.shape[0], images.shape[1])
    for chunk, tiles in _chunks_of_tiles(images.shape[0], width, chunk_bytes):
        block = np.asarray(images[chunk])
        for tile in tiles:
            rows = slice(chunk.start + tile.start, chunk.start + tile.stop)
            hs = _scaled(_image_tile(block, tile, chunk.start), tau)
            lse_id, max_id = _streaming_lse(hs, texts)
            if outliers.shape[0] == 0:
                out[rows] = np.exp(max_id - lse_id)
                continue
            lse_out, max_out = _streaming_lse(hs, outliers)
            lse_all = np.logaddexp(lse_id, lse_out)
            out[rows] = np.exp(max_id - lse_all) - beta * np.exp(max_out - lse_all)
    return out


# ---------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ZeroShotScore:
    """A zero-shot score: what it needs (a vocabulary role, patch embeddings), its defaults and its paper."""

    name: str
    vocabulary: str | None  # None, "negatives" or "outliers"
    needs_patches: bool
    defaults: Mapping[str, Any]
    paper: Paper
    compute: Callable[..., np.ndarray] = field(repr=False)

    @property
    def logit_space(self) -> bool:
        """True for scores that use the ID labels only (no vocabulary)."""
        return self.vocabulary is None


def _logit_compute(name: str) -> Callable[..., np.ndarray]:
    def compute(images: np.ndarray, id_text: np.ndarray, **params: Any) -> np.ndarray:
        gen = {k: params.pop(k) for k in ("gamma", "top_m") if k in params}
        return logit_scores(
            images, id_text, names=(name,), gen_gamma=gen.get("gamma", 0.1), gen_top_m=gen.get("top_m", 100), **params
        )[name]

    return compute


_MCM = Paper(
    "Ming et al., Delving into Out-of-Distribution Detection with Vision-Language Representations",
    "NeurIPS 2022",
    "https://arxiv.org/abs/2211.13445",
)
_SCORE_LIST = [
    ZeroShotScore("mcm", None, False, {"tau": TAU}, _MCM, _logit_compute("mcm")),
    ZeroShotScore(
        "maxlogit",
        None,
        False,
        {"tau": TAU},
        Paper(
            "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings",
            "ICML 2022",
            "https://arxiv.org/abs/1911.11132",
        ),
        _logit_compute("maxlogit"),
    ),
    ZeroShotScore(
        "energy",
        None,
        False,
        {"tau": TAU},
        Paper(
            "Liu et al., Energy-based Out-of-distribution Detection", "NeurIPS 2020", "https://arxiv.org/abs/2010.03759"
        ),
        _logit_compute("energy"),
    ),
    ZeroShotScore(
        "gen",
        None,
        False,
        {"tau": TAU, "gamma": 0.1, "top_m": 100},
        Paper(
            "Liu, Lochman & Zach, GEN: Pushing the Limits of Softmax-Based Out-of-Distribution Detection",
            "CVPR 2023",
            "https://openaccess.thecvf.com/content/CVPR2023/html/Liu_GEN_Pushing_the_Limits_of_Softmax-Based_Out-of-Distribution_Detection_CVPR_2023_paper.html",
        ),
        _logit_compute("gen"),
    ),
    ZeroShotScore(
        "entropy",
        None,
        False,
        {"tau": TAU},
        Paper(_MCM.citation, _MCM.venue, _MCM.url, "negative Shannon entropy of MCM's softmax over the ID labels"),
        _logit_compute("entropy"),
    ),
    ZeroShotScore(
        "margin",
        None,
        False,
        {"tau": TAU},
        Paper(_MCM.citation, _MCM.venue, _MCM.url, "top-1 minus top-2 probability of MCM's softmax"),
        _logit_compute("margin"),
    ),
    ZeroShotScore(
        "glmcm",
        None,
        True,
        {"tau": TAU, "lam": 1.0},
        Paper(
            "Miyai et al., GL-MCM: Global and Local Maximum Concept Matching for Zero-Shot Out-of-Distribution Detection",
            "IJCV 2025",
            "https://arxiv.org/abs/2304.04521",
        ),
        glmcm_scores,
    ),
    ZeroShotScore(
        "neglabel",
        "negatives",
        False,
        {"tau": TAU, "groups": 1, "seed": 0},
        Paper(
            "Jiang et al., Negative Label Guided OOD Detection with Pretrained Vision-Language Models",
            "ICLR 2024",
            "https://arxiv.org/abs/2403.20078",
        ),
        neglabel_scores,
    ),
    ZeroShotScore(
        "eoe",
        "outliers",
        False,
        {"tau": TAU, "beta": 0.25},
        Paper(
            "Cao et al., Envisioning Outlier Exposure by Large Language Models for Out-of-Distribution Detection",
            "ICML 2024",
            "https://arxiv.org/abs/2406.00806",
        ),
        eoe_scores,
    ),
]
SCORES: dict[str, ZeroShotScore] = {score.name: score for score in _SCORE_LIST}


def available_scores() -> list[str]:
    """Names of the zero-shot scores, in documentation order."""
    return list(SCORES)


def get_score(name: str) -> ZeroShotScore:
    """The score registered under `name`."""
    try:
        return SCORES[name]
    except KeyError:
        raise ZeroShotError(f"unknown zero-shot score {name!r}; available: {', '.join(SCORES)}") from None


def compute_score(
    name: str,
    images: np.ndarray,
    id_text: np.ndarray,
    *,
    vocab_text: np.ndarray | None = None,
    patches: np.ndarray | None = None,
    **params: Any,
) -> np.ndarray:
    """Scores (N,) of one named zero-shot score; `vocab_text` for neglabel/eoe, `patches` for glmcm."""
    score = get_score(name)
    unknown = sorted(set(params) - set(score.defaults))
    if unknown:
        raise ZeroShotError(f"{name} has no parameter {', '.join(unknown)}; its parameters: {dict(score.defaults)}")
    merged = {**score.defaults, **params}
    if score.needs_patches:
        if patches is None:
            raise ZeroShotError(f"{name} needs patch embeddings (the store's extra.patch_embeddings)")
        return score.compute(images, patches, id_text, **merged)
    if score.vocabulary is not None:
        if vocab_text is None:
            raise ZeroShotError(f"{name} needs the embeddings of its {score.vocabulary} vocabulary")
        return score.compute(images, id_text, vocab_text, **merged)
    return score.compute(images, id_text, **merged)
