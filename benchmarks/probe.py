"""Linear probe vs scikit-learn's LogisticRegression (best C) on synthetic Gaussian classes and on digits.

Run: PYTHONPATH=src python benchmarks/probe.py [--old-src PATH] > probe.json
`--old-src` points at an older checkout's src/ to measure its mini-batch path ("before") in a subprocess.
Synthetic: 20 classes, 64 features, class means N(0, 0.3²) per feature, unit noise; test set of 10,000 rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

CLASSES, DIM, SPREAD = 20, 64, 0.3


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of overlapping Gaussian classes (the class means are fixed across calls)."""
    means = np.random.default_rng(12345).normal(scale=SPREAD, size=(CLASSES, DIM))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    return (means[labels] + rng.normal(size=(n, DIM))).astype(np.float32), labels.astype(np.int64)


def sklearn_best(x, y, x_test, y_test, grid=(0.001, 0.01, 0.1, 1.0)) -> dict:
    """Test accuracy of scikit-learn's multinomial logistic regression at each C (standardised features)."""
    scaler = StandardScaler().fit(x)
    rows = {}
    for c in grid:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(x), y)
        rows[str(c)] = {
            "accuracy": float((model.predict(scaler.transform(x_test)) == y_test).mean()),
            "iterations": int(np.max(model.n_iter_)),
            "seconds": round(time.perf_counter() - start, 1),
        }
    best = max(rows, key=lambda k: rows[k]["accuracy"])
    return {"by_c": rows, "best_c": float(best), "best_accuracy": rows[best]["accuracy"]}


def ours(x, y, x_test, y_test, **kwargs) -> dict:
    """Test accuracy and training record of oodbench's probe."""
    from oodbench.extract.probe import fit_probe

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit_probe(x, y, **kwargs)
    return {
        "accuracy": float((result.head.logits(x_test).argmax(1) == y_test).mean()),
        "method": result.method,
        "weight_decay": getattr(result, "weight_decay", None),
        "best_epoch": result.best_epoch,
        "epochs": len(result.history),
        "stopped_at_cap": getattr(result, "stopped_at_cap", None),
        "warnings": [str(w.message) for w in caught],
        "seconds": round(time.perf_counter() - start, 1),
    }


def old(src: str, n: int, seed: int, test_seed: int) -> dict:
    """The older checkout's probe, mini-batch path (what its 'auto' chose beyond 2 GiB), in a subprocess."""
    code = (
        "import json,sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
        "import probe as b; x,y=b.synthetic(int(sys.argv[3]), int(sys.argv[4])); xt,yt=b.synthetic(10000, int(sys.argv[5]));"
        "print(json.dumps(b.ours(x,y,xt,yt,method='minibatch')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, src, "benchmarks", str(n), str(seed), str(test_seed)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-src")
    parser.add_argument("--sizes", default="18000,100000")
    args = parser.parse_args()
    report: dict = {}
    with threadpool_limits(limits=1):
        import torch

        torch.set_num_threads(1)
        x_test, y_test = synthetic(10_000, 1)
        for n in (int(v) for v in args.sizes.split(",")):
            x, y = synthetic(n, 0)
            row = {"sklearn": sklearn_best(x, y, x_test, y_test), "ours": ours(x, y, x_test, y_test)}
            row["ours_streamed"] = ours(
                x, y, x_test, y_test, method="streamed", weight_decay=row["ours"]["weight_decay"]
            )
            if args.old_src:
                row["before_minibatch"] = old(args.old_src, n, 0, 1)
            report[f"synthetic-{n}"] = row
            print(json.dumps({f"synthetic-{n}": row}), file=sys.stderr, flush=True)
        digits = load_digits()
        order = np.random.default_rng(0).permutation(len(digits.target))
        x, y = digits.data[order].astype(np.float32), digits.target[order].astype(np.int64)
        report["digits"] = {
            "sklearn": sklearn_best(x[:1400], y[:1400], x[1400:], y[1400:]),
            "ours": ours(x[:1400], y[:1400], x[1400:], y[1400:]),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
