"""Detectors that keep patterns of the fit set: SHE's class patterns, OpenMax's class means and Weibull tails, and
the relation graph's bank of normalised features and probabilities."""

from __future__ import annotations

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import l2_normalize, logsumexp_in_place, softmax
from ..core.outputs import Head, Outputs
from ..util.chunking import iter_chunks
from ._streaming import fit_chunks
from .base import Detector, Paper, Requirements, Summary
from .fitsize import FitSize
from .registry import register
from .state import Array, Scalar


def _add_class_sums(sums: np.ndarray, counts: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> None:
    """Add the rows to the float64 sums of their classes (a sparse one-hot product: O(rows x D), no Python loop)."""
    import scipy.sparse  # imported on use: `oodbench --help` does not load scipy

    if labels.size == 0:
        return
    one_hot = scipy.sparse.csr_matrix(
        (np.ones(labels.shape[0]), (labels, np.arange(labels.shape[0]))), shape=(sums.shape[0], labels.shape[0])
    )
    sums += one_hot @ np.asarray(rows, dtype=np.float64)
    counts += np.bincount(labels, minlength=counts.shape[0])


def _every_class_problems(size: FitSize) -> list[str]:
    """A pattern per class of the head needs fit rows of every class; known before extraction from the labels."""
    if size.classes is None or size.head_classes is None or size.classes >= size.head_classes:
        return []
    return [
        f"the fit set has rows of {size.classes} classes but the model's head has {size.head_classes}: a pattern "
        "is built per head class from its fit rows, so fit on rows of every class (labels that are the head's "
        "class indices), or leave this detector out"
    ]


def _selected_rows(logits: np.ndarray, labels: np.ndarray, fallback: np.ndarray | None) -> np.ndarray:
    """The rows a class pattern is built from: correctly classified ones, or all rows of a fallback class."""
    correct = np.asarray(logits).argmax(axis=1) == labels
    return correct if fallback is None else correct | fallback[labels]


def _correct_class_means(
    name: str, fit_set: Outputs, values: str, row_width: int, minimum: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class: the mean of `values` (features or logits) over the fit rows correctly classified as that class.

    A class with fewer than `minimum` correctly classified rows (a weak head on a small fit set) falls back to all of
    its labelled rows; the third result marks those classes. A class without any fit row is an error.
    """
    num_classes = int(fit_set.num_classes)
    dim = getattr(fit_set, values).shape[1]
    sums, counts = np.zeros((num_classes, dim)), np.zeros(num_classes, dtype=np.int64)
    all_sums, all_counts = np.zeros((num_classes, dim)), np.zeros(num_classes, dtype=np.int64)
    for rows in fit_chunks(len(fit_set), row_width, f"{name}: class means"):
        labels = np.asarray(fit_set.labels[rows])  # in [0, C): Detector.fit checks them first
        correct = _selected_rows(fit_set.logits[rows], labels, None)
        block = np.asarray(getattr(fit_set, values)[rows])
        _add_class_sums(sums, counts, block[correct], labels[correct])
        _add_class_sums(all_sums, all_counts, block, labels)
    missing = np.flatnonzero(all_counts == 0)
    if missing.size:
        listed = ", ".join(str(c) for c in missing[:5]) + (", ..." if missing.size > 5 else "")
        raise DetectorError(
            f"{name}: {missing.size} classes ({listed}) have no fit row, so they have no pattern; fit on rows of "
            "every class"
        )
    fallback = counts < minimum
    sums[fallback], counts[fallback] = all_sums[fallback], all_counts[fallback]
    return sums / counts[:, None], counts, fallback


@register("she")
class SHE(Detector):
    """Simplified Hopfield energy: z · S_ŷ, S_c the mean feature of the fit rows correctly classified as c."""

    requires = Requirements.of(fit=("features", "logits", "labels"), score=("features", "logits"))
    # Per class: the pattern (mean of correctly classified rows), how many rows made it, and whether the class fell back
    # to all its rows.
    state = {
        "patterns_": Array("float64", ("C", "D")),
        "class_counts_": Array("int64", ("C",)),
        "fallback_classes_": Array("bool", ("C",)),
    }
    paper = Paper(
        "Zhang et al., Out-of-Distribution Detection based on In-Distribution Data Patterns Memorization with "
        "Modern Hopfield Energy",
        "ICLR 2023",
        "https://openreview.net/forum?id=KkazG4lgKL",
        "no hyper-parameters: stored patterns are the class means of the penultimate features of correctly "
        "classified fit rows (prediction = argmax of the logits); the score is the inner product with the pattern "
        "of the predicted class (OpenOOD's she.yml metric inner_product); a class without a correctly classified "
        "fit row falls back to the mean of all its fit rows (fallback_classes_)",
    )
    summary = Summary(
        "z · S_ŷ, S_c the mean z of fit rows correctly classified as c",
        also_in="pytorch-ood, OpenOOD",
        agreement="1.2e-7 relative (pytorch-ood and OpenOOD, float32)",
    )

    def size_problems(self, size: FitSize) -> list[str]:
        return _every_class_problems(size)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        width = 2 * fit_set.num_features + int(fit_set.num_classes)
        self.patterns_, self.class_counts_, self.fallback_classes_ = _correct_class_means(
            "she", fit_set, "features", width
        )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        predicted = np.asarray(chunk.logits).argmax(axis=1)
        return np.einsum("nd,nd->n", np.asarray(chunk.features, dtype=np.float64), self.patterns_[predicted])

    def _row_width(self, test: Outputs) -> int:
        return 3 * test.num_features + int(test.num_classes or 0)


# libMR (the C library behind the official OpenMax code) shifts each tail by this constant before its Weibull fit.
_LIBMR_TRANSLATION = 10000.0


def _openmax_distance(values: np.ndarray, centres: np.ndarray, euclidean: float, cosine: float) -> np.ndarray:
    """euclidean · ‖v − μ‖ + cosine · (1 − cos(v, μ)) over the last axis (v and μ broadcast against each other)."""
    distance = np.zeros(np.broadcast_shapes(values.shape, centres.shape)[:-1])
    if euclidean:
        difference = values - centres
        distance += euclidean * np.sqrt(np.einsum("...c,...c->...", difference, difference))
    if cosine:
        dot = np.einsum("...c,...c->...", values, centres)
        norms = np.sqrt(np.einsum("...c,...c->...", values, values) * np.einsum("...c,...c->...", centres, centres))
        # A zero vector has no direction: count it as orthogonal (cosine distance 1) rather than NaN.
        similarity = np.divide(dot, norms, out=np.zeros_like(dot), where=norms > 0)
        distance += cosine * (1.0 - similarity)
    return distance


def _weibull_fits(tails: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shape and scale of the two-parameter Weibull MLE of each row's libMR-shifted tail t + 10000 − min t.

    `tails` is (classes x L), row c holding its counts[c] values first (the rest ignored). The shape k solves the
    likelihood equation g(k) = Σ w y / Σ w − 1/k − mean y = 0 with y = log(x / max x), w = exp(k y); g is
    increasing (g' = Var_w(y) + 1/k² > 0), so safeguarded Newton steps, all classes at once, reach its root to
    float64 precision; y is taken as log1p((t − max t) / max x), exact where log x − log max x is not. (scipy's
    weibull_min.fit solves the same equation per class, ~1e-6 short of the root for such tails, whose shapes are
    1e4-1e6, at 30 ms a class; the tests compare its likelihood with this one.)
    """
    valid = np.arange(tails.shape[1])[None, :] < counts[:, None]
    values = np.where(valid, tails, np.nan)
    top_value, low_value = np.nanmax(values, axis=1), np.nanmin(values, axis=1)
    top = top_value + _LIBMR_TRANSLATION - low_value
    logs = np.where(valid, np.log1p((values - top_value[:, None]) / top[:, None]), 0.0)
    mean_log = logs.sum(axis=1) / counts
    spread = np.sqrt((np.where(valid, logs - mean_log[:, None], 0.0) ** 2).sum(axis=1) / counts)
    shape = 1.2825 / spread  # the method-of-moments start: the sd of log x is π/(k√6) for a Weibull
    low, high = np.zeros_like(shape), np.full_like(shape, np.inf)
    for _ in range(200):
        weights = np.where(valid, np.exp(shape[:, None] * logs), 0.0)
        weights /= weights.sum(axis=1, keepdims=True)
        mean = (weights * logs).sum(axis=1)
        variance = (weights * (logs - mean[:, None]) ** 2).sum(axis=1)
        value = mean - 1.0 / shape - mean_log
        low = np.where(value < 0, shape, low)
        high = np.where(value > 0, shape, high)
        proposal = shape - value / (variance + 1.0 / shape**2)
        outside = ~((low < proposal) & (proposal < high))
        proposal = np.where(outside, np.where(np.isinf(high), 2.0 * shape, 0.5 * (low + high)), proposal)
        done = (np.abs(proposal - shape) <= 4 * np.finfo(np.float64).eps * shape) | (value == 0)
        shape = np.where(value == 0, shape, proposal)
        if done.all():
            break
    else:
        raise DetectorError("openmax: a Weibull fit did not converge in 200 Newton steps")
    # (mean x^k)^(1/k) without forming x^k (it overflows for these shapes).
    scale = top * (np.where(valid, np.exp(shape[:, None] * logs), 0.0).sum(axis=1) / counts) ** (1.0 / shape)
    return shape, scale


def _largest_per_class(
    kept: tuple[np.ndarray, np.ndarray], classes: np.ndarray, values: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge (classes, values) into the kept (classes, values), keeping the `size` largest values of each class."""
    classes = np.concatenate([kept[0], classes])
    values = np.concatenate([kept[1], values])
    order = np.lexsort((-values, classes))
    classes, values = classes[order], values[order]
    starts = np.flatnonzero(np.r_[True, classes[1:] != classes[:-1]])
    lengths = np.diff(np.r_[starts, classes.shape[0]])
    rank = np.arange(classes.shape[0]) - np.repeat(starts, lengths)
    keep = rank < size
    return classes[keep], values[keep]


@register("openmax")
class OpenMax(Detector):
    """OpenMax: log P(known) after revising the top-α logits by per-class Weibull models of distances to class means.

    Fit: the mean activation vector μ_c (mean logits of the fit rows correctly classified as c), and for each class a
    two-parameter Weibull fitted by maximum likelihood to its `tail` largest distances d(f, μ_c), shifted as
    libMR's FitHigh does (d + 10000 − smallest tail distance). Score: for the α classes of largest logit, rank
    i = 1..α, w_c = WeibullCDF(d(f, μ_c)) · (α + 1 − i)/α; v_c = f_c (1 − w_c) and v_0 = Σ_c f_c w_c;
    P = softmax(v_0, v_1, …, v_C). The score log(1 − P_0) orders rows as −P_0 (the peers' score) without
    saturating where P_0 rounds to 1.
    """

    requires = Requirements.of(fit=("logits", "labels"), score=("logits",))
    state = {
        "alpha_": Scalar(int, 1, "C"),
        "means_": Array("float64", ("C", "C")),
        "class_counts_": Array("int64", ("C",)),
        "fallback_classes_": Array("bool", ("C",)),
        "tail_minimum_": Array("float64", ("C",)),
        "shape_": Array("float64", ("C",)),
        "scale_": Array("float64", ("C",)),
    }
    paper = Paper(
        "Bendale & Boult, Towards Open Set Deep Networks",
        "CVPR 2016",
        "https://arxiv.org/abs/1511.06233",
        "tail=20, alpha=10 and the distance eucos = euclidean/200 + cosine: the official code's WEIBULL_TAIL_SIZE, "
        "ALPHA_RANK and default distance (github.com/abhijitbendale/OSDN); alpha is capped at C; OpenOOD uses "
        "alpha=3 with the plain euclidean distance, pytorch-ood tail 25, alpha 10, euclidean (euclidean=1, "
        "cosine=0); a class with fewer than 2 correctly classified fit rows falls back to all its fit rows",
    )
    summary = Summary(
        "log P(known) after revising the top-α logits by per-class Weibull tails of distances to class mean logits",
        defaults="eucos = euclidean/200 + cosine: the official code",
        also_in="pytorch-ood, OpenOOD",
        agreement="P(unknown) to 3.6e-4 absolute, 2.3e-3 relative; AUROC 0.8741 vs 0.8744 (pytorch-ood's Nelder-Mead Weibull fit stops short of the MLE). pytorch-ood clips the revised logits at 709 before exp, without subtracting the row maximum: on large logits P(unknown) comes out exactly 1 (or 0) for many rows, which then tie; log P(known) here keeps them ranked",
    )

    def __init__(self, tail: int = 20, alpha: int = 10, euclidean: float = 1.0 / 200.0, cosine: float = 1.0) -> None:
        self.tail = tail
        self.alpha = alpha
        self.euclidean = euclidean
        self.cosine = cosine

    def _validate_params(self) -> None:
        self._check_int(minimum=2, tail=self.tail)
        self._check_int(alpha=self.alpha)
        for key in ("euclidean", "cosine"):
            value = getattr(self, key)
            if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value) or value < 0:
                raise DetectorError(f"openmax: {key} (a distance weight) must be a number >= 0; got {value!r}")
        if not self.euclidean and not self.cosine:
            raise DetectorError("openmax: euclidean and cosine weights are both 0; give one a positive weight")

    def size_problems(self, size: FitSize) -> list[str]:
        return _every_class_problems(size)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        num_classes = int(fit_set.num_classes)
        self.alpha_ = min(int(self.alpha), num_classes)
        self.means_, self.class_counts_, self.fallback_classes_ = _correct_class_means(
            "openmax", fit_set, "logits", 4 * num_classes, minimum=2
        )
        kept = (np.empty(0, dtype=np.int64), np.empty(0))
        for rows in fit_chunks(len(fit_set), 4 * num_classes, "openmax: distance tails"):
            labels = np.asarray(fit_set.labels[rows])
            logits = np.asarray(fit_set.logits[rows], dtype=np.float64)
            selected = _selected_rows(logits, labels, self.fallback_classes_)
            labels, logits = labels[selected], logits[selected]
            distances = _openmax_distance(logits, self.means_[labels], self.euclidean, self.cosine)
            kept = _largest_per_class(kept, labels.astype(np.int64), distances, int(self.tail))
        classes, tails = kept
        counts = np.bincount(classes, minlength=num_classes)
        starts = np.searchsorted(classes, np.arange(num_classes))
        table = np.zeros((num_classes, max(int(counts.max(initial=0)), 1)))
        table[classes, np.arange(classes.shape[0]) - starts[classes]] = tails
        few = np.flatnonzero(counts < 2)
        if few.size:
            raise DetectorError(
                f"openmax: class {few[0]} has {counts[few[0]]} fit rows for its tail; a Weibull fit needs at least 2"
            )
        filled = np.arange(table.shape[1])[None, :] < counts[:, None]
        flat = np.flatnonzero(
            np.where(filled, table, -np.inf).max(axis=1) == np.where(filled, table, np.inf).min(axis=1)
        )
        if flat.size:
            raise DetectorError(
                f"openmax: the tail of class {flat[0]} holds {counts[flat[0]]} equal distances; a Weibull fit needs 2 "
                "distinct ones"
            )
        self.tail_minimum_ = np.where(filled, table, np.inf).min(axis=1)
        self.shape_, self.scale_ = _weibull_fits(table, counts)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        from scipy.stats import weibull_min

        logits = np.asarray(chunk.logits, dtype=np.float64)
        num_classes, alpha = logits.shape[1], self.alpha_
        rows = np.arange(logits.shape[0])[:, None]
        # The α largest logits in descending order (ties by class index, as a stable sort would).
        top = np.argpartition(-logits, alpha - 1, axis=1)[:, :alpha]
        order = np.lexsort((top, -logits[rows, top]), axis=1)
        top = top[rows, order]
        distances = _openmax_distance(logits[:, None, :], self.means_[top], self.euclidean, self.cosine)
        shifted = distances + _LIBMR_TRANSLATION - self.tail_minimum_[top]
        probability = weibull_min.cdf(shifted, self.shape_[top], scale=self.scale_[top])
        weight = probability * ((alpha + 1 - np.arange(1, alpha + 1)) / alpha)
        top_logits = logits[rows, top]
        revised = np.empty((logits.shape[0], num_classes + 1))
        revised[:, 1:] = logits
        revised[rows, top + 1] = top_logits * (1.0 - weight)
        revised[:, 0] = np.einsum("nk,nk->n", top_logits, weight)
        known = logsumexp_in_place(revised[:, 1:].copy())
        unknown = revised[:, 0].copy()
        total = logsumexp_in_place(revised)
        # log(1 − P_0) from log P_0 = v_0 − log Σ exp v: log1p(−P_0) keeps its relative precision where P_0 is tiny
        # (ID rows: a difference of log-sum-exps would round to 0 there), the log-sum-exp difference where P_0 → 1.
        log_unknown = unknown - total
        small = log_unknown < -np.log(2.0)
        return np.where(small, np.log1p(-np.exp(np.minimum(log_unknown, -np.log(2.0)))), known - total)

    def _row_width(self, test: Outputs) -> int:
        return (2 * self.alpha_ + 4) * int(test.num_classes or 1)


@register("relation")
class Relation(Detector):
    """Neural relation graph: Σ_j k(x, x_j)^t over the edges with k > threshold, k = max(ẑ·ẑ_j, 0) · (p·p_j)."""

    requires = Requirements.of(fit=("features", "logits"), score=("features", "logits"))
    # B bank rows: every hop-th fit row.
    state = {"bank_features_": Array("float32", ("B", "D")), "bank_probs_": Array("float32", ("B", "C"))}
    state_dims = {"B": "N"}
    paper = Paper(
        "Kim, Yun & Song, Neural Relation Graph: A Unified Framework for Identifying Label Noise and Outlier Data",
        "NeurIPS 2023",
        "https://arxiv.org/abs/2301.12321",
        "power=1 (the official OOD script warns that other temperatures are worse for OOD; OpenOOD's relation.yml "
        "pow=1), threshold=0.03 and hop=1 (every fit row in the bank): the official defaults; the bank holds the "
        "ℓ2-normalised features and softmax probabilities of the fit rows as float32, (D + C) x 4 bytes per row; "
        "products and the threshold test run in float64",
    )
    summary = Summary(
        "Σ_j k^t over edges k > 0.03, k = max(ẑ·ẑ_j, 0)·(p·p_j), j over the fit rows",
        defaults="the official code",
        also_in="OpenOOD",
        agreement="1.7e-7 relative (OpenOOD's float32 kernel)",
    )
    # Bank rows per product: the (test rows x bank rows) kernel blocks stay within the chunk budget.
    bank_tile: int = 2048

    def __init__(self, power: float = 1.0, threshold: float = 0.03, hop: int = 1) -> None:
        self.power = power
        self.threshold = threshold
        self.hop = hop

    def _validate_params(self) -> None:
        self._check_positive(power=self.power)
        self._check_int(hop=self.hop)
        value = self.threshold
        if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value) or value < 0:
            raise DetectorError(f"relation: threshold must be a number >= 0; got {value!r}")

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        index = np.arange(0, len(fit_set), int(self.hop))
        dim, num_classes = fit_set.num_features, int(fit_set.num_classes)
        self.bank_features_ = np.empty((index.shape[0], dim), dtype=np.float32)
        self.bank_probs_ = np.empty((index.shape[0], num_classes), dtype=np.float32)
        for part in fit_chunks(index.shape[0], 2 * (dim + num_classes), "relation: bank"):
            rows = index[part]
            self.bank_features_[part] = l2_normalize(fit_set.features[rows])
            self.bank_probs_[part] = softmax(fit_set.logits[rows])

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = l2_normalize(chunk.features)
        probs = softmax(chunk.logits)
        score = np.zeros(features.shape[0])
        for tile in iter_chunks(self.bank_features_.shape[0], self.bank_tile):
            kernel = features @ self.bank_features_[tile].astype(np.float64).T
            np.maximum(kernel, 0.0, out=kernel)
            kernel *= probs @ self.bank_probs_[tile].astype(np.float64).T
            kernel[kernel <= self.threshold] = 0.0
            if self.power != 1:
                np.power(kernel, float(self.power), out=kernel)
            score += kernel.sum(axis=1)
        return score

    def _row_width(self, test: Outputs) -> int:
        return 2 * (test.num_features + int(test.num_classes or 0)) + 3 * self.bank_tile
