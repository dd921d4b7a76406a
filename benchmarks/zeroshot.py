"""Benchmark the zero-shot scores against the float32 matrix product they are built on.

For each score, the time of the score against the time of the same float32 products (image rows × label
embeddings, in the same 256-row tiles and 4096-label blocks the scores use) followed by the cheapest row
reduction of each block (a row maximum): the part no implementation of the score can avoid. A ratio of 1.0 means
the score costs nothing beyond its products; the target (issue 17) is at most 1.5.

Every timing is the best of `--repeats` runs (the machine is shared: the minimum is the least disturbed run).

Examples:
    .venv/bin/python benchmarks/zeroshot.py                               # 10k images, D=512, 1000 IDs, 10k negs
    .venv/bin/python benchmarks/zeroshot.py --images 2000 --negatives 2000 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from oodbench.zeroshot import scores as S


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """Shortest wall time of `repeats` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def products(images: np.ndarray, labels: np.ndarray) -> None:
    """The float32 products of the scores' tiles and label blocks, each reduced by a row maximum."""
    for rows in range(0, len(images), S.ROW_TILE):
        h = images[rows : rows + S.ROW_TILE]
        for cols in range(0, len(labels), S.LABEL_BLOCK):
            (h @ labels[cols : cols + S.LABEL_BLOCK].T).max(axis=1)


def unit(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    x = rng.normal(size=(rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--ids", type=int, default=1000)
    parser.add_argument("--negatives", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--outliers", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="Also write the figures to this JSON file.")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    images = unit(rng, args.images, args.dim)
    ids, negatives, outliers = (unit(rng, n, args.dim) for n in (args.ids, args.negatives, args.outliers))
    cases = {
        "neglabel": (
            lambda: S.neglabel_scores(images, ids, negatives, groups=args.groups),
            np.concatenate([ids, negatives]),
        ),
        "eoe": (lambda: S.eoe_scores(images, ids, outliers), np.concatenate([ids, outliers])),
        "logit scores (all six)": (lambda: S.logit_scores(images, ids), ids),
        **{name: (lambda name=name: S.logit_scores(images, ids, names=[name]), ids) for name in S.LOGIT_SCORES},
    }
    rows = []
    for name, (score, labels) in cases.items():
        score()  # warm-up: page faults, BLAS threads
        t_score = best_of(args.repeats, score)
        t_products = best_of(args.repeats, lambda labels=labels: products(images, labels))
        rows.append({"score": name, "labels": len(labels), "score_s": t_score, "products_s": t_products})
        print(
            f"{name:24s} L={len(labels):6d}  score {t_score:7.3f} s  products {t_products:7.3f} s  "
            f"ratio {t_score / t_products:5.2f}",
            flush=True,
        )
    setting = {
        "images": args.images,
        "dim": args.dim,
        "groups": args.groups,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    print(json.dumps(setting))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"setting": setting, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
