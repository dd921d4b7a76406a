"""Throughput of the subsampling study (Table A6): oodbench's vectorised draws against a straightforward loop.

The straightforward loop is what one writes first: per draw, pick n OOD indices, recompute every detector's FPR@95
with `metrics.fpr_at_tpr` on the subset, and call `scipy.stats.spearmanr` for the rank correlation. oodbench fixes
the thresholds, groups OOD images by their acceptance bits and samples the group counts (multivariate
hypergeometric), so a draw costs O(n + groups) instead of O(detectors × (N_id + n)).

    python benchmarks/subsample.py                          # synthetic scores, demo-sized and seed-sized
    python benchmarks/subsample.py --run-dir oodbench-demo/run --figure docs/img/analysis-figA4.png

Prints a Markdown table (times, draws × detectors per second, speed-up) and, with --json, writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from scipy import stats

from oodbench.analysis.rundata import load_run
from oodbench.analysis.subsample import acceptance_bits, resolve_n, subsample_curve, subsample_fpr
from oodbench.core import metrics
from oodbench.util.atomic import atomic_write_text

DETECTORS = 21
# Synthetic stand-in for the seed's 15 OOD sets: sizes from the smallest benchmark (655) to ImageNet scale.
SEED_SCALE_SIZES = [655, 1000, 1500, 2000, 2500, 3000, 5000, 5879, 8000, 10000, 15000, 17632, 20000, 30000, 50000]


def synthetic(n_id: int, ood_sizes: list[int], seed: int = 0) -> tuple[dict, dict[str, dict]]:
    """Correlated scores of 21 detectors (a shared latent "OOD-ness" plus detector noise)."""
    rng = np.random.default_rng(seed)
    strength = np.linspace(0.5, 2.5, DETECTORS)

    def scores(n: int, shift: float) -> dict[str, np.ndarray]:
        latent = rng.normal(shift, 1.0, n)
        return {f"det{j:02d}": latent * strength[j] + rng.normal(0, 1.0, n) for j in range(DETECTORS)}

    ids = scores(n_id, 1.5)
    return ids, {f"ood{i:02d}-{size}": scores(size, 0.0) for i, size in enumerate(ood_sizes)}


def vectorised(ids: dict, oods: dict[str, dict], n: int, draws: int, seed: int) -> tuple[float, dict]:
    """Seconds for the whole study (thresholds, bits, draws, ranks, summaries) and the summaries."""
    start = time.perf_counter()
    summaries = {}
    thresholds: dict[str, float] = {}  # one ID set: thresholds computed once, as subsample_run does
    for name, ood in oods.items():
        size = min(n, len(next(iter(ood.values()))))
        bits = acceptance_bits(ids, ood, thresholds=thresholds)
        summaries[name] = subsample_fpr(ids, ood, size, draws=draws, seed=seed, ood_dataset=name, bits=bits).summary()
    return time.perf_counter() - start, summaries


def naive(ids: dict, oods: dict[str, dict], n: int, draws: int, seed: int) -> tuple[float, dict]:
    """Seconds for `draws` draws per set with the per-draw loop, and the best detector's FPR mean/std per set."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    results = {}
    for name, ood in oods.items():
        names = list(ood)
        full = np.array([metrics.fpr_at_tpr(ids[d], ood[d]) for d in names])
        best = names[int(np.argmin(full))]
        size = min(n, len(ood[best]))
        values, rhos = [], []
        for _ in range(draws):
            index = rng.choice(len(ood[best]), size, replace=False)
            fprs = np.array([metrics.fpr_at_tpr(ids[d], ood[d][index]) for d in names])
            values.append(fprs[names.index(best)])
            rhos.append(stats.spearmanr(fprs, full).statistic)
        results[name] = (float(np.mean(values)), float(np.std(values, ddof=1)))
    return time.perf_counter() - start, results


def run_scenario(label: str, ids: dict, oods: dict[str, dict], n: int, draws: int, naive_draws: int, seed: int) -> dict:
    fast_seconds, summaries = vectorised(ids, oods, n, draws, seed)
    slow_seconds, slow = naive(ids, oods, n, naive_draws, seed)
    slow_full = slow_seconds * draws / naive_draws  # the loop is linear in the number of draws
    # Same study, independent randomness: means agree within sampling error.
    agree = all(
        abs(summaries[k].mean - slow[k][0]) <= 5 * max(summaries[k].std, 1e-9) / np.sqrt(naive_draws) + 1e-12
        for k in oods
    )
    work = draws * DETECTORS * len(oods)
    return {
        "scenario": label,
        "ood_sets": len(oods),
        "detectors": DETECTORS,
        "draws": draws,
        "n": n,
        "ood_sizes": [len(next(iter(o.values()))) for o in oods.values()],
        "vectorised_s": fast_seconds,
        "naive_s_extrapolated": slow_full,
        "naive_draws_timed": naive_draws,
        "speedup": slow_full / fast_seconds,
        "draw_detectors_per_s": work / fast_seconds,
        "means_agree": bool(agree),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, help="An evaluation run directory (e.g. the demo's) to time as well.")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--naive-draws", type=int, default=50, help="Draws timed for the loop (then extrapolated).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--figure", type=Path, help="Write Fig. A4 of the demo-sized synthetic scores here (.png/.pdf)."
    )
    parser.add_argument("--json", type=Path, help="Write the measurements as JSON.")
    args = parser.parse_args()

    results = []
    demo_ids, demo_oods = synthetic(300, [286, 200, 300], args.seed)
    n_demo = resolve_n("auto", {k: len(next(iter(v.values()))) for k, v in demo_oods.items()})
    results.append(
        run_scenario(
            "synthetic, demo-sized (N_id 300)", demo_ids, demo_oods, n_demo, args.draws, args.naive_draws, args.seed
        )
    )
    if args.run_dir is not None:
        run = load_run(args.run_dir)
        model, id_dataset = run.pairs()[0]
        oods, ids = {}, {}
        for ood in run.ood_datasets(model, id_dataset):
            ids, oods[ood] = run.paired_scores(model, id_dataset, ood)
        n_run = resolve_n("auto", {k: len(next(iter(v.values()))) for k, v in oods.items()})
        result = run_scenario(
            f"run {args.run_dir} ({model}, {len(ids)} detectors)",
            ids,
            oods,
            n_run,
            args.draws,
            args.naive_draws,
            args.seed,
        )
        result["detectors"] = len(ids)
        results.append(result)
    seed_ids, seed_oods = synthetic(48365, SEED_SCALE_SIZES, args.seed + 1)
    results.append(
        run_scenario(
            "synthetic, seed-sized (N_id 48,365, 15 sets of 655–50,000)",
            seed_ids,
            seed_oods,
            655,
            args.draws,
            max(5, args.naive_draws // 10),
            args.seed,
        )
    )

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}, "
        f"numpy {np.__version__}\n"
    )
    print(
        "| scenario | OOD sets | detectors | draws | n | oodbench (s) | loop (s, extrapolated) | speed-up | draw·detectors/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['scenario']} | {r['ood_sets']} | {r['detectors']} | {r['draws']} | {r['n']} | "
            f"{r['vectorised_s']:.2f} | {r['naive_s_extrapolated']:.1f} | {r['speedup']:.0f}× | "
            f"{r['draw_detectors_per_s']:,.0f} |"
        )
    if not all(r["means_agree"] for r in results):
        print("\nWARNING: the loop's and the vectorised means disagree beyond sampling error")
    if args.json:
        atomic_write_text(args.json, json.dumps({"load_average": load, "results": results}, indent=2) + "\n")
    if args.figure:
        from oodbench.report.build import curve_sizes
        from oodbench.report.figures import fig_subsample_curves, save_figure

        curves = {
            name: subsample_curve(
                demo_ids,
                ood,
                curve_sizes(len(next(iter(ood.values()))), 8),
                draws=args.draws,
                seed=args.seed,
                ood_dataset=name,
            )
            for name, ood in demo_oods.items()
        }
        save_figure(
            fig_subsample_curves(curves), args.figure.parent, args.figure.stem, [args.figure.suffix.lstrip(".")]
        )
        print(f"\nwrote {args.figure}")


if __name__ == "__main__":
    main()
