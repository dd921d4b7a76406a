"""knn's exact and IVF indexes side by side: score time (interleaved, best of R) and AUROC / FPR@95 against exact.

Features from `paper_scale.Synthetic` (post-ReLU rows around C = 1000 class centres; OOD rows between two classes),
ℓ2-normalised by the detector. Each configuration is fitted once; the score passes are interleaved round by round
so that a change of load on a shared machine reaches every configuration alike. Reports per configuration the
fit time, the best score time, its ratio to the exact search's best, the share of fit rows the queries probed,
and the AUROC and FPR@95 differences (points) from the exact score (ID test rows positive).

Example (1/20 of the paper's fit set, k at the paper's share of the fit set per class):
    .venv/bin/python benchmarks/knn_index.py --fit 64058 --d 2048 --k 50 --nprobe 4,8,16 --nlist 0,253

`--breakdown` instead times the IVF search's parts on the full-size per-list shapes (unit float32 rows, D = 2048,
lists of 1,000 rows, k = 1000, 32 lists probed per query, ~160 queries per list as in a 6,400-row chunk of the
paper's 1,281 lists) over few lists: the per-list GEMMs alone, the merge of the products into each query's k
largest alone (the plain concatenate-and-partition merge and the thresholded, buffered one of
`ivf_kth_similarity`), and both whole searches, best of R, on one BLAS thread as the search runs:
    .venv/bin/python benchmarks/knn_index.py --breakdown --lists 64

`--store PATH` instead reads a store that `paper_scale.py --keep-store` left (PATH: its `<workdir>/store`): the fit
features (memory-mapped), and a seeded sample of `--id` ID test rows and `--ood` OOD rows drawn from all the other
sets together; it fits and scores the exact index, then the IVF index, one after the other (each deleted before the
next is fitted, so memory holds one N x D float32 index at a time), and reports each one's fit and score time,
AUROC and FPR@95 (ID positive) and the IVF's differences from the exact ones:
    .venv/bin/python benchmarks/knn_index.py --store /var/tmp/ps/store --id 20000 --ood 20000 --nprobe 32
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_scale import CLASSES, FIT, ID_TEST, MODEL, Synthetic  # noqa: E402

from oodbench.core.metrics import auroc, fpr_at_tpr  # noqa: E402
from oodbench.core.outputs import Outputs  # noqa: E402
from oodbench.core.store import Store  # noqa: E402
from oodbench.detectors import create  # noqa: E402
from oodbench.detectors.feature import (  # noqa: E402
    _ivf_lists,
    _normalize_in_place,
    _RunningKth,
    ivf_kth_similarity,
    unit_float32,
)


def features(synthetic: Synthetic, rows: int, seed: list[int], ood: bool) -> np.ndarray:
    """`rows` synthetic feature rows."""
    return synthetic.block(rows, np.random.default_rng(seed), ood)["features"]


def _probe_plan(queries: np.ndarray, centroids: np.ndarray, nprobe: int) -> list[tuple[int, np.ndarray]]:
    """(list number, queries probing it) for each probed list, in the order `ivf_kth_similarity` visits them."""
    rows, nlist = queries.shape[0], centroids.shape[0]
    nprobe = min(nprobe, nlist)
    if nprobe < nlist:
        probes = np.argpartition(-(queries @ centroids.T), nprobe - 1, axis=1)[:, :nprobe]
    else:
        probes = np.broadcast_to(np.arange(nlist), (rows, nlist))
    pairs = probes.ravel()
    order = np.argsort(pairs, kind="stable")
    owner = np.repeat(np.arange(rows), nprobe)[order]
    bounds = np.searchsorted(pairs[order], np.arange(nlist + 1))
    return [(int(n), owner[bounds[n] : bounds[n + 1]]) for n in np.flatnonzero(np.diff(bounds))]


def _concat_merge(rows: int, k: int, plan: list[tuple[int, np.ndarray]], products: list[np.ndarray]) -> np.ndarray:
    """The plain merge: per list, concatenate each query's k held values with its products and keep the k largest."""
    top = np.full((rows, k), -np.inf, dtype=np.float32)
    for (_, who), block in zip(plan, products, strict=True):
        merged = np.concatenate([top[who], block], axis=1)
        top[who] = np.partition(merged, merged.shape[1] - k, axis=1)[:, merged.shape[1] - k :]
    return top.min(axis=1).astype(np.float64)


def concat_merge_search(queries: np.ndarray, centroids: np.ndarray, lists: list[np.ndarray], nprobe: int, k: int):
    """The IVF search with the plain merge (products and probes as `ivf_kth_similarity`'s), the reference."""
    plan = _probe_plan(queries, centroids, nprobe)
    top = np.full((queries.shape[0], k), -np.inf, dtype=np.float32)
    for number, who in plan:
        merged = np.concatenate([top[who], queries[who] @ lists[number].T], axis=1)
        top[who] = np.partition(merged, merged.shape[1] - k, axis=1)[:, merged.shape[1] - k :]
    return top.min(axis=1).astype(np.float64)


def breakdown(args: argparse.Namespace) -> dict:
    """Time the IVF search's GEMMs, its merge (plain and thresholded) and the whole searches on full-size shapes."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(args.seed)
    d, size, k, nprobe = args.d, args.list_size, args.k, args.nprobe_breakdown
    rows = args.lists * args.per_list // nprobe
    bank = _normalize_in_place(rng.standard_normal((args.lists * size, d), dtype=np.float32))
    lists = [bank[i * size : (i + 1) * size] for i in range(args.lists)]
    centroids = _normalize_in_place(rng.standard_normal((args.lists, d), dtype=np.float32))
    queries = _normalize_in_place(rng.standard_normal((rows, d), dtype=np.float32))
    plan = _probe_plan(queries, centroids, nprobe)
    gathered = [np.ascontiguousarray(queries[who]) for _, who in plan]
    widths = [int(w) for w in args.merge_width.split(",")]

    def search(width: int) -> np.ndarray:
        return ivf_kth_similarity(queries, centroids, lists, nprobe, k, merge_width=width)[0]

    def thresholded(width: int) -> np.ndarray:
        running = _RunningKth(rows, k, width)
        for (_, who), block in zip(plan, products, strict=True):
            running.add(who, block)
        return running.result()

    with threadpool_limits(1, user_api="blas"):
        products = [g @ lists[n].T for g, (n, _) in zip(gathered, plan, strict=True)]
    runs = {
        "gemm": lambda: [g @ lists[n].T for g, (n, _) in zip(gathered, plan, strict=True)],
        "merge_concat": lambda: _concat_merge(rows, k, plan, products),
        **{f"merge_thresholded_w{w}": (lambda w=w: thresholded(w)) for w in widths},
        "search_concat": lambda: concat_merge_search(queries, centroids, lists, nprobe, k),
        **{f"search_thresholded_w{w}": (lambda w=w: search(w)) for w in widths},
    }
    reference = concat_merge_search(queries, centroids, lists, nprobe, k)
    identical = all(np.array_equal(search(w), reference) for w in widths)
    # Round by round, every part once per round: a change of load on a shared machine reaches all alike.
    timings = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeats):
        for name, run in runs.items():
            with threadpool_limits(1, user_api="blas"):
                start = time.perf_counter()
                run()
                timings[name] = min(timings[name], time.perf_counter() - start)
    flops = 2.0 * d * size * sum(len(who) for _, who in plan)
    report = {
        "lists": args.lists, "list_size": size, "d": d, "k": k, "nprobe": nprobe, "queries": rows,
        "queries_per_list": float(np.mean([len(who) for _, who in plan])), "gemm_gflops": flops / timings["gemm"] / 1e9,
        "bit_identical": identical, "seconds": timings,
    }  # fmt: skip
    print(
        f"{rows} queries x {nprobe} of {args.lists} lists of {size} rows, D = {d}, k = {k}, "
        f"{report['queries_per_list']:.0f} queries per list; one BLAS thread, best of {args.repeats}",
        flush=True,
    )
    for name, seconds in timings.items():
        whole = timings["search_thresholded_w" + name.split("_w")[-1]] if "_w" in name else timings["search_concat"]
        print(f"  {name:26s} {seconds:8.3f} s  {100 * seconds / whole:5.1f} % of its whole search", flush=True)
    print(f"  GEMM rate {report['gemm_gflops']:.1f} GFLOP/s; thresholded results bit-identical: {identical}")
    return report


def _sample(rows: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` (at most `rows`) distinct row numbers, sorted so a memory-mapped read goes forward."""
    return np.sort(rng.choice(rows, size=min(count, rows), replace=False))


def from_store(args: argparse.Namespace) -> dict:
    """Exact and IVF knn, fitted and scored one after the other on a paper_scale store's features."""
    store = Store(Path(args.store))
    if not store.exists(args.model, args.fit_set) or not store.exists(args.model, args.id_set):
        raise SystemExit(f"knn_index: {args.store} holds no {args.model}/{args.fit_set} and /{args.id_set} entries")
    rng = np.random.default_rng(args.seed)
    fit = store.read(args.model, args.fit_set)
    id_rows = store.read(args.model, args.id_set)
    oods = [name for name in store.datasets(args.model) if name not in (args.fit_set, args.id_set)]
    if not oods:
        raise SystemExit(f"knn_index: {args.store} holds no OOD sets for {args.model}")
    entries = {name: store.read(args.model, name) for name in oods}  # opened once: sizes, then sampled rows
    sizes = np.array([len(entries[name]) for name in oods])
    picked = _sample(int(sizes.sum()), args.ood, rng)
    which = np.searchsorted(np.cumsum(sizes), picked, side="right")  # the OOD set of each pooled row number
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    ood_parts = [np.asarray(entries[name].features)[picked[which == i] - offsets[i]] for i, name in enumerate(oods)]
    id_part = np.asarray(id_rows.features)[_sample(len(id_rows), args.id, rng)]
    test = Outputs(np.concatenate([id_part, *ood_parts]))
    is_id = np.r_[np.ones(len(id_part), bool), np.zeros(len(test) - len(id_part), bool)]
    nprobe = int(args.nprobe.split(",")[0])
    nlist = int(args.nlist.split(",")[0]) or None
    report: dict = {
        "store": str(args.store), "fit_rows": len(fit), "d": fit.num_features, "k": args.k,
        "id_rows": int(is_id.sum()), "ood_rows": int((~is_id).sum()), "ood_sets": oods, "indexes": {},
    }  # fmt: skip
    print(
        f"fit {len(fit):,} x {fit.num_features}, k = {args.k}; test {is_id.sum():,} ID + {(~is_id).sum():,} OOD rows "
        f"from {len(oods)} sets",
        flush=True,
    )
    scores = {}
    for name, params in (("flat", {}), ("ivf", {"index": "ivf", "nlist": nlist, "nprobe": nprobe})):
        start = time.perf_counter()
        detector = create("knn", k=args.k, **params).fit(fit)
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        scores[name] = detector.score(test)
        score_s = time.perf_counter() - start
        del detector  # one index in memory at a time
        gc.collect()
        row = {
            "fit_s": fit_s,
            "score_s": score_s,
            "auroc": 100 * auroc(scores[name][is_id], scores[name][~is_id]),
            "fpr95": 100 * fpr_at_tpr(scores[name][is_id], scores[name][~is_id]),
            # KiB on Linux; includes the memory-mapped store pages the fit read (reclaimable, not anonymous).
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        }
        report["indexes"][name] = row
        print(
            f"{name:4s} fit {fit_s:8.1f} s  score {score_s:8.1f} s  AUROC {row['auroc']:6.2f}  "
            f"FPR95 {row['fpr95']:6.2f}  peak RSS so far {row['peak_rss_gib']:.1f} GiB",
            flush=True,
        )
    flat, ivf = report["indexes"]["flat"], report["indexes"]["ivf"]
    report["d_auroc"] = ivf["auroc"] - flat["auroc"]
    report["d_fpr95"] = ivf["fpr95"] - flat["fpr95"]
    report["max_abs_score_difference"] = float(np.abs(scores["ivf"] - scores["flat"]).max())
    print(
        f"ivf - flat: AUROC {report['d_auroc']:+.3f}, FPR95 {report['d_fpr95']:+.3f} points; "
        f"largest score difference {report['max_abs_score_difference']:.3g}; "
        f"exact / IVF score time {flat['score_s'] / ivf['score_s']:.1f}",
        flush=True,
    )
    return report


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison; returns (and optionally writes) the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=int, default=64_058, help="fit rows (default: 1/20 of ImageNet-1k train)")
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--id", type=int, default=2000, help="ID test rows (--store: sampled from the ID set)")
    parser.add_argument(
        "--ood", type=int, default=2000, help="OOD test rows (--store: sampled from all OOD sets together)"
    )
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--nlist", default="0", help="comma-separated IVF list counts; 0: knn's default rule")
    parser.add_argument("--nprobe", default="8,32", help="comma-separated lists probed per query")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--breakdown", action="store_true", help="time the IVF search's parts (see above)")
    parser.add_argument("--lists", type=int, default=64, help="--breakdown: lists")
    parser.add_argument("--list-size", type=int, default=1000, help="--breakdown: rows per list")
    parser.add_argument("--per-list", type=int, default=160, help="--breakdown: queries per list (mean)")
    parser.add_argument("--nprobe-breakdown", type=int, default=32, help="--breakdown: lists probed per query")
    parser.add_argument("--merge-width", default="1000,2000", help="--breakdown: comma-separated merge widths")
    parser.add_argument("--store", help="a paper_scale.py --keep-store store: exact then IVF knn on its features")
    parser.add_argument("--model", default=MODEL, help="--store: model id")
    parser.add_argument("--fit-set", default=FIT, help="--store: fit dataset id")
    parser.add_argument("--id-set", default=ID_TEST, help="--store: ID test dataset id")
    args = parser.parse_args(argv)
    if args.breakdown or args.store:
        report = breakdown(args) if args.breakdown else from_store(args)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        return report
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
    add("flat, exact=False", exact=False)  # the float32 product's distance, as faiss and the peers
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
    queries = unit_float32(test.features)
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
