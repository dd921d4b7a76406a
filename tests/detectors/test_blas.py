"""The GIL-free rank-k product (syrk_update): the BLAS wrapper's result bit for bit, its checks, its fallback."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.linalg.blas
from threadpoolctl import threadpool_limits

from oodbench.core.errors import DetectorError
from oodbench.detectors import _blas
from oodbench.detectors._blas import blas_threads, syrk_update


def wrapper_syrk(rows: np.ndarray, upper: np.ndarray, beta: float) -> np.ndarray:
    routine = scipy.linalg.blas.ssyrk if rows.dtype == np.float32 else scipy.linalg.blas.dsyrk
    return routine(1.0, rows.T, beta=beta, c=upper, trans=0, lower=0, overwrite_c=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("beta", [1.0, 0.0, 0.5])
@pytest.mark.parametrize("native", [True, False])
def test_syrk_update_equals_the_wrapper_bit_for_bit(monkeypatch, dtype, beta, native):
    if not native:  # the fallback where scipy exports no Cython BLAS table
        monkeypatch.setattr(_blas, "_native_syrk", lambda letter: None)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((300, 37)).astype(dtype)
    start = np.asfortranarray(rng.standard_normal((37, 37)).astype(dtype))
    mine = start.copy(order="F")
    syrk_update(rows, mine, beta=beta)
    expected = wrapper_syrk(rows, start.copy(order="F"), beta)
    upper = np.triu_indices(37)
    assert np.array_equal(mine[upper], expected[upper])
    # The lower triangle is neither read nor written.
    lower = np.tril_indices(37, -1)
    assert np.array_equal(mine[lower], start[lower])
    # And it is the Gram: rowsᵀ rows + beta·start, to the rounding of a 300-term sum.
    reference = (rows.astype(np.float64).T @ rows.astype(np.float64) + beta * start.astype(np.float64))[upper]
    scale = np.finfo(dtype).eps * 300 * (np.abs(rows).T.astype(np.float64) @ np.abs(rows) + np.abs(start))[upper]
    assert (np.abs(mine[upper] - reference) <= scale).all()


def test_syrk_update_of_no_rows_only_scales():
    upper = np.asfortranarray(np.full((4, 4), 2.0))
    syrk_update(np.empty((0, 4)), upper, beta=0.5)
    assert (upper == 1.0).all()


def test_syrk_update_refuses_mismatched_operands():
    upper = np.zeros((3, 3), order="F")
    cases = [
        (np.ones((2, 3), dtype=np.float32), upper, "one dtype"),
        (np.ones((2, 3), dtype=np.int64), np.zeros((3, 3), dtype=np.int64, order="F"), "float32 or float64"),
        (np.ones((2, 4)), upper, "do not match"),
        (np.ones((3, 2)).T, upper, "C-contiguous"),
        (np.ones((2, 3)), np.zeros((3, 4))[:, :3], "Fortran-ordered"),  # neither C- nor Fortran-contiguous
    ]
    for rows, target, words in cases:
        with pytest.raises(DetectorError, match=words):
            syrk_update(rows, target)


def test_syrk_update_from_threads_gives_each_its_own_sum():
    # Concurrent calls (the shared pass's two accumulators) touch only their own accumulators.
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((512, 64)).astype(np.float32) for _ in range(8)]
    results = [np.zeros((64, 64), dtype=np.float32, order="F") for _ in range(4)]

    def work(target: np.ndarray) -> None:
        for block in blocks:
            syrk_update(block, target)

    with threadpool_limits(1, user_api="blas"):
        threads = [threading.Thread(target=work, args=(target,)) for target in results]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # The reference on one BLAS thread too: OpenBLAS rounds differently with two (a 2-core machine's default).
        alone = np.zeros((64, 64), dtype=np.float32, order="F")
        work(alone)
    upper = np.triu_indices(64)
    for result in results:
        assert np.array_equal(result[upper], alone[upper])


def test_blas_threads_follows_the_blas_limit():
    with threadpool_limits(1, user_api="blas"):
        assert blas_threads() == 1
    assert 1 <= blas_threads() <= _blas.available_cores()


# ----------------------------------------------------------------------------------------------- small fits
def _needs_two_threads() -> int:
    from oodbench.detectors._blas import blas_threads

    threads = blas_threads()
    if threads < 2:
        pytest.skip("the BLAS runs one thread here (one core, or OMP_NUM_THREADS=1): nothing to limit")
    return threads


def test_small_work_runs_on_one_blas_thread_and_restores_the_count():
    from oodbench.detectors._blas import SMALL_WORK, blas_threads, threads_for

    threads = _needs_two_threads()
    with threads_for(SMALL_WORK - 1):
        assert blas_threads() == 1
    assert blas_threads() == threads
    with threads_for(SMALL_WORK):
        assert blas_threads() == threads


def test_a_small_fit_runs_on_one_blas_thread_and_scoring_keeps_the_blas_threads(monkeypatch):
    """The fit's BLAS threads follow the fit set's size (N·D·max(D, C)); scoring never changes them, so a row's
    score does not depend on how many rows are scored with it."""
    from oodbench.core.outputs import Outputs
    from oodbench.detectors import Detector, Requirements, _blas
    from oodbench.detectors._blas import blas_threads

    threads = _needs_two_threads()
    seen = {}

    class Records(Detector):
        requires = Requirements.of(fit=("features",), score=("features",))
        state = {}

        def _fit(self, fit_set, head):
            seen["fit"] = blas_threads()

        def _score_chunk(self, chunk):
            seen["score"] = blas_threads()
            return np.asarray(chunk.features, dtype=np.float64).sum(axis=1)

    data = Outputs(np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32))
    Records().fit(data).score(data)
    assert seen == {"fit": 1, "score": threads} and blas_threads() == threads
    monkeypatch.setattr(_blas, "SMALL_WORK", 50 * 4 * 4)  # this fit set is no longer small
    Records().fit(data).score(data)
    assert seen == {"fit": threads, "score": threads}
