"""Row chunking, so that work over (possibly memory-mapped) arrays keeps memory bounded."""

from __future__ import annotations

from collections.abc import Iterator

# Default working-set budget of one chunk; small enough for 24 GB machines running several jobs.
DEFAULT_CHUNK_BYTES = 64 * 2**20


def iter_chunks(num_rows: int, chunk_rows: int) -> Iterator[slice]:
    """Row slices of at most `chunk_rows` rows covering [0, num_rows)."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive; got {chunk_rows}")
    for start in range(0, num_rows, chunk_rows):
        yield slice(start, min(num_rows, start + chunk_rows))


def rows_per_chunk(row_width: int, *, bytes_per_value: int = 8, budget_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """How many rows of `row_width` values fit in the chunk budget (at least 1)."""
    return max(1, budget_bytes // max(1, row_width * bytes_per_value))
