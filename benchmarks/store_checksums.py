"""What the store's checksums cost: writing an entry, hashing its rows, and verifying every byte afterwards.

    python benchmarks/store_checksums.py [--rows 250000] [--dim 1024] [--out /tmp/store-bench]

Writes one float32 entry of rows x dim (plus int64 labels and index) with `Store.write_outputs`, then times
the SHA-256 of the same arrays in memory (the part of the write the checksums add), `Store.verify` (every
byte read back and hashed) and a plain `Store.read` (the cheap checks only). Verification reads from the page
cache when the entry fits in memory; drop the cache first to measure the disk. The load average is printed
beside the figures: on a busy machine they grow with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

from oodbench import Outputs, Store
from oodbench.core.store import _data_digest


def main() -> None:
    """Print the write, hashing, verify and read times of one entry."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--shard-size", type=int, default=32_768)
    parser.add_argument("--out", type=Path, default=Path("/tmp/oodbench-store-bench"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    outputs = Outputs(
        rng.standard_normal((args.rows, args.dim), dtype=np.float32), labels=rng.integers(0, 1000, args.rows)
    )
    shutil.rmtree(args.out, ignore_errors=True)
    store = Store(args.out)
    gigabytes = (outputs.features.nbytes + 2 * 8 * args.rows) / 1e9
    start = time.perf_counter()
    store.write_outputs("m", "ds", outputs, provenance={"model": "m"}, shard_size=args.shard_size)
    write = time.perf_counter() - start
    start = time.perf_counter()
    _data_digest(outputs.features), _data_digest(outputs.labels), _data_digest(np.arange(args.rows))
    hashing = time.perf_counter() - start
    start = time.perf_counter()
    result = store.verify("m", "ds")
    verify = time.perf_counter() - start
    assert result.ok, result.problems
    start = time.perf_counter()
    store.read("m", "ds", check_finite=False)  # the store's own checks, without the scan for NaN and inf
    read = time.perf_counter() - start
    print(f"entry: {args.rows:,} x {args.dim} float32 + labels + index = {gigabytes:.2f} GB")
    print(f"write_outputs (shards, merge, checksums): {write:.2f} s")
    print(
        f"one SHA-256 pass over the rows in memory: {hashing:.2f} s = {gigabytes / hashing:.2f} GB/s (a write hashes "
        "each row at its shard and at the merge; write_outputs once more for the digest of its input)"
    )
    print(f"Store.verify (every byte): {verify:.2f} s = {gigabytes / verify:.2f} GB/s")
    print(f"Store.read (size, header, shape, dtype checks; memory-mapped): {read * 1e3:.1f} ms")
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
