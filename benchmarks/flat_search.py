"""knn's and NNGuide's exact search against faiss's own, on the same index: time, and the floor it cannot beat.

One faiss IndexFlatIP of `--bank` random unit rows (float32, D = `--d`) and `--queries` unit queries. Per round,
in alternation (so both see the same machine load): faiss's `search` (its OpenMP threads, as faiss sets them) and
oodbench's `flat_search` (BLAS products of bank blocks, the queries split across the cores), each returning every
query's k largest inner products; best of `--repeats`. The floor is the one product queries x bank^T, on all BLAS
threads, timed in the same rounds: no exact search can skip it. The two searches' k largest values must agree to
2·γ_D (each product of D float32 terms is within γ_D = D·u/(1 − D·u), u = 2⁻²⁴, of the exact one).

Examples:
    .venv/bin/python benchmarks/flat_search.py                                   # 5,000 x 512 bank, k = 50
    .venv/bin/python benchmarks/flat_search.py --bank 50000 --d 2048 --k 1000    # paper-like rows and k
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from oodbench.detectors.feature import flat_search
from oodbench.util.atomic import atomic_write_text


def unit_rows(rows: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Post-ReLU-like float32 rows scaled to unit length."""
    values = np.abs(rng.standard_normal((rows, dim), dtype=np.float32))
    return values / np.linalg.norm(values, axis=1, keepdims=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bank", type=int, default=5000, help="rows searched (default 5000)")
    parser.add_argument("--d", type=int, default=512, help="dimension (default 512)")
    parser.add_argument("--queries", type=int, default=1000, help="queries (default 1000)")
    parser.add_argument("--k", type=int, default=50, help="neighbours (default 50)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)

    import faiss

    rng = np.random.default_rng(args.seed)
    bank, queries = unit_rows(args.bank, args.d, rng), unit_rows(args.queries, args.d, rng)
    index = faiss.IndexFlatIP(args.d)
    index.add(bank)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"faiss": [], "oodbench": [], "floor": []}
    results: dict[str, np.ndarray] = {}
    runs = {
        "faiss": lambda: index.search(queries, args.k)[0],
        "oodbench": lambda: flat_search(queries, index, args.k),
        "floor": lambda: queries @ bank.T,
    }
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - start)
    ours = -np.sort(-results["oodbench"], axis=1).astype(np.float64)
    gamma = args.d * 2.0**-24 / (1 - args.d * 2.0**-24)
    difference = float(np.abs(ours - results["faiss"]).max())
    if difference > 2 * gamma:
        raise SystemExit(f"the searches disagree by {difference:.3g}, more than 2·γ_D = {2 * gamma:.3g}")
    best = {name: min(values) for name, values in times.items()}
    report = {
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "faiss_threads": faiss.omp_get_max_threads(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "seconds": best,
        "floor_multiples": {name: best[name] / best["floor"] for name in ("faiss", "oodbench")},
        "faiss_over_oodbench": best["faiss"] / best["oodbench"],
        "largest_difference": difference,
        "bound": 2 * gamma,
    }
    print(
        f"bank {args.bank} x {args.d}, {args.queries} queries, k = {args.k}: faiss {best['faiss'] * 1e3:.1f} ms "
        f"({report['floor_multiples']['faiss']:.2f}x the floor), oodbench {best['oodbench'] * 1e3:.1f} ms "
        f"({report['floor_multiples']['oodbench']:.2f}x), floor {best['floor'] * 1e3:.1f} ms; faiss / oodbench "
        f"{report['faiss_over_oodbench']:.2f}x; values within {difference:.2g} (bound {2 * gamma:.2g})",
        flush=True,
    )
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
