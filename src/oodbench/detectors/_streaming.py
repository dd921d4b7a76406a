"""Streaming passes over a (possibly memory-mapped) fit set: row chunks, progress, means, exact percentiles."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..util.chunking import DEFAULT_CHUNK_BYTES, iter_chunks, rows_per_chunk

# Fits over fewer rows than this finish in seconds; a progress bar would only be noise (and clutter tests).
_PROGRESS_MIN_ROWS = 250_000


@contextmanager
def _progress_bar(description: str, total_rows: int) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(rows)` callback; draws a rich bar only for long passes on an interactive terminal."""
    if total_rows < _PROGRESS_MIN_ROWS or not sys.stderr.isatty():
        yield lambda rows: None
        return
    from ..util.progress import make_progress

    progress = make_progress(transient=True)
    with progress:
        task = progress.add_task(description, total=total_rows)
        yield lambda rows: progress.advance(task, rows)


# Working-set budget of one fit chunk (module-level so tests can shrink it to exercise many chunks).
FIT_CHUNK_BYTES = DEFAULT_CHUNK_BYTES


def fit_chunks(num_rows: int, row_width: int, description: str = "") -> Iterator[slice]:
    """Row slices whose float64 working set of `row_width` values per row fits the chunk budget; shows progress."""
    chunk = rows_per_chunk(max(1, row_width), budget_bytes=FIT_CHUNK_BYTES)
    with _progress_bar(description, num_rows) as advance:
        for rows in iter_chunks(num_rows, chunk):
            yield rows
            advance(rows.stop - rows.start)


def read_rows(array: np.ndarray, rows: slice) -> np.ndarray:
    """Rows of a (memory-mapped) array as a float64 in-memory block."""
    return np.asarray(array[rows], dtype=np.float64)


def sample_rows(num_rows: int, count: int, seed: int) -> np.ndarray:
    """A seeded uniform random subset of `count` row indices, sorted (sequential reads of a memory map)."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_rows, size=count, replace=False))


def gather_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows `index` (sorted) of a (memory-mapped) array, read in bounded batches, as float64."""
    out = np.empty((index.shape[0],) + array.shape[1:], dtype=np.float64)
    width = int(np.prod(array.shape[1:])) if array.ndim > 1 else 1
    for part in iter_chunks(index.shape[0], rows_per_chunk(width, budget_bytes=FIT_CHUNK_BYTES)):
        out[part] = array[index[part]]
    return out


# --------------------------------------------------------------------------- exact streaming percentile
_BINS = 1 << 16  # sub-bins per refinement level; three levels resolve any float32 range
_COLLECT = 1 << 21  # values in the target bin small enough to gather and sort in memory
_MAX_LEVELS = 12


def _bin_index(values: np.ndarray, low: float, scale: float) -> np.ndarray:
    """Monotone (non-decreasing in value) bin index in [0, _BINS), so bins are contiguous value intervals."""
    index = np.floor((values - low) * scale)
    np.clip(index, 0, _BINS - 1, out=index)
    return index.astype(np.int64)


def _select_ranks(array: np.ndarray, ranks: list[int], low: float, high: float, description: str) -> list[float]:
    """Values of the given (adjacent, ascending) 0-based ranks among all entries of `array`, by histogram refinement."""
    # A chain of (low, scale, bin) levels; a value belongs to the current window when every level maps it to
    # the chosen bin. `below` counts values ordered before the window, so rank - below indexes inside it.
    levels: list[tuple[float, float, int]] = []
    window_count = int(np.prod(array.shape))
    range_low, range_high = low, high
    for _ in range(_MAX_LEVELS):
        collect = window_count <= _COLLECT or len(levels) == _MAX_LEVELS - 2
        histogram = not collect and range_high > range_low
        scale = _BINS / (range_high - range_low) if histogram else 0.0
        counts = np.zeros(_BINS, dtype=np.int64)
        gathered: list[np.ndarray] = []
        below = 0
        window_min, window_max = math.inf, -math.inf
        for rows in fit_chunks(array.shape[0], int(np.prod(array.shape[1:])), description):
            values = read_rows(array, rows).ravel()
            for level_low, level_scale, chosen in levels:
                index = _bin_index(values, level_low, level_scale)
                below += int(np.count_nonzero(index < chosen))
                values = values[index == chosen]
            if values.size == 0:
                continue
            window_min = min(window_min, float(values.min()))
            window_max = max(window_max, float(values.max()))
            if collect:
                gathered.append(values)
            elif histogram:
                counts += np.bincount(_bin_index(values, range_low, scale), minlength=_BINS)
        offsets = [rank - below for rank in ranks]
        if window_min == window_max:
            return [window_min] * len(ranks)  # all equal (e.g. a mass of exact zeros after ReLU)
        if collect:
            window = np.partition(np.concatenate(gathered), offsets)
            return [float(window[offset]) for offset in offsets]
        if not histogram:
            # The guessed range was degenerate: this pass measured the window's true range; refine it next pass.
            range_low, range_high = window_min, window_max
            continue
        cumulative = np.cumsum(counts)
        bins = [int(np.searchsorted(cumulative, offset, side="right")) for offset in offsets]
        if bins[0] != bins[-1]:
            # Adjacent ranks straddle two bins (rare): resolve each rank on its own from here.
            return [_select_ranks(array, [rank], low, high, description)[0] for rank in ranks]
        chosen = bins[0]
        window_count = int(counts[chosen])
        levels.append((range_low, scale, chosen))
        # The chosen bin spans about [low + k/scale, low + (k+1)/scale]; the next level subdivides that span.
        span_low = range_low + chosen / scale
        range_low, range_high = max(span_low, window_min), min(span_low + 1.0 / scale, window_max)
    raise AssertionError("unreachable: a late level always collects")


_SAMPLE_VALUES = 1 << 22  # values drawn to bracket the target ranks before the one exact pass


def _bracketed_ranks(array: np.ndarray, ranks: list[int], seed: int, description: str) -> list[float] | None:
    """Values at `ranks` from one pass, if a random sample's bracket [lo, hi] around them holds; else None."""
    count = int(np.prod(array.shape))
    width = int(np.prod(array.shape[1:]))
    sample_count = min(array.shape[0], max(1, _SAMPLE_VALUES // max(1, width)))
    sample = gather_rows(array, sample_rows(array.shape[0], sample_count, seed)).ravel()
    # A bracket of +-6 binomial standard deviations (plus one sample step) around the ranks' quantile.
    fraction = (np.array(ranks, dtype=np.float64) + 0.5) / count
    spread = 6.0 * np.sqrt(fraction * (1.0 - fraction) / sample.size) + 1.0 / sample.size
    positions = np.clip(
        np.round(np.r_[fraction[0] - spread[0], fraction[-1] + spread[-1]] * (sample.size - 1)), 0, sample.size - 1
    ).astype(np.int64)
    low, high = np.partition(sample, positions)[positions]  # order statistics: exact values of the data
    below = at_low = at_high = 0
    inside: list[np.ndarray] = []
    inside_count = 0
    for rows in fit_chunks(array.shape[0], width, description):
        values = np.asarray(array[rows]).ravel()
        below += int(np.count_nonzero(values < low))
        at_low += int(np.count_nonzero(values == low))
        if high > low:
            at_high += int(np.count_nonzero(values == high))
            strictly = values[(values > low) & (values < high)]
            inside_count += strictly.size
            if inside_count > _COLLECT * 8:
                return None  # the bracket holds too much; refine by histograms instead
            inside.append(strictly)
    window = np.sort(np.concatenate(inside)) if inside else np.zeros(0)
    # The ordered values from rank `below` on: at_low copies of low, the window, then at_high copies of high.
    results = []
    for rank in ranks:
        offset = rank - below
        if offset < 0:
            return None
        if offset < at_low:
            results.append(float(low))
        elif offset < at_low + window.size:
            results.append(float(window[offset - at_low]))
        elif offset < at_low + window.size + at_high:
            results.append(float(high))
        else:
            return None
    return results


def exact_percentile(array: np.ndarray, q: float, description: str = "percentile", seed: int = 0) -> float:
    """`np.percentile(array, q)` (linear method) over all entries of a 2-D array, without loading it whole."""
    count = int(np.prod(array.shape))
    if count == 0:
        raise ValueError("percentile of an empty array")
    virtual = (q / 100.0) * (count - 1)
    lower_rank = int(math.floor(virtual))
    fraction = virtual - lower_rank
    ranks = [lower_rank] if fraction == 0.0 or lower_rank + 1 >= count else [lower_rank, lower_rank + 1]
    if count <= _SAMPLE_VALUES:
        # Small enough to be its own sample: one selection over all values (a copy; the input is left as it is).
        flat = np.partition(np.asarray(array).reshape(-1), ranks)
        values: list[float] | None = [float(flat[rank]) for rank in ranks]
    else:
        # Usually one pass: a random sample brackets the ranks, and only the values inside the bracket are kept.
        values = _bracketed_ranks(array, ranks, seed, description)
    if values is None:
        low, high = math.inf, -math.inf
        for rows in fit_chunks(array.shape[0], int(np.prod(array.shape[1:])), description):
            block = np.asarray(array[rows])
            low, high = min(low, float(block.min())), max(high, float(block.max()))
        values = _select_ranks(array, ranks, low, high, description)
    if len(values) == 1:
        return values[0]
    lower, upper = values
    # numpy's linear interpolation, including its switch of anchor at fraction 0.5 for symmetry.
    if fraction >= 0.5:
        return upper - (upper - lower) * (1.0 - fraction)
    return lower + (upper - lower) * fraction
