"""Read speed of the candidate pack file formats for one (N, D) float32 feature matrix, against a raw read.

Each format is written once, then read into a NumPy (N, D) array and summed (so every byte is touched), best of
`--rounds`. Formats: safetensors (memory-mapped through its JSON header, and through `safetensors.numpy`), Arrow IPC
(Feather v2, uncompressed, memory-mapped) and Parquet (uncompressed and zstd), each holding the matrix as one
fixed-size-list column. The raw baseline reads the .npy file's bytes into a buffer (the page cache's rate when the
file is cached, which it is after the first round).

Usage: python benchmarks/pack_formats.py --rows 100000 --dim 2048 --dir /tmp/pack-formats
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _best(fn: Callable[[], float], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    """Write the matrix in every format and print the read rates (GB/s) as a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pack-formats"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq
    from safetensors.numpy import load_file, save_file

    args.dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    # Post-ReLU-like features: non-negative, about half zeros (what penultimate layers of CNNs give).
    features = np.maximum(rng.standard_normal((args.rows, args.dim), dtype=np.float32), 0)
    nbytes = features.nbytes
    npy = args.dir / "features.npy"
    np.save(npy, features)
    save_file({"features": features}, str(args.dir / "features.safetensors"))
    column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), args.dim)
    table = pa.table({"features": column})
    feather.write_feather(table, args.dir / "features.arrow", compression="uncompressed")
    pq.write_table(table, args.dir / "features.plain.parquet", compression="none", use_dictionary=False)
    pq.write_table(table, args.dir / "features.zstd.parquet", compression="zstd", use_dictionary=False)
    del column, table

    def raw() -> float:
        buffer = bytearray(16 * 2**20)
        with open(npy, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass
        return 0.0

    def safetensors_mmap() -> float:
        path = args.dir / "features.safetensors"
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        start, _ = header["features"]["data_offsets"]
        array = np.memmap(path, np.float32, "r", offset=8 + length + start, shape=tuple(header["features"]["shape"]))
        return float(array.sum(dtype=np.float64))

    def safetensors_numpy() -> float:
        return float(load_file(str(args.dir / "features.safetensors"))["features"].sum(dtype=np.float64))

    def arrow_mmap() -> float:
        with pa.memory_map(str(args.dir / "features.arrow")) as source:
            column = pa.ipc.open_file(source).read_all().column("features").combine_chunks()
            array = column.values.to_numpy(zero_copy_only=True).reshape(-1, args.dim)
            return float(array.sum(dtype=np.float64))

    def parquet(name: str) -> Callable[[], float]:
        def read() -> float:
            column = pq.read_table(args.dir / name).column("features").combine_chunks()
            return float(column.values.to_numpy().reshape(-1, args.dim).sum(dtype=np.float64))

        return read

    def pandas_parquet() -> float:
        import pandas as pd

        frame = pd.read_parquet(args.dir / "features.plain.parquet")
        return float(np.stack(frame["features"].to_numpy()).sum(dtype=np.float64))

    def npy_mmap() -> float:
        return float(np.load(npy, mmap_mode="r").sum(dtype=np.float64))

    rows = [
        ("raw read of the .npy bytes (no decoding)", raw),
        ("store .npy, memory-mapped, summed", npy_mmap),
        ("safetensors, memory-mapped from its header, summed", safetensors_mmap),
        ("safetensors.numpy.load_file, summed", safetensors_numpy),
        ("Arrow IPC uncompressed, memory-mapped, summed", arrow_mmap),
        ("Parquet uncompressed, read and summed", parquet("features.plain.parquet")),
        ("Parquet zstd, read and summed", parquet("features.zstd.parquet")),
        ("pandas.read_parquet + np.stack, summed", pandas_parquet),
    ]
    sizes = {
        "store .npy": npy.stat().st_size,
        "safetensors": (args.dir / "features.safetensors").stat().st_size,
        "Arrow IPC": (args.dir / "features.arrow").stat().st_size,
        "Parquet uncompressed": (args.dir / "features.plain.parquet").stat().st_size,
        "Parquet zstd": (args.dir / "features.zstd.parquet").stat().st_size,
    }
    print(f"{args.rows:,} x {args.dim} float32 ({nbytes / 1e9:.2f} GB), best of {args.rounds}, {os.cpu_count()} CPUs")
    print("| read | seconds | GB/s |\n|---|---:|---:|")
    for name, fn in rows:
        seconds = _best(fn, args.rounds)
        print(f"| {name} | {seconds:.3f} | {nbytes / seconds / 1e9:.2f} |")
    print("| file | bytes per row |\n|---|---:|")
    for name, size in sizes.items():
        print(f"| {name} | {size / args.rows:,.0f} |")


if __name__ == "__main__":
    main()
