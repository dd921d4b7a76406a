"""knn's exact and IVF indexes side by side: score time (interleaved, best of R) and AUROC / FPR@95 against exact.

Features from `paper_scale.Synthetic` (post-ReLU rows around C = 1000 class centres; OOD rows between two classes),
ℓ2-normalised by the detector. Each configuration is fitted once; the score passes are interleaved round by round
so that a change of load on a shared machine reaches every configuration alike. Reports per configuration the
fit time, the best score time, its ratio to the exact search's best, the share of fit rows the queries probed,
and the AUROC and FPR@95 differences (points) from the exact score (ID test rows positive).

Example (1/20 of the paper's fit set, k at the paper's share of the fit set per class):
    .venv/bin/python benchmarks/knn_index.py --fit 64058 --d 2048 --k 50 --nprobe 4,8,16 --nlist 0,253
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_scale import CLASSES, Synthetic  # noqa: E402

from oodbench.core.metrics import auroc, fpr_at_tpr  # noqa: E402
from oodbench.core.outputs import Outputs  # noqa: E402
from oodbench.detectors import create  # noqa: E402
from oodbench.detectors.feature import _ivf_lists, _unit_float32  # noqa: E402


def features(synthetic: Synthetic, rows: int, seed: list[int], ood: bool) -> np.ndarray:
    """`rows` synthetic feature rows."""
    return synthetic.block(rows, np.random.default_rng(seed), ood)["features"]


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison; returns (and optionally writes) the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=int, default=64_058, help="fit rows (default: 1/20 of ImageNet-1k train)")
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--id", type=int, default=2000, help="ID test rows")
    parser.add_argument("--ood", type=int, default=2000, help="OOD test rows")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--nlist", default="0", help="comma-separated IVF list counts; 0: knn's default rule")
    parser.add_argument("--nprobe", default="8,32", help="comma-separated lists probed per query")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report as JSON here")
    args = parser.parse_args(argv)
    synthetic = Synthetic(args.d, CLASSES, args.seed)
    fit = Outputs(features(synthetic, args.fit, [args.seed, 1], False))
    test = Outputs(
        np.concatenate(
            [features(synthetic, args.id, [args.seed, 2], False), features(synthetic, args.ood, [args.seed, 3], True)]
        )
    )
    is_id = np.r_[np.ones(args.id, bool), np.zeros(args.ood, bool)]
    configs: dict[str, dict] = {}

    def add(name: str, **params: object) -> None:
        start = time.perf_counter()
        detector = create("knn", k=args.k, **params).fit(fit)
        configs[name] = {"detector": detector, "fit_s": time.perf_counter() - start, "score_s": float("inf")}

    add("flat")
    for nlist in (int(v) for v in args.nlist.split(",")):
        base = None
        for nprobe in (int(v) for v in args.nprobe.split(",")):
            name = f"ivf nlist={nlist or 'default'} nprobe={nprobe}"
            if base is None:
                add(name, index="ivf", nlist=nlist or None, nprobe=nprobe)
                base = configs[name]
            else:  # same lists, another nprobe: no second k-means
                detector = create("knn", k=args.k, index="ivf", nlist=nlist or None, nprobe=nprobe)
                detector.__dict__.update(
                    {key: value for key, value in base["detector"].__dict__.items() if key.endswith("_")}
                )
                configs[name] = {"detector": detector, "fit_s": base["fit_s"], "score_s": float("inf")}
    for _ in range(args.repeats):
        for config in configs.values():
            detector = config["detector"]
            if detector.index == "ivf":
                detector.index_.nprobe = detector.nprobe
            start = time.perf_counter()
            config["scores"] = detector.score(test)
            config["score_s"] = min(config["score_s"], time.perf_counter() - start)
    exact = configs["flat"]
    exact_auroc = auroc(exact["scores"][is_id], exact["scores"][~is_id])
    exact_fpr = fpr_at_tpr(exact["scores"][is_id], exact["scores"][~is_id])
    queries = _unit_float32(test.features)
    report = {"fit_rows": args.fit, "d": args.d, "k": args.k, "queries": len(is_id), "configs": {}}
    for name, config in configs.items():
        detector, scores = config["detector"], config["scores"]
        row = {"fit_s": config["fit_s"], "score_s": config["score_s"], "speedup": exact["score_s"] / config["score_s"]}
        row["auroc"] = 100 * auroc(scores[is_id], scores[~is_id])
        row["fpr95"] = 100 * fpr_at_tpr(scores[is_id], scores[~is_id])
        row["d_auroc"] = row["auroc"] - 100 * exact_auroc
        row["d_fpr95"] = row["fpr95"] - 100 * exact_fpr
        if detector.index == "ivf":
            centroids, lists = _ivf_lists(detector.index_)
            sizes = np.array([len(v) for v in lists])
            probes = np.argpartition(-(queries @ centroids.T), detector.nprobe - 1, axis=1)[:, : detector.nprobe]
            row.update(
                nlist=len(lists), largest_list=int(sizes.max()), probed=float(sizes[probes].sum(1).mean() / args.fit)
            )
        report["configs"][name] = row
        print(
            f"{name:32s} fit {row['fit_s']:6.1f} s  score {row['score_s']:6.1f} s  x{row['speedup']:5.1f}  "
            f"probed {row.get('probed', 1.0):.3f}  AUROC {row['auroc']:6.2f} ({row['d_auroc']:+.2f})  "
            f"FPR95 {row['fpr95']:6.2f} ({row['d_fpr95']:+.2f})",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
