"""BLAS calls that let other threads run: the fit's rank-k products, and how many threads the BLAS may use.

scipy's Python wrappers of BLAS (scipy.linalg.blas.ssyrk and dsyrk) hold the GIL while they run: two threads
calling them take the time of one after the other (measured: two threads of 49 float32 rank-2048 products at
D = 768 took 1.60-1.83 s, one thread alone 0.74-0.79 s). `syrk_update` calls the same BLAS routine of the same
library through the function pointer that scipy exports for Cython (scipy.linalg.cython_blas), by ctypes, which
releases the GIL for the call: the same two threads then took 0.74-0.76 s, and the products are bit-identical to
the wrapper's.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..util.cores import available_cores


@cache
def _native_syrk(letter: str) -> Any:
    """The Fortran-interface ?syrk of scipy's BLAS as a ctypes function (releases the GIL), or None if unavailable."""
    try:
        import scipy.linalg.cython_blas as cython_blas

        capsule = cython_blas.__pyx_capi__[f"{letter}syrk"]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        address = get_pointer(capsule, get_name(capsule))
    except (ImportError, AttributeError, KeyError, ValueError):  # a scipy without the Cython BLAS table
        return None
    if not address:
        return None
    scalar = ctypes.c_float if letter == "s" else ctypes.c_double
    integer = ctypes.POINTER(ctypes.c_int)
    # ?syrk(uplo, trans, n, k, alpha, a, lda, beta, c, ldc): every argument by reference (Fortran).
    prototype = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        integer,
        integer,
        ctypes.POINTER(scalar),
        ctypes.c_void_p,
        integer,
        ctypes.POINTER(scalar),
        ctypes.c_void_p,
        integer,
    )
    return prototype(address), scalar


def syrk_update(rows: np.ndarray, upper: np.ndarray, beta: float = 1.0) -> None:
    """upper ← beta·upper + rowsᵀ rows on the upper triangle, in place, without holding the GIL.

    `rows` is a C-contiguous (k, D) float32 or float64 array; `upper` a Fortran-ordered (D, D) array of the same
    dtype (its lower triangle is neither read nor written). With beta = 0 the upper triangle is overwritten.
    """
    dim = upper.shape[0]
    if rows.dtype != upper.dtype or rows.dtype not in (np.float32, np.float64):
        raise DetectorError(
            f"syrk_update needs float32 or float64 operands of one dtype; got {rows.dtype}, {upper.dtype}"
        )
    if rows.ndim != 2 or rows.shape[1] != dim or upper.shape != (dim, dim):
        raise DetectorError(f"syrk_update: rows {rows.shape} do not match a ({dim}, {dim}) accumulator")
    if not (rows.flags.c_contiguous and upper.flags.f_contiguous and upper.flags.writeable):
        raise DetectorError("syrk_update needs C-contiguous rows and a writeable Fortran-ordered accumulator")
    if rows.shape[0] == 0:
        if beta != 1.0:
            upper *= beta
        return
    letter = "s" if rows.dtype == np.float32 else "d"
    native = _native_syrk(letter)
    if native is None:
        import scipy.linalg.blas  # the wrapper: same routine, holding the GIL

        routine = getattr(scipy.linalg.blas, f"{letter}syrk")
        routine(1.0, rows.T, beta=beta, c=upper, trans=0, lower=0, overwrite_c=1)
        return
    function, scalar = native
    # rows.T is the Fortran-contiguous (D, k) operand A with lda = D: C ← alpha·A·Aᵀ + beta·C ("N"), upper ("U").
    n, k = ctypes.c_int(dim), ctypes.c_int(rows.shape[0])
    function(
        b"U",
        b"N",
        ctypes.byref(n),
        ctypes.byref(k),
        ctypes.byref(scalar(1.0)),
        rows.ctypes.data,
        ctypes.byref(n),
        ctypes.byref(scalar(beta)),
        upper.ctypes.data,
        ctypes.byref(n),
    )


@cache
def _controller() -> Any:
    """threadpoolctl's view of the loaded BLAS libraries, built once (scipy's BLAS loaded first, so that it is seen).

    Building it scans the process's libraries (about 2.5 ms); reading or limiting through it afterwards costs
    microseconds, which matters where a detector fits in milliseconds.
    """
    import scipy.linalg.cython_blas  # noqa: F401  (loads scipy's BLAS, so that it is counted and limits reach it)
    from threadpoolctl import ThreadpoolController  # a declared dependency (scikit-learn needs it too)

    return ThreadpoolController().select(user_api="blas")


def blas_threads() -> int:
    """Threads the BLAS may use (which OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, threadpoolctl or a Ray task's num_cpus
    set), at most the cores this process may use.

    scipy's BLAS is loaded first: threadpoolctl sees (and limits) only the libraries loaded when it is called, and
    the fit's products run on scipy's.
    """
    blas = [int(library.num_threads) for library in _controller().lib_controllers]
    return max(1, min(available_cores(), max(blas) if blas else available_cores()))


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """The BLAS on one thread inside the block (every loaded BLAS library), its thread counts restored after."""
    with _controller().limit(limits=1):
        yield


# Below this many multiply-adds (N·D·max(D, C), N fit rows) a detector's fit runs its BLAS on one thread: the products take well under a second on one core, and a second BLAS thread saves little of it
# while its synchronisation costs whole seconds when other processes hold the cores (5,000 fit rows, D = 512,
# C = 100 on the shared 2-core machine: rmaha 0.8-3.8 s on one thread against 4.1-7.3 s on two; docs/detectors.md).
SMALL_WORK = 1 << 32


@contextlib.contextmanager
def threads_for(work: int) -> Iterator[None]:
    """One BLAS thread for `work` multiply-adds below SMALL_WORK, the BLAS's own threads above (a no-op there)."""
    if work >= SMALL_WORK or blas_threads() == 1:
        yield
        return
    with one_blas_thread():
        yield
