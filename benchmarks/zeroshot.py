"""Benchmark the zero-shot scores against the float32 matrix product they are built on.

For each score, the time of the score against the time of the same float32 products (image rows × label
embeddings, in the same 256-row tiles and 4096-label blocks the scores use) followed by the cheapest row
reduction of each block (a row maximum): the part no implementation of the score can avoid. A ratio of 1.0 means
the score costs nothing beyond its products; the target (issue 17) is at most 1.5. For GEN, whose reduction is a
top-M selection, the same products followed by numpy's partition of each block are timed too, and the same again
with the softmax normaliser of the float64 logits (Σ exp(z − max z), which GEN needs as every softmax score does):
its floor here.

Every timing is the CPU time of this process (`time.process_time`), the best of `--repeats` runs, with the BLAS
held to one thread (set before numpy loads): on a shared machine the wall time of a run depends on the other jobs,
its CPU time much less. `--wall` reports wall times instead (with the BLAS's own threads).

Examples:
    .venv/bin/python benchmarks/zeroshot.py                               # 10k images, D=512, 1000 IDs, 10k negs
    .venv/bin/python benchmarks/zeroshot.py --images 2000 --negatives 2000 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable

if "--wall" not in sys.argv:  # must precede numpy's import: the BLAS reads it once
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"

import numpy as np  # noqa: E402

from oodbench.zeroshot import scores as S  # noqa: E402

CLOCK = time.perf_counter if "--wall" in sys.argv else time.process_time


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """Shortest time (CPU time of this process, or wall time with --wall) of `repeats` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = CLOCK()
        run()
        times.append(CLOCK() - start)
    return min(times)


def products(images: np.ndarray, labels: np.ndarray) -> None:
    """The float32 products of the scores' tiles and label blocks, each reduced by a row maximum."""
    for rows in range(0, len(images), S.ROW_TILE):
        h = images[rows : rows + S.ROW_TILE]
        for cols in range(0, len(labels), S.LABEL_BLOCK):
            (h @ labels[cols : cols + S.LABEL_BLOCK].T).max(axis=1)


def products_and_selection(images: np.ndarray, labels: np.ndarray, top_m: int) -> None:
    """The same products, each tile's row reduction a top-M selection (numpy's partition): GEN's floor on numpy."""
    for rows in range(0, len(images), S.ROW_TILE):
        h = images[rows : rows + S.ROW_TILE]
        for cols in range(0, len(labels), S.LABEL_BLOCK):
            block = h @ labels[cols : cols + S.LABEL_BLOCK].T
            block.partition(block.shape[1] - min(top_m, block.shape[1]), axis=1)


def products_selection_and_normaliser(images: np.ndarray, labels: np.ndarray, top_m: int) -> None:
    """The same products and top-M partition, plus the softmax normaliser Σ exp(z − max z) of the float64 logits
    z = cosines / τ that every softmax score needs: GEN's floor on numpy, each step in its cheapest form."""
    z = np.empty((S.ROW_TILE, min(len(labels), S.LABEL_BLOCK)))
    for rows in range(0, len(images), S.ROW_TILE):
        h = images[rows : rows + S.ROW_TILE]
        for cols in range(0, len(labels), S.LABEL_BLOCK):
            block = h @ labels[cols : cols + S.LABEL_BLOCK].T
            logits = np.divide(block, S.TAU, out=z[: block.shape[0], : block.shape[1]], dtype=np.float64)
            logits -= logits.max(axis=1)[:, None]
            np.exp(logits, out=logits).sum(axis=1)
            block.partition(block.shape[1] - min(top_m, block.shape[1]), axis=1)


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
    parser.add_argument("--wall", action="store_true", help="Wall times with the BLAS's own threads.")
    parser.add_argument("--json", help="Also write the figures to this JSON file.")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    images = unit(rng, args.images, args.dim)
    ids, negatives, outliers = (unit(rng, n, args.dim) for n in (args.ids, args.negatives, args.outliers))
    sweep = [(np.arange(args.negatives * share // 10), 1, 0) for share in (1, 2, 5, 10)]
    cases = {
        "neglabel": (
            lambda: S.neglabel_scores(images, ids, negatives, groups=args.groups),
            np.concatenate([ids, negatives]),
        ),
        # An M sweep (prefixes of 1/10, 1/5, 1/2 and all of the negatives): one pass over the vocabulary for its
        # four columns, against one call per column; both against the products of the vocabulary once.
        "neglabel M sweep, one pass": (
            lambda: S.neglabel_sweep(images, ids, negatives, sweep),
            np.concatenate([ids, negatives]),
        ),
        "neglabel M sweep, per column": (
            lambda: [S.neglabel_scores(images, ids, negatives[rows]) for rows, _, _ in sweep],
            np.concatenate([ids, negatives]),
        ),
        "eoe": (lambda: S.eoe_scores(images, ids, outliers), np.concatenate([ids, outliers])),
        "logit scores (all six)": (lambda: S.logit_scores(images, ids), ids),
        **{name: (lambda name=name: S.logit_scores(images, ids, names=[name]), ids) for name in S.LOGIT_SCORES},
    }
    rows = []
    for name, (score, labels) in cases.items():
        score()  # warm-up: page faults, BLAS threads
        # GEN's top-M selection: what a row maximum does not pay; its floors are timed in the same rounds.
        floors = name in ("gen", "logit scores (all six)")
        runs = {
            "score_s": score,
            "products_s": lambda labels=labels: products(images, labels),
            **(
                {
                    "selection_floor_s": lambda labels=labels: products_and_selection(images, labels, 100),
                    "selection_normaliser_floor_s": lambda labels=labels: products_selection_and_normaliser(
                        images, labels, 100
                    ),
                }
                if floors
                else {}
            ),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.repeats):  # interleaved, so all see the same machine
            for key, run in runs.items():
                best[key] = min(best[key], best_of(1, run))
        row = {"score": name, "labels": len(labels), **best}
        t_score, t_products = best["score_s"], best["products_s"]
        floor = ""
        if floors:
            floor = (
                f"  (products + top-100 partition {row['selection_floor_s'] / t_products:5.2f}; "
                f"+ softmax normaliser {row['selection_normaliser_floor_s'] / t_products:5.2f})"
            )
        rows.append(row)
        print(
            f"{name:24s} L={len(labels):6d}  score {t_score:7.3f} s  products {t_products:7.3f} s  "
            f"ratio {t_score / t_products:5.2f}{floor}",
            flush=True,
        )
    setting = {
        "images": args.images,
        "dim": args.dim,
        "groups": args.groups,
        "repeats": args.repeats,
        "clock": "wall" if args.wall else "process CPU time, BLAS on one thread",
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
