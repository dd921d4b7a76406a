"""Shared fit statistics: detectors fitted on the same fit set read it once, through one provider.

A detector declares the sufficient statistics it learns from in `shared_statistics` (names of `STATISTICS`) and
asks `statistics_for(self, fit_set)` for them in `_fit`. Fitted alone, it gets a private provider that computes
just its own statistics in one pass (as before). Fitted with others through `fit_all`, or with
`detector.fit(fit_set, head, stats=provider)`, every detector gets the same provider, which computes the union of
what they declared in a single streamed pass the first time any of them asks, and hands each its part.

This module builds on the base class, never the reverse: `Detector.fit` only keeps the provider it is given on the
instance while `_fit` runs, and `statistics_for` is what reads it.

    fitted = fit_all([create("maha"), create("rmaha++"), create("vim")], fit_set, head)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import softmax
from ..core.outputs import Head, Outputs
from ..util.chunking import iter_chunks
from ._blas import blas_threads, one_blas_thread
from ._gaussian import GRAM_DTYPES, SYRK_ROWS, ScatterAccumulator, check_gram_dtype
from ._streaming import fit_chunks
from .base import Detector

__all__ = [
    "GRAM_DTYPES",
    "STATISTICS",
    "FitStatistics",
    "check_gram_dtype",
    "fit_all",
    "gram_key",
    "statistics_for",
    "uses_gram",
]

STATISTICS = {
    "features": "count, mean and Gram matrix of the features (ScatterAccumulator)",
    "features_by_class": "the same with per-class sums of the features (needs labels)",
    "class_sums": "per-class sums and counts of the features (needs labels)",
    "mean": "mean of the features",
    "normalized_by_class": "count, mean, Gram matrix and per-class sums of the ℓ2-normalised features",
    "max_logit_sum": "sum over rows of the largest logit",
    "prediction_templates": "per predicted class: the sum of the softmax vectors and the count of rows",
}
# Every raw-feature statistic is one ScatterAccumulator; these need its Gram matrix, these its class sums.
_RAW = frozenset({"features", "features_by_class", "class_sums", "mean"})
_RAW_GRAM = frozenset({"features", "features_by_class"})
_RAW_CLASSES = frozenset({"features_by_class", "class_sums"})
_RAW_SUM = _RAW - {"class_sums"}  # class sums alone need no sum of all rows
_LOGITS = frozenset({"max_logit_sum", "prediction_templates"})
_GRAM = _RAW_GRAM | {"normalized_by_class"}


def declared_statistics(detector: Detector | type[Detector]) -> frozenset[str]:
    """The statistics a detector (or detector class) declares (its `shared_statistics`; none if it does not share)."""
    return frozenset(getattr(detector, "shared_statistics", frozenset()))


def uses_gram(detector: Detector | type[Detector]) -> bool:
    """Whether a detector learns from a Gram matrix, so that the Gram precision (gram_dtype) changes its fit."""
    return bool(declared_statistics(detector) & _GRAM)


def gram_key(detector: Detector | type[Detector], gram_dtype: str) -> str | None:
    """What a fit's cache key adds for its Gram precision: None where the default float64 (or no Gram) is used, so
    those keys stay as they were before the precision was an option."""
    if check_gram_dtype(gram_dtype) == "float64" or not uses_gram(detector):
        return None
    return f"gram:{gram_dtype}"


class FitStatistics:
    """Sufficient statistics of one fit set, computed lazily in one streamed pass for every declared need."""

    def __init__(
        self, fit_set: Outputs, needs: Iterable[str] = (), *, gram_dtype: str = "float64", description: str = ""
    ) -> None:
        if not isinstance(fit_set, Outputs):
            raise DetectorError(f"fit statistics need an Outputs fit set, got {type(fit_set).__name__}")
        check_gram_dtype(gram_dtype)
        self.fit_set = fit_set
        self.gram_dtype = gram_dtype
        self.description = description or "shared fit statistics"
        self.declared: set[str] = set()
        self.declare(needs)
        self.passes = 0  # streamed passes over the fit set so far (one, when every need was declared up front)
        self._values: dict[str, Any] = {}

    @classmethod
    def for_detectors(
        cls, fit_set: Outputs, detectors: Iterable[Detector], head: Head | None = None, *, gram_dtype: str = "float64"
    ) -> FitStatistics:
        """A provider declaring the needs of every detector whose fit requirements this fit set (and head) meet."""
        names: list[str] = []
        needs: set[str] = set()
        available = fit_set.array_names()
        for detector in detectors:
            if not detector.unmet(available, has_head=head is not None):
                declared = declared_statistics(detector)
                needs |= declared
                if declared:
                    names.append(detector.name)
        description = "shared statistics (" + ", ".join(dict.fromkeys(names)) + ")" if names else ""
        return cls(fit_set, needs, gram_dtype=gram_dtype, description=description)

    def declare(self, needs: Iterable[str]) -> None:
        """Add needs to be computed by the next pass."""
        needs = set(needs)
        unknown = sorted(needs - set(STATISTICS))
        if unknown:
            raise DetectorError(f"unknown fit statistics {unknown}; known: {', '.join(STATISTICS)}")
        self.declared |= needs

    def get(self, need: str) -> Any:
        """One statistic; the first request computes every declared statistic not yet computed, in one pass."""
        if need not in self._values:
            self.declare([need])
            self._compute(self.declared - set(self._values))
        return self._values[need]

    # ----------------------------------------------------------------- the pass
    def _compute(self, needs: set[str]) -> None:
        fit_set = self.fit_set
        dim = fit_set.num_features
        raw = None
        if needs & _RAW:
            raw = ScatterAccumulator(
                dim,
                by_class=bool(needs & _RAW_CLASSES),
                with_gram=bool(needs & _RAW_GRAM),
                gram_dtype=self.gram_dtype,
                with_sum=bool(needs & _RAW_SUM),
            )
        normalized = None
        if "normalized_by_class" in needs:
            normalized = ScatterAccumulator(dim, by_class=True, gram_dtype=self.gram_dtype)
        labelled = (raw is not None and raw.by_class) or normalized is not None
        if labelled and fit_set.labels is None:
            raise DetectorError("per-class fit statistics need labels in the fit set")
        use_logits = bool(needs & _LOGITS)
        if use_logits and fit_set.logits is None:
            raise DetectorError("logit statistics need logits in the fit set")
        num_classes = int(fit_set.num_classes or 0)
        logit_sums = _LogitSums(needs, num_classes) if use_logits else None
        # Working set per row: the block as read and at most a float64 copy of it (the cache-sized parts below are
        # per block, not per row); softmax over the logits.
        width = (3 * dim if raw is not None or normalized is not None else 0) + (2 * num_classes if use_logits else 0)
        # The cache-sized float64 parts of each block, reused from part to part (fresh arrays cost page faults).
        parts = np.empty((SYRK_ROWS, dim)) if raw is not None or normalized is not None else None
        both = raw is not None and raw.with_gram and normalized is not None
        # Two Gram accumulators are independent: the raw one (with the logits' sums) runs in a worker thread beside
        # the normalised one (their BLAS products and numpy's passes release the GIL), each on one BLAS thread. Each
        # gets the same calls in the same order as one after the other, so the statistics are bit-identical either
        # way. Only where the BLAS may use two threads or more: one BLAS thread (OMP_NUM_THREADS=1, a Ray task of
        # one CPU) asks for one core.
        parallel = both and blas_threads() >= 2
        raw_parts = np.empty((SYRK_ROWS, dim)) if parallel else parts
        unit_parts = np.empty((SYRK_ROWS, dim)) if normalized is not None else None

        def beside(rows: slice, block: np.ndarray | None, labels: np.ndarray | None) -> None:
            """The block's work apart from the normalised accumulator's: the raw accumulator and the logits."""
            if raw is not None:
                _add_raw(raw, block, labels, raw_parts)
            if logit_sums is not None:
                logit_sums.add(np.asarray(fit_set.logits[rows]))

        with _accumulator_thread() if parallel else contextlib.nullcontext() as worker:
            for rows in fit_chunks(len(fit_set), max(1, width), self.description):
                labels = np.asarray(fit_set.labels[rows]) if labelled else None
                block = np.asarray(fit_set.features[rows]) if raw is not None or normalized is not None else None
                pending = None if worker is None else worker.submit(beside, rows, block, labels)
                if normalized is not None:
                    _add_normalized(normalized, block, labels, parts, unit_parts)
                if pending is None:
                    beside(rows, block, labels)
                else:
                    pending.result()  # the worker's exception, if any, is raised here
        self.passes += 1
        if raw is not None:
            for need in needs & _RAW:
                self._values[need] = raw
        if normalized is not None:
            self._values["normalized_by_class"] = normalized
        if "max_logit_sum" in needs:
            self._values["max_logit_sum"] = logit_sums.max_logit_sum
        if "prediction_templates" in needs:
            self._values["prediction_templates"] = (logit_sums.template_sums, logit_sums.template_counts)


@contextlib.contextmanager
def _accumulator_thread() -> Iterator[ThreadPoolExecutor]:
    """A worker thread for the raw accumulator while the caller feeds the normalised one; BLAS on one thread each."""
    with one_blas_thread(), ThreadPoolExecutor(1, thread_name_prefix="oodbench-fit") as pool:
        yield pool


def _add_raw(raw: ScatterAccumulator, block: np.ndarray, labels: np.ndarray | None, parts: np.ndarray) -> None:
    """Add a block of raw features: directly where no float64 copy is needed (sums only, or a float32 Gram of
    float32 rows: ScatterAccumulator.update), else part by cache-sized part through the reused float64 `parts`."""
    labels = labels if raw.by_class else None
    if not raw.with_gram or raw.float32_input(block):
        raw.update(block, labels)
        return
    for part in iter_chunks(block.shape[0], SYRK_ROWS):
        values = parts[: part.stop - part.start]
        values[...] = block[part]  # converted to float64; the accumulator centres it in place
        raw.update_owned(values, None if labels is None else labels[part])


def _add_normalized(
    normalized: ScatterAccumulator, block: np.ndarray, labels: np.ndarray, parts: np.ndarray, unit_parts: np.ndarray
) -> None:
    """Add a block's ℓ2-normalised features, part by cache-sized part (as l2_normalize, without its temporaries:
    norms by einsum, divided into a reused buffer that the accumulator centres in place and sums per class while
    it is in cache)."""
    for part in iter_chunks(block.shape[0], SYRK_ROWS):
        values = parts[: part.stop - part.start]
        values[...] = block[part]  # converted to float64
        norms = np.sqrt(np.einsum("nd,nd->n", values, values))
        unit = np.divide(values, np.maximum(norms, 1e-12)[:, None], out=unit_parts[: values.shape[0]])
        normalized.update_owned(unit, labels[part])


class _LogitSums:
    """The logit statistics of a pass, block by block: the sum of the largest logits, the prediction templates."""

    def __init__(self, needs: set[str], num_classes: int) -> None:
        self.max_logit = "max_logit_sum" in needs
        self.max_logit_sum = 0.0
        templates = "prediction_templates" in needs
        self.template_sums = np.zeros((num_classes, num_classes)) if templates else None
        self.template_counts = np.zeros(num_classes, dtype=np.int64)

    def add(self, logits: np.ndarray) -> None:
        """Add a block of logits."""
        if self.max_logit:
            self.max_logit_sum += float(logits.max(axis=1).sum(dtype=np.float64))
        if self.template_sums is not None:
            _add_templates(logits, self.template_sums, self.template_counts)


def _add_templates(logits: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
    """Add each row's softmax vector to the sum of its predicted class (and count the rows)."""
    probs = softmax(logits)
    predicted = probs.argmax(axis=1)
    # Group rows by predicted class and sum each run: O(rows x C), no per-sample Python work.
    order = np.argsort(predicted, kind="stable")
    classes, starts = np.unique(predicted[order], return_index=True)
    sums[classes] += np.add.reduceat(probs[order], starts, axis=0)
    counts += np.bincount(predicted, minlength=counts.shape[0])


def statistics_for(detector: Detector, fit_set: Outputs) -> FitStatistics:
    """The provider handed to `detector.fit(..., stats=)`, or a private one for a detector fitted alone."""
    stats = getattr(detector, "_shared_stats", None)
    if stats is None:
        return FitStatistics(fit_set, declared_statistics(detector), description=f"{detector.name}: fit statistics")
    if not isinstance(stats, FitStatistics):
        raise DetectorError(f"{detector.name}: stats must be a FitStatistics, got {type(stats).__name__}")
    if stats.fit_set is not fit_set:
        raise DetectorError(f"{detector.name}: the shared statistics were computed on another fit set")
    return stats


def fit_all(
    detectors: Sequence[Detector], fit_set: Outputs, head: Head | None = None, *, gram_dtype: str = "float64"
) -> list[Detector]:
    """Fit every detector on one fit set, computing their shared statistics in one pass; returns them fitted."""
    stats = FitStatistics.for_detectors(fit_set, detectors, head, gram_dtype=gram_dtype)
    return [detector.fit(fit_set, head, stats=stats) for detector in detectors]
