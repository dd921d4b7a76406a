"""Benchmark the 21 post-hoc detectors on synthetic ImageNet-shaped arrays.

Reports, per detector: fit time, score time, scoring throughput (rows/s), extra peak memory, and the speed ratio
against pytorch-ood's implementation of the same detector on the same arrays (where pytorch-ood has one; install
with `pip install 'oodbench[bench]'`). In the same run: the Mahalanobis scoring time against a float32 GEMM of the
same FLOPs (and whether its order equals the all-float64 computation's); fitting all 21 detectors, and the
Gaussian family, together (shared statistics) against the sum of their fits alone, in units of one float32 Gram
pass over the fit set; and the disk a store entry needs while `finalize` merges its shards. A larger-than-RAM mode
writes a memory-mapped fit set to disk chunk by chunk and fits the Gaussian family on it together.

Examples:
    .venv/bin/python benchmarks/detectors.py                                # 200k x 768 fit, C=1000, 50k ID + 50k OOD
    .venv/bin/python benchmarks/detectors.py --fit 20000 --test 5000 --detectors maha,knn --no-reference
    .venv/bin/python benchmarks/detectors.py --larger-than-ram --workdir /var/tmp   # 1.28M x 4096 float32 + logits
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata

from oodbench.analysis.published import POST_HOC_POOL
from oodbench.core.metrics import auroc
from oodbench.core.outputs import Head, Outputs
from oodbench.core.store import Store
from oodbench.detectors import available, create, get_class
from oodbench.detectors.shared import declared_statistics, fit_all
from oodbench.util.atomic import atomic_write_text

# ----------------------------------------------------------------------------- measurement helpers


def _rss_anon_bytes() -> int:
    """Anonymous resident memory of this process (excludes file-backed pages of memory maps)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


@contextmanager
def peak_memory() -> Iterator[dict[str, float]]:
    """Sample anonymous RSS every 5 ms; yields a dict that holds the peak increase (bytes) on exit."""
    result = {"peak_bytes": 0.0}
    baseline = _rss_anon_bytes()
    peak = [baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_anon_bytes())
            stop.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        peak[0] = max(peak[0], _rss_anon_bytes())
        result["peak_bytes"] = float(peak[0] - baseline)


def gemm_gflops(dim: int, dtype: type, rows: int = 8192, repeats: int = 3) -> float:
    """Best-of-`repeats` GFLOP/s of a (rows x dim) @ (dim x dim) matrix product in `dtype`."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim)).astype(dtype)
    b = rng.standard_normal((dim, dim)).astype(dtype)
    a @ b  # warm-up: thread pool start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * dim * dim / best / 1e9


# ----------------------------------------------------------------------------- synthetic data


class Synthetic:
    """ImageNet-shaped features: post-ReLU Gaussian classes, a linear head, and 'between-class' OOD rows."""

    def __init__(self, dim: int, classes: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.classes = dim, classes
        self.centres = (rng.standard_normal((classes, dim)) * 0.6 + 0.4).astype(np.float32)
        weight = 0.5 * self.centres + 0.1 * rng.standard_normal((classes, dim)).astype(np.float32)
        self.head = Head(weight.astype(np.float32), (0.1 * rng.standard_normal(classes)).astype(np.float32))
        self.seed = seed

    def features(self, rows: int, rng: np.random.Generator, ood: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Float32 features (rows x D) and their class labels."""
        labels = rng.integers(0, self.classes, rows)
        centre = self.centres[labels]
        if ood:  # halfway between two classes: uncertain and off the class manifolds
            centre = (centre + self.centres[rng.integers(0, self.classes, rows)]) / 2
        noise = rng.standard_normal((rows, self.dim), dtype=np.float32)
        return np.maximum(centre + noise, 0.0, dtype=np.float32), labels

    def outputs(self, rows: int, seed: int, ood: bool = False, chunk: int = 65536) -> Outputs:
        """In-memory Outputs with logits = head(features) in float32."""
        rng = np.random.default_rng(seed)
        features = np.empty((rows, self.dim), np.float32)
        logits = np.empty((rows, self.classes), np.float32)
        labels = np.empty(rows, np.int64)
        weight_t = self.head.weight.T.copy()
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            features[start:stop], labels[start:stop] = self.features(stop - start, rng, ood)
            logits[start:stop] = features[start:stop] @ weight_t + self.head.bias
        return Outputs(features, logits, labels, check_finite=False)


def concat(a: Outputs, b: Outputs) -> Outputs:
    return Outputs(np.concatenate([a.features, b.features]), np.concatenate([a.logits, b.logits]), check_finite=False)


# ----------------------------------------------------------------------------- pytorch-ood counterparts


def reference_adapters() -> dict[str, Callable[..., tuple[Callable[[], Any], Callable[[Any], np.ndarray]]]]:
    """For each detector with a pytorch-ood counterpart: build(fit, head, fit_rows) -> (fit_fn, score_fn(test))."""
    import torch
    from pytorch_ood import detector as pod

    def tensors(outputs: Outputs) -> tuple[Any, Any, Any]:
        labels = None if outputs.labels is None else torch.from_numpy(np.asarray(outputs.labels))
        return torch.from_numpy(np.asarray(outputs.features)), torch.from_numpy(np.asarray(outputs.logits)), labels

    def linear(head: Head) -> Any:
        layer = torch.nn.Linear(head.num_features, head.num_classes)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(head.weight))
            layer.bias.copy_(torch.from_numpy(head.bias))
        return layer.eval()

    def batched(fn: Callable[[Any], Any], x: Any, rows: int) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([fn(x[i : i + rows]) for i in range(0, x.shape[0], rows)]).numpy()

    def logit_only(score: Callable[[Any], Any]):
        def build(fit, head, fit_rows):
            return (lambda: None), (lambda test: -batched(score, tensors(test)[1], 4096))

        return build

    def kl_matching(fit, head, fit_rows):
        z, f, y = tensors(fit)
        det = pod.KLMatching(None)
        return (lambda: det.fit_logits(f, y)), (lambda test: -batched(det.predict_logits, tensors(test)[1], 4096))

    def react(fit, head, fit_rows):
        z, f, y = tensors(fit)
        det = pod.ReAct(None, linear(head), percentile=0.9)
        return (lambda: det.fit_feature_maps(z, y)), (
            lambda test: -batched(det.predict_feature_maps, tensors(test)[0], 4096)
        )

    def shaped(cls, percentile, **kwargs):
        def build(fit, head, fit_rows):
            layer = linear(head)
            det = cls(None, lambda x: layer(x.flatten(1)), percentile=percentile, **kwargs)

            # ASH prunes its input in place: hand it a copy, shaped as B x D x 1 x 1 feature maps.
            def score(x):
                return det.predict_feature_maps(x.clone().view(x.shape[0], -1, 1, 1))

            return (lambda: None), (lambda test: -batched(score, tensors(test)[0], 4096))

        return build

    def dice(fit, head, fit_rows):
        z, f, y = tensors(fit)
        det = pod.DICE(None, torch.from_numpy(head.weight), torch.from_numpy(head.bias), p=0.9)
        # Its scoring forms a B x C x D tensor; small batches keep that under ~200 MB.
        return (lambda: det.fit_features(z, y)), (lambda test: -batched(det.predict_features, tensors(test)[0], 64))

    def gaussian(cls, normalize):
        def build(fit, head, fit_rows):
            z, f, y = tensors(fit)
            prep = (lambda x: torch.nn.functional.normalize(x, dim=1)) if normalize else (lambda x: x)
            det = cls(None)
            return (lambda: det.fit_features(prep(z), y)), (
                lambda test: -batched(lambda x: det.predict_features(prep(x)), tensors(test)[0], 1024)
            )

        return build

    def knn(fit, head, fit_rows):
        z, f, y = tensors(fit)
        det = pod.KNN(None, k=1000)
        return (lambda: det.fit_features(z, y)), (lambda test: -batched(det.predict_features, tensors(test)[0], 1024))

    def mcm(fit, head, fit_rows):
        z, f, y = tensors(fit)
        holder = {}

        def fit_fn():
            sums = torch.zeros(head.num_classes, z.shape[1]).index_add_(0, y, z)
            holder["det"] = pod.MCM(None, sums / torch.bincount(y, minlength=head.num_classes)[:, None].clamp(min=1))

        return fit_fn, (lambda test: -batched(holder["det"].predict_features, tensors(test)[0], 4096))

    def fdbd(fit, head, fit_rows):
        z, f, y = tensors(fit)
        det = pod.fDBD(None, linear(head))
        return (lambda: det.fit_features(z)), (lambda test: -batched(det.predict_features, tensors(test)[0], 4096))

    def nac(fit, head, fit_rows):
        z, f, y = tensors(fit)
        rows = torch.from_numpy(np.sort(np.random.default_rng(0).choice(z.shape[0], fit_rows, replace=False)))

        class Features(torch.nn.Module):  # the hooked "layer": the features, as a tensor autograd can differentiate to
            def forward(self, x):
                return x.detach().requires_grad_(True)

        model = torch.nn.Sequential(Features(), linear(head))
        det = pod.NACUE(model, layers=[model[0]], m_bins=50, alpha=3000.0, o_star=10)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(z[rows], y[rows]), batch_size=256)
        return (lambda: det.fit(loader)), (
            lambda test: (
                -np.concatenate(
                    [det.predict(x).numpy() for x in torch.from_numpy(np.asarray(test.features)).split(1024)]
                )
            )
        )

    def vim(fit, head, fit_rows):
        z, f, y = tensors(fit)
        from oodbench.detectors.hybrid import vim_default_dim

        det = pod.ViM(
            None, vim_default_dim(head.num_features), torch.from_numpy(head.weight), torch.from_numpy(head.bias)
        )
        return (lambda: det.fit_features(z, y)), (lambda test: -batched(det.predict_features, tensors(test)[0], 4096))

    def nnguide(fit, head, fit_rows):
        z, f, y = tensors(fit)
        bank = torch.from_numpy(
            np.sort(np.random.default_rng(0).choice(z.shape[0], int(0.01 * z.shape[0]), replace=False))
        )
        det = pod.NNGuide(None, linear(head), k=100)
        return (lambda: det.fit_features(z[bank], y[bank])), (
            lambda test: -batched(det.predict_features, tensors(test)[0], 4096)
        )

    return {
        "msp": logit_only(pod.MaxSoftmax.score),
        "maxlogit": logit_only(pod.MaxLogit.score),
        "energy": logit_only(pod.EnergyBased.score),
        "gen": logit_only(lambda f: pod.GEN.score(f, gamma=0.1, M=100)),
        "kl_matching": kl_matching,
        "react": react,
        "ash_s": shaped(pod.ASH, 0.9, variant="ash-s"),
        "scale": shaped(pod.SCALE, 0.85),
        "dice": dice,
        "maha": gaussian(pod.Mahalanobis, False),
        "rmaha": gaussian(pod.RMD, False),
        "maha++": gaussian(pod.Mahalanobis, True),
        "rmaha++": gaussian(pod.RMD, True),
        "knn": knn,
        "mcm": mcm,
        "fdbd": fdbd,
        "nac": nac,
        "vim": vim,
        "nnguide": nnguide,
    }


# ----------------------------------------------------------------------------- the runs


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    """The result and the fastest of `repeats` timed calls (a shared machine adds noise, never speed)."""
    runs = [timed(fn) for _ in range(repeats)]
    return runs[0][0], min(seconds for _, seconds in runs)


def bench_ours(name: str, fit: Outputs, head: Head, test: Outputs, n_id: int) -> dict[str, Any]:
    """Fit and score one of our detectors; time, throughput, extra peak memory, AUROC."""
    with peak_memory() as memory:
        detector, fit_s = timed(lambda: create(name).fit(fit, head))
        scores, score_s = timed(lambda: detector.score(test))
    return {
        "fit_s": fit_s,
        "score_s": score_s,
        "rows": len(test),
        "rows_per_s": len(test) / score_s,
        "peak_mb": memory["peak_bytes"] / 2**20,
        "auroc": auroc(scores[:n_id], scores[n_id:]),
        "detector": detector,
    }


def bench_reference(build, fit: Outputs, head: Head, test: Outputs, fit_rows: int, repeats: int) -> dict[str, Any]:
    """Fit and score pytorch-ood's counterpart on the same arrays (scoring: best of `repeats`)."""
    fit_fn, score_fn = build(fit, head, fit_rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, fit_s = timed(fit_fn)
        scores, score_s = best_of(lambda: score_fn(test), repeats)
    return {"fit_s": fit_s, "score_s": score_s, "rows": len(test), "rows_per_s": len(test) / score_s, "scores": scores}


def blas_comparison(detector: Any, test: Outputs, dim: int) -> dict[str, Any]:
    """Mahalanobis scoring time against a float32 GEMM of the same FLOPs, timed back to back (same machine load).

    Also checks the float32 class search against the all-float64 one (the same ranks and the same AUROC), and
    times the design's floor on the same rows: its two BLAS products alone (the float64 whitening, triangular or
    full, and the float32 class search), with nothing else.
    """
    from oodbench.detectors._gaussian import blas_matmul, whiten_triangular

    gaussians = detector.gaussians_
    rank = gaussians.whitener.shape[1]
    rows = len(test)
    classes = detector.means_.shape[0]
    flops = 2.0 * rows * dim * rank + 2.0 * rows * rank * classes
    if gaussians.background is not None:  # a singular background needs its own whitening
        flops += 2.0 * rows * dim * gaussians.background.whitener.shape[1]
    # The triangular whitener (maha, maha++ with an invertible covariance) is one BLAS trmm, D(D + 1)/2
    # multiply-adds a row: the FLOPs it executes, beside the nominal ones above (the measure of the problem).
    triangular = bool(getattr(gaussians, "triangular", False))
    executed = flops - (2.0 * rows * dim * rank - rows * dim * (dim + 1.0)) if triangular else flops
    # One GEMM (rows x dim) @ (dim x k) with k chosen so that it performs the same number of FLOPs.
    inner = max(1, int(round(flops / (2.0 * rows * dim))))
    a = np.asarray(test.features, dtype=np.float32)
    b = np.random.default_rng(0).standard_normal((dim, inner)).astype(np.float32)
    centred64 = np.asarray(test.features, dtype=np.float64) - gaussians.centre
    lifted = np.ones((rows, rank + 1), dtype=np.float32)

    def gemm() -> None:
        for start in range(0, rows, 8192):  # in row blocks, as the detector scores, so memory stays bounded
            a[start : start + 8192] @ b

    def floor() -> None:
        for start in range(0, rows, 8192):
            block = centred64[start : start + 8192].copy()
            if triangular:
                whiten_triangular(block, gaussians.whitener, overwrite=True)
            else:
                blas_matmul(block, gaussians.whitener)
            blas_matmul(lifted[start : start + 8192], gaussians.search_)

    def score_float64() -> np.ndarray:
        gaussians.float64_search = True  # the all-float64 class search: the reference order
        try:
            return detector.score(test)
        finally:
            gaussians.float64_search = False

    gemm_times, score_times, score64_times, floor_times = [], [], [], []
    for _ in range(3):  # alternated, so drifting load affects all four alike; a shared machine adds time, never
        # speed, so each side's fastest run is its best estimate
        gemm_times.append(timed(gemm)[1])
        fast, score_s = timed(lambda: detector.score(test))
        slow, score64_s = timed(score_float64)
        floor_times.append(timed(floor)[1])
        score_times.append(score_s)
        score64_times.append(score64_s)
    gemm_s = min(gemm_times)
    half = rows // 2
    return {
        "blas_ratio": min(score_times) / gemm_s,
        "blas_ratio_float64_search": min(score64_times) / gemm_s,
        "floor_ratio": min(floor_times) / gemm_s,
        "triangular_whitening": triangular,
        "same_ranks_as_float64": bool((rankdata(fast) == rankdata(slow)).all()),
        "auroc_difference_vs_float64": abs(auroc(fast[:half], fast[half:]) - auroc(slow[:half], slow[half:])),
        "maha_flops": flops,
        "executed_flops": executed,
        "blas_ratio_executed_flops": min(score_times) / (gemm_s * executed / flops),
        "gemm32_gflops_same_run": flops / gemm_s / 1e9,
    }


def gram_pass_f32(features: np.ndarray, rows: int = 4096) -> float:
    """Seconds of one float32 Gram pass over the fit set (ssyrk per block, float32 accumulation): the fit unit."""
    import scipy.linalg.blas

    dim = features.shape[1]
    buffer = np.zeros((dim, dim), dtype=np.float32, order="F")
    start_time = time.perf_counter()
    for start in range(0, features.shape[0], rows):
        block = np.ascontiguousarray(features[start : start + rows], dtype=np.float32)
        scipy.linalg.blas.ssyrk(1.0, block.T, beta=1.0, c=buffer, trans=0, lower=0, overwrite_c=1)
    return time.perf_counter() - start_time


def fit_floor(names: list[str], fit: Outputs, head: Head, gram_s: float) -> dict[str, float]:
    """What fitting `names` together cannot go below, in seconds: its passes' BLAS products and its fixed work.

    - one float32 Gram pass per distinct Gram matrix the detectors need: the raw features' (maha, rmaha, neco,
      vim) and the ℓ2-normalised ones' (maha++, rmaha++);
    - vim's residual norms, which need its principal basis, known only after the Gram: one float32 product of
      the fit set with the cheaper of the principal and the residual bases;
    - the work that does not grow with N (eigendecompositions, Cholesky factors, whiteners: D³), measured as the
      same joint fit on the first 4·D rows.
    """
    return best_floor(names, gram_s, [fixed_floor_parts(names, fit, head) for _ in range(2)])


def best_floor(names: list[str], gram_s: float, rounds: list[dict[str, float]]) -> dict[str, float]:
    """The floor from a Gram pass's best time and the best of each other part over `rounds`, with its total."""
    floor = {"gram_passes": gram_passes(names) * gram_s}
    floor.update({part: min(times[part] for times in rounds) for part in rounds[0]})
    floor["total"] = sum(floor.values())
    return floor


def gram_passes(names: list[str]) -> int:
    """Distinct Gram matrices that fitting `names` needs: the raw features' and the ℓ2-normalised ones'."""
    declared = set().union(*(declared_statistics(get_class(name)) for name in names))
    return bool(declared & {"features", "features_by_class"}) + ("normalized_by_class" in declared)


def fixed_floor_parts(names: list[str], fit: Outputs, head: Head) -> dict[str, float]:
    """The floor's parts besides its Gram passes, timed once each: vim's residual product and the D³ work."""
    from oodbench.detectors.hybrid import vim_default_dim

    parts = {}
    if "vim" in names:
        dim = fit.num_features
        principal = vim_default_dim(dim)
        basis = np.random.default_rng(0).standard_normal((dim, min(principal, dim - principal))).astype(np.float32)
        start_time = time.perf_counter()
        for start in range(0, len(fit), 4096):
            np.ascontiguousarray(fit.features[start : start + 4096], dtype=np.float32) @ basis
        parts["vim_residual_product"] = time.perf_counter() - start_time
    small = fit.subset(np.arange(min(len(fit), 4 * fit.num_features)))
    parts["fixed_d3_work"] = timed(lambda: fit_all([create(n) for n in names], small, head, gram_dtype="float32"))[1]
    return parts


def fit_together(names: list[str], fit: Outputs, head: Head, alone_s: dict[str, float], gram_s: float) -> dict:
    """Fit `names` together (shared statistics, float64 and float32 Gram) against the sum of their fits alone."""
    report: dict[str, Any] = {"detectors": names, "alone_sum_s": sum(alone_s[name] for name in names)}
    for gram_dtype in ("float64", "float32"):
        with peak_memory() as memory:
            _, seconds = timed(
                lambda dtype=gram_dtype: fit_all([create(n) for n in names], fit, head, gram_dtype=dtype)
            )
        report[f"together_{gram_dtype}_s"] = seconds
        report[f"together_{gram_dtype}_peak_mb"] = memory["peak_bytes"] / 2**20
    report["alone_sum_in_gram_passes"] = report["alone_sum_s"] / gram_s
    for gram_dtype in ("float64", "float32"):
        report[f"together_{gram_dtype}_in_gram_passes"] = report[f"together_{gram_dtype}_s"] / gram_s
    if set(names) <= set(GAUSSIAN_FAMILY):  # the floor is derived for these six's statistics only
        report["floor"] = fit_floor(names, fit, head, gram_s)
        report["floor_in_gram_passes"] = report["floor"]["total"] / gram_s
    return report


def main_fit_target(args: argparse.Namespace) -> dict[str, Any]:
    """The six Gaussian-family detectors fitted together (float32 Gram) against their floor, best of --repeats.

    Each round times every part of the floor (fit_floor: a float32 Gram pass, vim's residual product, the D³ work)
    and then the joint fit, so that a change of load on a shared machine reaches both; each is the best of its
    rounds. --blas-threads pins the BLAS's threads (1: CPU time on one core).
    """
    from threadpoolctl import threadpool_limits

    data = Synthetic(args.dim, args.classes, args.seed)
    fit = data.outputs(args.fit, args.seed + 1)
    names = list(GAUSSIAN_FAMILY)
    with threadpool_limits(args.blas_threads):
        # A small joint fit first: imports and first-call costs stay out of the timed rounds.
        fit_all([create(n) for n in names], fit.subset(np.arange(min(len(fit), 5000))), data.head, gram_dtype="float32")
        gram_times, fit_times, part_times = [], [], []
        for _ in range(args.repeats):
            gram_times.append(gram_pass_f32(fit.features))
            part_times.append(fixed_floor_parts(names, fit, data.head))
            fit_times.append(
                timed(lambda: fit_all([create(n) for n in names], fit, data.head, gram_dtype="float32"))[1]
            )
    gram_s = min(gram_times)
    floor = best_floor(names, gram_s, part_times)
    report = {
        "fit_rows": len(fit),
        "dim": args.dim,
        "blas_threads": args.blas_threads,
        "gram_pass_s": gram_times,
        "floor_parts_s": part_times,
        "together_float32_s": fit_times,
        "floor": floor,
        "floor_in_gram_passes": floor["total"] / gram_s,
        "together_in_gram_passes": min(fit_times) / gram_s,
        "ratio_to_floor": min(fit_times) / floor["total"],
    }
    print(
        f"six together (float32 Gram), best of {args.repeats}: {min(fit_times):.2f} s = "
        f"{report['together_in_gram_passes']:.2f} Gram passes; floor {floor['total']:.2f} s = "
        f"{report['floor_in_gram_passes']:.2f} passes ("
        + ", ".join(f"{part} {seconds:.2f}s" for part, seconds in floor.items() if part != "total")
        + f"): {report['ratio_to_floor']:.3f}x the floor",
        flush=True,
    )
    return report


def finalize_disk(workdir: Path, rows: int, dim: int, shard_size: int) -> dict[str, Any]:
    """Peak data bytes of a store entry while `finalize` merges its shards, in units of the entry and a shard."""
    from oodbench.core import store as store_module

    root = workdir / "oodbench-finalize-bench"
    shutil.rmtree(root, ignore_errors=True)
    try:
        rng = np.random.default_rng(0)
        writer = Store(root).writer("m", "d", provenance={"model": "m"}, num_items=rows, shard_size=shard_size)
        for shard in writer.pending_shards():
            span = writer.shard_rows(shard)
            count = span.stop - span.start
            writer.write_shard(
                shard,
                {
                    "features": rng.standard_normal((count, dim), dtype=np.float32),
                    "index": np.arange(span.start, span.stop),
                },
            )

        def data_bytes() -> int:
            return sum(p.stat().st_size for p in root.rglob("*.npy*") if p.is_file())

        before = data_bytes()
        shard_bytes = max(p.stat().st_size for p in root.rglob("shards/*.npy"))
        peaks = [before]
        original = store_module._merge_step
        store_module._merge_step = lambda step: peaks.append(data_bytes())
        try:
            _, seconds = timed(writer.finalize)
        finally:
            store_module._merge_step = original
        entry = data_bytes()
        return {
            "rows": rows,
            "dim": dim,
            "shard_size": shard_size,
            "entry_bytes": entry,
            "shard_bytes": shard_bytes,
            "peak_bytes": max(peaks),
            "peak_over_entry_in_shards": (max(peaks) - entry) / shard_bytes,
            "finalize_s": seconds,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def subset(outputs: Outputs, rows: int, n_id: int) -> tuple[Outputs, int]:
    """The first rows/2 ID rows and the first rows/2 OOD rows of a test set (ID rows first)."""
    half = min(rows // 2, n_id, len(outputs) - n_id)
    index = np.r_[0:half, n_id : n_id + half]
    return outputs.subset(index), half


def main_default(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if args.detectors == "paper":  # the paper's 21, in registry order
        names = [name for name in available() if name in POST_HOC_POOL]
    else:
        names = available() if args.detectors == "all" else args.detectors.split(",")
    data = Synthetic(args.dim, args.classes, args.seed)
    print(
        f"generating: fit {args.fit} x {args.dim}, C={args.classes}, test {args.test} ID + {args.test} OOD", flush=True
    )
    fit = data.outputs(args.fit, args.seed + 1)
    test = concat(data.outputs(args.test, args.seed + 2), data.outputs(args.test, args.seed + 3, ood=True))
    machine = {"gflops_f64": gemm_gflops(args.dim, np.float64), "gflops_f32": gemm_gflops(args.dim, np.float32)}
    print(f"GEMM: {machine['gflops_f64']:.1f} GFLOP/s float64, {machine['gflops_f32']:.1f} GFLOP/s float32", flush=True)
    references = {}
    if not args.no_reference:
        try:
            references = reference_adapters()
        except ImportError:
            print("pytorch-ood is not installed (pip install 'oodbench[bench]'): skipping the comparison", flush=True)
    results: dict[str, Any] = {}
    for name in names:
        # k-NN search costs N_fit x D per query: its throughput is measured on a subset of the test rows.
        scored, n_id = subset(test, args.knn_rows, args.test) if name == "knn" else (test, args.test)
        ours = bench_ours(name, fit, data.head, scored, n_id)
        detector = ours.pop("detector")
        row = {"ours": ours}
        mahalanobis = name in ("maha", "rmaha", "maha++", "rmaha++")
        if mahalanobis:
            row.update(blas_comparison(detector, subset(test, args.blas_rows, args.test)[0], args.dim))
        if name in references:
            # pytorch-ood's Mahalanobis family loops over the C classes, each a (rows x D) @ (D x D) product.
            ref_test, ref_id = subset(scored, args.ref_rows_maha if mahalanobis else args.ref_rows, n_id)
            reference = bench_reference(references[name], fit, data.head, ref_test, fit_rows=1000, repeats=args.repeats)
            ref_scores = reference.pop("scores")
            # Our detector, already fitted, on exactly the rows pytorch-ood scored, timed the same way.
            same_scores, same_s = best_of(lambda d=detector, t=ref_test: d.score(t), args.repeats)
            row["reference"] = reference
            row["same_rows"] = {
                "rows": len(ref_test),
                "score_s": same_s,
                "auroc": auroc(same_scores[:ref_id], same_scores[ref_id:]),
                "reference_auroc": auroc(ref_scores[:ref_id], ref_scores[ref_id:]),
            }
            row["speedup_score"] = reference["score_s"] / same_s
            if reference["fit_s"] > 0.01 and ours["fit_s"] > 0.01:  # detectors without a fit have nothing to compare
                row["speedup_fit"] = reference["fit_s"] / ours["fit_s"]
        results[name] = row
        print(format_row(name, row), flush=True)
    report: dict[str, Any] = {"machine": machine, "results": results}
    # Fitting together: every detector, and the Gaussian family, against the sum of their fits alone.
    gram_s = min(gram_pass_f32(fit.features) for _ in range(2))
    report["gram_pass_f32_s"] = gram_s
    alone = {name: row["ours"]["fit_s"] for name, row in results.items()}
    report["fit_together"] = {}
    for label, group in (("all", names), ("gaussian", [n for n in GAUSSIAN_FAMILY if n in names])):
        if group:
            report["fit_together"][label] = fit_together(group, fit, data.head, alone, gram_s)
            print(format_together(label, report["fit_together"][label]), flush=True)
    report["finalize"] = finalize_disk(Path(args.workdir), args.finalize_rows, args.dim, args.finalize_shard)
    print(
        f"finalize: peak {report['finalize']['peak_bytes'] / 2**20:.0f} MB for a "
        f"{report['finalize']['entry_bytes'] / 2**20:.0f} MB entry = entry + "
        f"{report['finalize']['peak_over_entry_in_shards']:.2f} shards",
        flush=True,
    )
    return report


GAUSSIAN_FAMILY = ("maha", "rmaha", "maha++", "rmaha++", "neco", "vim")


def format_together(label: str, row: dict[str, Any]) -> str:
    return (
        f"fit {label} together: float64 Gram {row['together_float64_s']:.2f}s "
        f"({row['together_float64_in_gram_passes']:.2f} float32 Gram passes), float32 Gram "
        f"{row['together_float32_s']:.2f}s ({row['together_float32_in_gram_passes']:.2f}); each alone, summed: "
        f"{row['alone_sum_s']:.2f}s ({row['alone_sum_in_gram_passes']:.2f})"
        + (
            f"; floor {row['floor']['total']:.2f}s ({row['floor_in_gram_passes']:.2f}: "
            + ", ".join(f"{part} {seconds:.2f}s" for part, seconds in row["floor"].items() if part != "total")
            + ")"
            if "floor" in row
            else ""
        )
    )


def format_row(name: str, row: dict[str, Any]) -> str:
    ours = row["ours"]
    text = (
        f"{name:10s} fit {ours['fit_s']:7.2f}s  score {ours['score_s']:7.2f}s ({ours['rows']} rows, "
        f"{ours['rows_per_s']:9.0f} rows/s)  peak +{ours['peak_mb']:6.0f} MB  auroc {ours['auroc']:.3f}"
    )
    if "blas_ratio" in row:
        text += (
            f"  {row['blas_ratio']:.2f}x float32 GEMM time ({row['blas_ratio_executed_flops']:.2f}x of its executed "
            f"FLOPs; its two products alone {row['floor_ratio']:.2f}x; float64 search {row['blas_ratio_float64_search']:.2f}x; "
            f"same ranks: {row['same_ranks_as_float64']}, AUROC diff {row['auroc_difference_vs_float64']:.1e})"
        )
    if "reference" in row:
        same = row["same_rows"]
        text += (
            f"  | vs pytorch-ood on {same['rows']} rows: score x{row['speedup_score']:.1f}"
            + (f", fit x{row['speedup_fit']:.1f}" if "speedup_fit" in row else "")
            + f" (auroc {same['auroc']:.3f} vs {same['reference_auroc']:.3f})"
        )
    return text


def markdown(report: dict[str, Any]) -> str:
    """The default run's figures as Markdown tables."""
    lines = [
        "| detector | fit (s) | score (s) | rows/s | peak extra MB | vs float32 GEMM | pytorch-ood score speed-up | "
        "pytorch-ood fit speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in report["results"].items():
        ours = row["ours"]
        blas = f"{row['blas_ratio']:.2f}x" if "blas_ratio" in row else ""
        score = f"{row['speedup_score']:.1f}x" if "speedup_score" in row else "n/a"
        fit = f"{row['speedup_fit']:.1f}x" if "speedup_fit" in row else "n/a"
        lines.append(
            f"| {name} | {ours['fit_s']:.2f} | {ours['score_s']:.2f} | {ours['rows_per_s']:,.0f} | "
            f"{ours['peak_mb']:.0f} | {blas} | {score} | {fit} |"
        )
    maha = {name: row for name, row in report["results"].items() if "blas_ratio" in row}
    if maha:
        lines += [
            "",
            "| detector | scoring vs float32 GEMM | its two BLAS products alone (floor) | vs float32 GEMM of the "
            "executed FLOPs | all-float64 search vs float32 GEMM | same ranks as float64 | AUROC difference |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in maha.items():
            lines.append(
                f"| {name}{' (triangular)' if row['triangular_whitening'] else ''} | {row['blas_ratio']:.2f}x | "
                f"{row['floor_ratio']:.2f}x | {row['blas_ratio_executed_flops']:.2f}x | "
                f"{row['blas_ratio_float64_search']:.2f}x | "
                f"{'yes' if row['same_ranks_as_float64'] else 'NO'} | {row['auroc_difference_vs_float64']:.1e} |"
            )
    together = report.get("fit_together", {})
    if together:
        lines += [
            "",
            f"One float32 Gram pass over the fit set: {report['gram_pass_f32_s']:.2f} s (the unit below).",
            "",
            "| fitted | each alone, summed | together (float64 Gram) | together (float32 Gram) | floor |",
            "|---|---|---|---|---|",
        ]
        for label, row in together.items():
            lines.append(
                f"| {label} ({len(row['detectors'])}) | {row['alone_sum_s']:.2f} s = "
                f"{row['alone_sum_in_gram_passes']:.2f} | {row['together_float64_s']:.2f} s = "
                f"{row['together_float64_in_gram_passes']:.2f} | {row['together_float32_s']:.2f} s = "
                f"{row['together_float32_in_gram_passes']:.2f} | "
                + (f"{row['floor']['total']:.2f} s = {row['floor_in_gram_passes']:.2f} |" if "floor" in row else " |")
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- larger than RAM


def main_larger_than_ram(args: argparse.Namespace) -> dict[str, Any]:
    """Write a memory-mapped fit set bigger than the free RAM chunk by chunk, fit on it, delete it."""
    rows, dim = args.ram_rows, args.ram_dim
    names = args.ram_detectors.split(",") + [name for name in args.ram_alone.split(",") if name]
    with_logits = any("logits" in create(name).requirements().fit for name in names)  # vim: max logits
    size = rows * (dim + (args.classes if with_logits else 0)) * 4
    workdir = Path(args.workdir) / "oodbench-larger-than-ram"
    free = shutil.disk_usage(Path(args.workdir)).free
    if free < size * 1.05:
        raise SystemExit(f"need {size / 2**30:.1f} GiB free under {args.workdir}; only {free / 2**30:.1f} GiB")
    with open("/proc/meminfo") as meminfo:
        ram = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    print(
        f"writing {rows} x {dim} float32{' and the logits' if with_logits else ''} = {size / 2**30:.1f} GiB to {workdir} (RAM {ram['MemTotal'] / 2**30:.1f} GiB, "
        f"available {ram['MemAvailable'] / 2**30:.1f} GiB)",
        flush=True,
    )
    workdir.mkdir(parents=True, exist_ok=True)
    data = Synthetic(dim, args.classes, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    report: dict[str, Any] = {
        "rows": rows,
        "dim": dim,
        "bytes": size,
        "ram_total": ram["MemTotal"],
        "ram_available": ram["MemAvailable"],
    }
    try:
        features = np.lib.format.open_memmap(workdir / "features.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
        labels = np.lib.format.open_memmap(workdir / "labels.npy", mode="w+", dtype=np.int64, shape=(rows,))
        logits = None
        if with_logits:
            shape = (rows, args.classes)
            logits = np.lib.format.open_memmap(workdir / "logits.npy", mode="w+", dtype=np.float32, shape=shape)
        weight_t = data.head.weight.T.copy()
        start_write = time.perf_counter()
        for start in range(0, rows, 16384):
            stop = min(rows, start + 16384)
            features[start:stop], labels[start:stop] = data.features(stop - start, rng)
            if logits is not None:
                logits[start:stop] = features[start:stop] @ weight_t + data.head.bias
            if start % (16384 * 16) == 0:
                features.flush()
        features.flush()
        labels.flush()
        if logits is not None:
            logits.flush()
        del features, labels, logits
        report["write_s"] = time.perf_counter() - start_write
        fit = Outputs(
            np.load(workdir / "features.npy", mmap_mode="r"),
            np.load(workdir / "logits.npy", mmap_mode="r") if with_logits else None,
            labels=np.load(workdir / "labels.npy", mmap_mode="r"),
            check_finite=False,
        )
        test = data.outputs(args.ram_test, args.seed + 2)
        together = args.ram_detectors.split(",")
        runs = [("together", together, args.ram_gram_dtype)]
        runs += [(name, [name], "float64") for name in args.ram_alone.split(",") if name]
        for label, names, gram_dtype in runs:
            with peak_memory() as memory:
                fitted, fit_s = timed(
                    lambda names=names, dtype=gram_dtype: fit_all(
                        [create(n) for n in names], fit, data.head, gram_dtype=dtype
                    )
                )
                score_s = sum(timed(lambda d=detector: d.score(test))[1] for detector in fitted)
            del fitted
            report[label] = {
                "detectors": names,
                "gram_dtype": gram_dtype,
                "fit_s": fit_s,
                "fit_rows_per_s": rows / fit_s,
                "score_s": score_s,
                "peak_mb": memory["peak_bytes"] / 2**20,
            }
            print(
                f"{label} ({', '.join(names)}; {gram_dtype} Gram): fit {fit_s:.0f}s ({rows / fit_s:,.0f} rows/s), "
                f"peak extra anonymous memory {memory['peak_bytes'] / 2**20:.0f} MB",
                flush=True,
            )
            _checkpoint(args, report)
        if args.ram_gram_pass:
            report["gram_pass_f32_s"] = gram_pass_f32(fit.features)
            print(f"one float32 Gram pass: {report['gram_pass_f32_s']:.0f}s", flush=True)
            _checkpoint(args, report)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return report


def _checkpoint(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Write the larger-than-RAM figures so far (a long run keeps what it measured if it is stopped)."""
    if args.out is not None:
        atomic_write_text(args.out, json.dumps({"larger_than_ram": report}, indent=2, default=float))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=int, default=200_000, help="fit-set rows (default 200000)")
    parser.add_argument("--dim", type=int, default=768, help="feature dimension D (default 768)")
    parser.add_argument("--classes", type=int, default=1000, help="classes C (default 1000)")
    parser.add_argument("--test", type=int, default=50_000, help="ID test rows, and as many OOD rows (default 50000)")
    parser.add_argument(
        "--detectors", default="paper", help="comma-separated registry names, 'paper' (the paper's 21) or 'all'"
    )
    parser.add_argument("--knn-rows", type=int, default=5000, help="test rows for knn's search (default 5000)")
    parser.add_argument(
        "--ref-rows", type=int, default=2000, help="test rows for the pytorch-ood comparison (default 2000)"
    )
    parser.add_argument(
        "--ref-rows-maha",
        type=int,
        default=200,
        help="test rows for pytorch-ood's Mahalanobis family, which loops over classes (default 200)",
    )
    parser.add_argument("--blas-rows", type=int, default=20_000, help="test rows timed against BLAS (default 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats of the same-rows scoring comparison")
    parser.add_argument("--no-reference", action="store_true", help="skip the pytorch-ood comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON (and Markdown next to it)")
    parser.add_argument("--larger-than-ram", action="store_true", help="fit on a memory-mapped set written to disk")
    parser.add_argument("--ram-rows", type=int, default=1_281_167, help="rows of the larger-than-RAM fit set")
    parser.add_argument("--ram-dim", type=int, default=4096, help="feature dimension of the larger-than-RAM fit set")
    parser.add_argument("--ram-test", type=int, default=10_000, help="rows scored after the larger-than-RAM fit")
    parser.add_argument(
        "--ram-detectors",
        default=",".join(GAUSSIAN_FAMILY),
        help="detectors fit together in larger-than-RAM mode (default: the Gaussian family)",
    )
    parser.add_argument(
        "--ram-alone", default="maha", help="detectors then fit alone in larger-than-RAM mode (default maha; '' none)"
    )
    parser.add_argument(
        "--ram-gram-dtype", default="float64", choices=("float64", "float32"), help="Gram precision of the joint fit"
    )
    parser.add_argument(
        "--fit-target", action="store_true", help="only the six Gaussian-family fits together against their floor"
    )
    parser.add_argument("--blas-threads", type=int, default=None, help="BLAS threads (default: the BLAS's own)")
    parser.add_argument("--ram-gram-pass", action="store_true", help="also time one float32 Gram pass (the unit)")
    parser.add_argument("--finalize-rows", type=int, default=200_000, help="rows of the store entry finalized")
    parser.add_argument("--finalize-shard", type=int, default=16_384, help="shard size of that entry")
    parser.add_argument("--workdir", default="/var/tmp", help="where the larger-than-RAM file is written (and deleted)")
    parser.add_argument("--keep", action="store_true", help="keep the larger-than-RAM file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "numpy": np.__version__,
    }
    if args.larger_than_ram:
        report["larger_than_ram"] = main_larger_than_ram(args)
    elif args.fit_target:
        report["fit_target"] = main_fit_target(args)
    else:
        report.update(main_default(args))
        print()
        print(markdown(report))
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(report, indent=2, default=float))
        if "results" in report:
            atomic_write_text(args.out.with_suffix(".md"), markdown(report) + "\n")


if __name__ == "__main__":
    sys.exit(main())
