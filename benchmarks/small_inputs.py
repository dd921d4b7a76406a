"""A user's first study is small: each detector against pytorch-ood's on 5,000 fit rows and 1,000 test rows.

Per detector with a pytorch-ood counterpart (`benchmarks/detectors.py`'s adapters, the same arrays), the time a
user waits for a fitted detector's scores, create + fit + score, oodbench's and pytorch-ood's timed in alternation
in one process (so both see the same machine load), best of `--repeats` rounds. The ratio is pytorch-ood's time over
oodbench's: at least 1 means oodbench is as fast. Fixed costs dominate at this size (validation, float64 copies,
thread pools, index set-up), so this is where they show. With `--alone`, each library's rounds run back to back
instead (after two untimed calls): neither then finds the other's threads still spinning on the cores.

Examples:
    .venv/bin/python benchmarks/small_inputs.py                          # 5,000 x 512 fit, C=100, 1,000 test rows
    .venv/bin/python benchmarks/small_inputs.py --detectors vim,react --repeats 9
    .venv/bin/python benchmarks/small_inputs.py --out small.json         # also small.md, the docs' table
    .venv/bin/python benchmarks/small_inputs.py --detectors energy,mcm --alone --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detectors import Synthetic, concat, reference_adapters  # noqa: E402  (the sibling benchmark's helpers)

from oodbench.core.metrics import auroc  # noqa: E402
from oodbench.detectors import create  # noqa: E402
from oodbench.util.atomic import atomic_write_text  # noqa: E402


def ours(name: str, fit: Any, head: Any, test: Any) -> np.ndarray:
    """What a user runs: create, fit, score."""
    return create(name).fit(fit, head).score(test)


def theirs(build: Any, fit: Any, head: Any, test: Any) -> np.ndarray:
    """pytorch-ood's counterpart, built, fitted and scored on the same arrays."""
    fit_fn, score_fn = build(fit, head, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_fn()
        return score_fn(test)


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=int, default=5000, help="fit rows (default 5000)")
    parser.add_argument("--test", type=int, default=500, help="ID test rows, and as many OOD rows (default 500)")
    parser.add_argument("--dim", type=int, default=512, help="feature dimension D (default 512)")
    parser.add_argument("--classes", type=int, default=100, help="classes C (default 100: every class in the fit set)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each detector's best is kept (default 5)")
    parser.add_argument("--detectors", default="all", help="comma-separated names (default: all with a counterpart)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--alone", action="store_true", help="each library's rounds back to back, after two untimed calls each"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON, and the Markdown table next to it")
    args = parser.parse_args(argv)

    import torch

    references = reference_adapters()
    names = list(references) if args.detectors == "all" else args.detectors.split(",")
    data = Synthetic(args.dim, args.classes, args.seed)
    fit = data.outputs(args.fit, args.seed + 1)
    test = concat(data.outputs(args.test, args.seed + 2), data.outputs(args.test, args.seed + 3, ood=True))
    # k=1000 is a fifth of this fit set, and a 1% nnguide bank holds 50 rows: smaller k, the same in both libraries.
    params = {"knn": {"k": 50}, "nnguide": {"k": 10}}
    results: dict[str, Any] = {}
    load_before = os.getloadavg()
    for name in names:
        build = references[name]
        if name == "knn":
            from pytorch_ood import detector as pod

            def build(fit, head, fit_rows):  # noqa: ARG001
                det = pod.KNN(None, k=params["knn"]["k"])
                z, y = torch.from_numpy(np.asarray(fit.features)), torch.from_numpy(np.asarray(fit.labels))
                return (lambda: det.fit_features(z, y)), (
                    lambda t: -det.predict_features(torch.from_numpy(np.asarray(t.features))).numpy()
                )

        if name == "nnguide":
            from pytorch_ood import detector as pod

            def build(fit, head, fit_rows):  # noqa: ARG001  (the adapter's bank: a seeded 1% of the fit rows)
                z, y = torch.from_numpy(np.asarray(fit.features)), torch.from_numpy(np.asarray(fit.labels))
                bank = torch.from_numpy(np.sort(np.random.default_rng(0).choice(len(z), len(z) // 100, replace=False)))
                layer = torch.nn.Linear(head.num_features, head.num_classes)
                with torch.no_grad():
                    layer.weight.copy_(torch.from_numpy(head.weight))
                    layer.bias.copy_(torch.from_numpy(head.bias))
                det = pod.NNGuide(None, layer.eval(), k=params["nnguide"]["k"])
                with torch.no_grad():
                    return (lambda: det.fit_features(z[bank], y[bank])), (
                        lambda t: -det.predict_features(torch.from_numpy(np.asarray(t.features))).detach().numpy()
                    )

        def run_ours(name: str = name) -> np.ndarray:
            return create(name, **params.get(name, {})).fit(fit, data.head).score(test)

        def run_theirs(build: Any = build) -> np.ndarray:
            return theirs(build, fit, data.head, test)

        ours_s, theirs_s = [], []
        if args.alone:  # one library at a time: the other's thread pools are idle
            for _ in range(2):
                run_ours()
            ours_s = [timed(run_ours)[1] for _ in range(args.repeats)]
            ours_scores = run_ours()
            for _ in range(2):
                run_theirs()
            theirs_s = [timed(run_theirs)[1] for _ in range(args.repeats)]
            theirs_scores = run_theirs()
        for _ in range(0 if args.alone else args.repeats):  # alternate, so both see the same load
            ours_scores, seconds = timed(run_ours)
            ours_s.append(seconds)
            theirs_scores, seconds = timed(run_theirs)
            theirs_s.append(seconds)
        row = {
            "ours_s": min(ours_s),
            "pytorch_ood_s": min(theirs_s),
            "ratio": min(theirs_s) / min(ours_s),
            "auroc": auroc(ours_scores[: args.test], ours_scores[args.test :]),
            "pytorch_ood_auroc": auroc(theirs_scores[: args.test], theirs_scores[args.test :]),
        }
        results[name] = row
        print(
            f"{name:12s} oodbench {row['ours_s'] * 1e3:8.1f} ms  pytorch-ood {row['pytorch_ood_s'] * 1e3:8.1f} ms  "
            f"ratio {row['ratio']:5.2f}x  AUROC {row['auroc']:.4f} / {row['pytorch_ood_auroc']:.4f}",
            flush=True,
        )
    report = {
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "results": results,
    }
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2))
        atomic_write_text(args.out.with_suffix(".md"), markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    """The docs' table: per detector, both times and their ratio."""
    lines = [
        "| detector | oodbench (ms) | pytorch-ood (ms) | pytorch-ood ÷ oodbench |",
        "|---|---|---|---|",
    ]
    for name, row in report["results"].items():
        lines.append(f"| {name} | {row['ours_s'] * 1e3:.1f} | {row['pytorch_ood_s'] * 1e3:.1f} | {row['ratio']:.2f}× |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
