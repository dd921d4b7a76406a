"""The paper's whole post-hoc evaluation for one classifier, at the paper's sizes, from a synthetic feature store.

Writes a store with the Fi-ImageNet-1k experiment's shapes through the real `Store`/`EntryWriter` (fit set: the
ImageNet-1k train split, 1,281,167 rows; ID test: 48,365 rows; the 15 OOD sets of Table 3 at their published sizes;
features of dimension D, logits and labels for C = 1000 classes, and the linear head, which is all NAC's default
penultimate layer needs), then runs `oodbench evaluate` on it with every registered detector and reports:

- per detector: fit time, score time (all 16 test sets), peak extra anonymous memory, and the floor of its work:
  its float32 FLOPs at this machine's GEMM rate, or one read of the arrays it needs at this machine's read rate,
  whichever is larger (both rates measured in the same run);
- the shared fit statistics' one pass over the fit set, which the first detector that needs it pays;
- for the run: total time, peak anonymous memory, peak resident set (includes memory-mapped store pages), disk;
- the store writing apart (time and disk).

`--scale` multiplies every row count (fit, ID, each OOD set) so the same run fits a small machine or a test; the
sizes it used are in the report. knn's default (k = 1000, exact) against the full 1.28 M bank costs 2·Q·N·D FLOPs
(1.6e15 at D = 2048): `--knn-index ivf` runs its approximate IVF index instead.

Examples:
    .venv/bin/python benchmarks/paper_scale.py --d 2048 --scale 0.05 --workdir /var/tmp/ps
    .venv/bin/python benchmarks/paper_scale.py --d 2048 --workdir /var/tmp/ps --knn-index ivf --json out.json
    .venv/bin/python benchmarks/paper_scale.py --d 768 --scale 0.002 --detectors msp,knn --keep-store
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from oodbench.analysis.published import POST_HOC_POOL
from oodbench.core.outputs import Head
from oodbench.core.store import Store
from oodbench.detectors import available
from oodbench.detectors.feature import default_nlist
from oodbench.util.atomic import atomic_write_text

MODEL = "synthetic-classifier"
FIT = "imagenet-1k-train"
ID_TEST = "imagenet-1k-val-id"
CLASSES = 1000
# The ID test set: "48,365 ImageNet-1k validation images, which are not in Fi-ImageNet-1k and were not flagged as
# ambiguous" (the paper, Sec. 4, paragraph "Data.").
ID_TEST_ROWS = 48_365
SHARD_ROWS = 65_536


# ----------------------------------------------------------------------------------------------- the shapes
def fit_rows() -> int:
    """The ImageNet-1k train split's size, from oodbench's dataset registry (its published count)."""
    from oodbench.extract.dataset_registry import get

    count = get("imagenet-1k-train").expected_count
    assert count is not None
    return int(count)


def ood_sizes() -> dict[str, int]:
    """The 15 OOD sets of the paper's Table 3 and their image counts, from the packaged published table."""
    from oodbench.analysis.published import load_published

    sizes: dict[str, int] = {}
    for cell in load_published(table="3"):
        if cell.metric == "n":
            sizes.setdefault(cell.dataset, int(cell.value))
    return sizes


def dataset_id(name: str) -> str:
    """A store dataset id for a printed dataset name."""
    from oodbench.analysis.published import slug

    return slug(name)


def scaled(count: int, scale: float, minimum: int = 20) -> int:
    """`count` x `scale`, at least `minimum` rows (so every set keeps a threshold and a rate)."""
    return max(minimum, min(count, int(round(count * scale))))


def plan_sizes(scale: float) -> dict[str, int]:
    """{dataset id: rows} of the fit set, the ID test set and the 15 OOD sets at `scale`."""
    sizes = {FIT: scaled(fit_rows(), scale, 2_000), ID_TEST: scaled(ID_TEST_ROWS, scale)}
    for name, count in ood_sizes().items():
        sizes[dataset_id(name)] = scaled(count, scale)
    return sizes


# ----------------------------------------------------------------------------------------------- the store
class Synthetic:
    """ImageNet-shaped post-ReLU features around C class centres, a linear head, and OOD rows between two classes."""

    def __init__(self, dim: int, classes: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.classes = dim, classes
        self.centres = (rng.standard_normal((classes, dim)) * 0.6 + 0.4).astype(np.float32)
        weight = (0.5 * self.centres + 0.1 * rng.standard_normal((classes, dim))).astype(np.float32)
        self.head = Head(weight, (0.1 * rng.standard_normal(classes)).astype(np.float32))
        self.weight_t = np.ascontiguousarray(weight.T)

    def block(self, rows: int, rng: np.random.Generator, ood: bool) -> dict[str, np.ndarray]:
        """Features, logits = head(features) (float32) and labels of `rows` rows."""
        labels = rng.integers(0, self.classes, rows)
        features = rng.standard_normal((rows, self.dim), dtype=np.float32)
        if ood:  # between two classes, from near one class (w = 1) to halfway (w = 0.5): from near- to far-OOD
            weight = rng.uniform(0.5, 1.0, (rows, 1)).astype(np.float32)
            features += weight * self.centres[labels]
            features += (1 - weight) * self.centres[rng.integers(0, self.classes, rows)]
        else:
            features += self.centres[labels]
        np.maximum(features, 0.0, out=features)
        logits = features @ self.weight_t
        logits += self.head.bias
        arrays = {"features": features, "logits": logits}
        if not ood:
            arrays["labels"] = labels.astype(np.int64)
        return arrays


def write_store(root: Path, sizes: Mapping[str, int], dim: int, seed: int, log: Callable[[str], None]) -> dict:
    """Write every entry shard by shard through EntryWriter (bounded memory); returns time and disk per entry."""
    store = Store(root)
    synthetic = Synthetic(dim, CLASSES, seed)
    provenance = {"checkpoint": f"synthetic-{dim}-seed{seed}", "preprocessing": "none (synthetic)"}
    store.write_head(MODEL, synthetic.head, provenance=provenance)
    report: dict[str, Any] = {}
    for number, (name, rows) in enumerate(sizes.items()):
        start = time.perf_counter()
        writer = store.writer(MODEL, name, provenance=provenance, num_items=rows, shard_size=SHARD_ROWS)
        for shard in writer.pending_shards():
            span = writer.shard_rows(shard)
            rng = np.random.default_rng([seed, number, shard])
            arrays = synthetic.block(span.stop - span.start, rng, ood=name not in (FIT, ID_TEST))
            arrays["index"] = np.arange(span.start, span.stop)
            writer.write_shard(shard, arrays)
        writer.finalize()
        seconds = time.perf_counter() - start
        report[name] = {"rows": rows, "seconds": seconds, "bytes": disk_bytes(store.entry_path(MODEL, name))}
        log(f"  wrote {name}: {rows:,} rows in {seconds:.1f} s")
    return report


def disk_bytes(path: Path) -> int:
    """Bytes of the files under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------------------------- measurement
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class MemorySampler:
    """Samples anonymous RSS every 5 ms; phases read the peak above their own start."""

    def __init__(self) -> None:
        self.current = _status_bytes("RssAnon")
        self.run_peak = self.current
        self._phase_peaks: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._update()
            self._stop.wait(0.005)

    def _update(self) -> None:
        self.current = _status_bytes("RssAnon")
        self.run_peak = max(self.run_peak, self.current)
        for i, peak in enumerate(self._phase_peaks):
            self._phase_peaks[i] = max(peak, self.current)

    @contextmanager
    def phase(self) -> Iterator[dict[str, float]]:
        """Yields a dict holding the phase's peak increase of anonymous memory (bytes) on exit."""
        self._update()
        baseline = self.current
        self._phase_peaks.append(baseline)
        slot = len(self._phase_peaks) - 1
        result = {"peak_extra_bytes": 0.0}
        try:
            yield result
        finally:
            self._update()
            result["peak_extra_bytes"] = float(self._phase_peaks[slot] - baseline)
            self._phase_peaks.pop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Recorder:
    """Times every detector's fit and score (and the shared fit statistics' pass) inside `oodbench evaluate`."""

    def __init__(self, sampler: MemorySampler, log: Callable[[str], None] = lambda text: None) -> None:
        self.sampler = sampler
        self.log = log  # a line per fit, score call and shared pass: an interrupted run keeps what it measured
        self.rows: dict[str, dict[str, float]] = {}
        self.shared: dict[str, float] = {"seconds": 0.0, "peak_extra_bytes": 0.0, "passes": 0}
        self._shared_in_fit = 0.0

    def _row(self, name: str) -> dict[str, float]:
        return self.rows.setdefault(name, {"fit_s": 0.0, "score_s": 0.0, "peak_extra_bytes": 0.0})

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Wrap Detector.fit, Detector.score and FitStatistics._compute for the duration."""
        from oodbench.detectors.base import Detector
        from oodbench.detectors.shared import FitStatistics

        recorder = self
        fit, score, compute = Detector.fit, Detector.score, FitStatistics._compute

        def timed_fit(detector: Any, *args: Any, **kwargs: Any) -> Any:
            recorder._shared_in_fit = 0.0
            with recorder.sampler.phase() as memory:
                start = time.perf_counter()
                result = fit(detector, *args, **kwargs)
                seconds = time.perf_counter() - start
            row = recorder._row(detector.name)
            row["fit_s"] += seconds - recorder._shared_in_fit  # the shared pass is reported on its own row
            row["peak_extra_bytes"] = max(row["peak_extra_bytes"], memory["peak_extra_bytes"])
            recorder.log(f"  {detector.name}: fit {seconds - recorder._shared_in_fit:.1f} s")
            return result

        def timed_score(detector: Any, *args: Any, **kwargs: Any) -> Any:
            with recorder.sampler.phase() as memory:
                start = time.perf_counter()
                result = score(detector, *args, **kwargs)
                seconds = time.perf_counter() - start
            row = recorder._row(detector.name)
            row["score_s"] += seconds
            row["peak_extra_bytes"] = max(row["peak_extra_bytes"], memory["peak_extra_bytes"])
            recorder.log(f"  {detector.name}: scored {len(args[0]):,} rows in {seconds:.1f} s")
            return result

        def timed_compute(stats: Any, *args: Any, **kwargs: Any) -> Any:
            with recorder.sampler.phase() as memory:
                start = time.perf_counter()
                result = compute(stats, *args, **kwargs)
                seconds = time.perf_counter() - start
            recorder._shared_in_fit += seconds
            recorder.shared["seconds"] += seconds
            recorder.shared["passes"] += 1
            recorder.log(f"  shared fit statistics: one pass in {seconds:.1f} s")
            recorder.shared["peak_extra_bytes"] = max(recorder.shared["peak_extra_bytes"], memory["peak_extra_bytes"])
            return result

        Detector.fit, Detector.score, FitStatistics._compute = timed_fit, timed_score, timed_compute
        try:
            yield
        finally:
            Detector.fit, Detector.score, FitStatistics._compute = fit, score, compute


def gemm_gflops(dim: int, rows: int = 8192, repeats: int = 3, dtype: type = np.float32) -> float:
    """Best-of-`repeats` GFLOP/s of a (rows x dim) @ (dim x dim) product in `dtype`: the machine's GEMM rate."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim)).astype(dtype)
    b = rng.standard_normal((dim, dim)).astype(dtype)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * dim * dim / best / 1e9


def read_rate(array: np.ndarray, max_bytes: int = 4 << 30) -> float:
    """Bytes/s of one streamed read of (the first `max_bytes` of) a memory-mapped store array."""
    rows = max(1, min(array.shape[0], max_bytes // max(1, array[0].nbytes)))
    chunk = max(1, (64 << 20) // max(1, array[0].nbytes))
    start = time.perf_counter()
    total = 0.0
    for begin in range(0, rows, chunk):
        total += float(np.asarray(array[begin : begin + chunk]).sum(dtype=np.float32))
    seconds = time.perf_counter() - start
    return rows * array[0].nbytes / max(seconds, 1e-9)


# The per-element kernels that detectors scoring in float64 are built from, with the keys of `elementary_work`.
ELEMENTARY_KERNELS = {
    "pass64": "one float64 elementwise pass (convert, subtract, divide, reduce, gather)",
    "pass32": "one float32 elementwise pass",
    "exp64": "one float64 exp or log",
    "exp32": "one float32 exp",
    "select64": "one float64 value through a top-100 np.partition of its row",
    "search": "one np.searchsorted of a float32 value among 50 edges",
}


def elementary_rates(classes: int, dim: int, rows: int = 1024, repeats: int = 3) -> dict[str, float]:
    """Values per second of each ELEMENTARY_KERNELS kernel on a (rows x classes) chunk, best of `repeats`, and the
    float64 GEMM rate (GFLOP/s): what the float64 parts of the detectors cost on this machine."""
    rng = np.random.default_rng(1)
    x64 = -np.abs(rng.standard_normal((rows, classes))) * 8.0  # softmax-shifted logits: values <= 0
    x32 = x64.astype(np.float32)
    out64, out32 = np.empty_like(x64), np.empty_like(x32)
    edges = np.linspace(0.0, 3.0, 50, dtype=np.float32)
    kernels: dict[str, tuple[Callable[[], Any], int]] = {
        "pass64": (lambda: np.subtract(x64, 1.0, out=out64), x64.size),
        "pass32": (lambda: np.subtract(x32, 1.0, out=out32), x32.size),
        "exp64": (lambda: np.exp(x64, out=out64), x64.size),
        "exp32": (lambda: np.exp(x32, out=out32), x32.size),
        "select64": (lambda: np.partition(x64, classes - 100, axis=1), x64.size),
        "search": (lambda: np.searchsorted(edges, x32), x32.size),
    }
    rates: dict[str, float] = {}
    for name, (kernel, values) in kernels.items():
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(8):
                kernel()
            best = min(best, (time.perf_counter() - start) / 8)
        rates[name] = values / best
    rates["gemm64_gflops"] = gemm_gflops(dim, dtype=np.float64)
    return rates


def elementary_work(name: str, params: Mapping[str, Any], n: int, q: int, d: int, c: int) -> dict[str, float]:
    """The float64 (and per-element) work a detector's implementation does by design, counted per kernel.

    These are what the GEMM-or-read floor leaves out: float64 scores keep the exact order of close rows, and
    their exp, log, selection and elementwise passes run at the kernels' measured rates (elementary_rates), not
    at the GEMM's. The counts follow the implementation, pass by pass; an empty dict for detectors whose work
    the floor already covers.
    """
    qc, qd = float(q * c), float(q * d)
    if name in ("msp", "energy"):  # float64 copy, max, shift, clip, exp, sum (core.numerics.logsumexp_in_place)
        return {"pass64": 5 * qc, "exp64": qc}
    if name == "maxlogit":
        return {"pass64": 2 * qc}
    if name == "gen":  # softmax, the top-M partition, the winner's complement, two powers of M values per row
        m = float(min(int(params.get("top_m", 100)), c))
        return {"pass64": 9 * qc, "exp64": qc + 4 * q * m, "select64": qc}
    if name == "kl_matching":  # softmax, xlogy (a log per value), the float64 product with the log templates
        return {"pass64": 8 * qc, "exp64": 2 * qc, "flops64": 2.0 * q * c * c}
    if name == "fdbd":  # float64 logits, argmax, margins, the gathered inverse distances, their product; ‖z − μ‖
        return {"pass64": 5 * qc + 3 * qd}
    if name == "neco":  # standardise, the float64 projection, two norms; the max logit
        dim = params.get("dim", 100)
        k = int(dim) if isinstance(dim, int) else d
        return {"pass64": 4 * qd, "pass32": qc, "flops64": 2.0 * q * d * k}
    if name == "nac":  # softmax, the sigmoid states (float32), the bin of each state, its coverage
        return {"pass64": 6 * qc, "exp64": qc, "pass32": 5 * qd, "exp32": qd, "search": qd}
    # knn's IVF merge keeps only the products above each query's running k-th value, so its work depends on the
    # data: `knn_index.py --breakdown` measures it against the products on the full-size per-list shapes.
    return {}


def shared_elementary_work(n: int, d: int, c: int) -> dict[str, float]:
    """The shared pass's work for the paper's 21: two float64 Grams (dsyrk), the per-row float64 passes of both
    accumulators (convert, centre, ℓ2-normalise, class sums), and the softmax templates and max logits."""
    return {
        "flops64": 2.0 * n * d * d,
        "pass64": 7.0 * n * d + 7.0 * n * c,
        "exp64": float(n * c),
        "pass32": float(n * c),
    }


def elementary_seconds(work: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """Seconds of `work` at the measured rates (float64 FLOPs at the float64 GEMM rate)."""
    return sum(
        count / (rates["gemm64_gflops"] * 1e9) if kernel == "flops64" else count / rates[kernel]
        for kernel, count in work.items()
    )


# ----------------------------------------------------------------------------------------------- floors
def work_model(name: str, params: Mapping[str, Any], n: int, q: int, d: int, c: int) -> dict[str, float]:
    """Float32 FLOPs of a detector's fit and score, and the bytes it must read, for N fit rows and Q test rows.

    The FLOPs count only the products that no implementation can skip (2 FLOPs per multiply-add); the bytes count
    each array the detector needs once. The shared Gram passes are on the shared statistics' row.
    """
    feat_fit, logit_fit, feat_test, logit_test = 4.0 * n * d, 4.0 * n * c, 4.0 * q * d, 4.0 * q * c
    head_product = 2.0 * q * d * c
    fit_flops = score_flops = 0.0
    fit_bytes = score_bytes = 0.0
    if name in ("msp", "maxlogit", "energy", "gen"):
        score_bytes = logit_test
    elif name == "kl_matching":
        fit_bytes, score_bytes, score_flops = logit_fit, logit_test, 2.0 * q * c * c
    elif name in ("react", "dice"):
        fit_bytes, score_bytes, score_flops = feat_fit, feat_test, head_product
    elif name == "ash_s":
        score_bytes, score_flops = feat_test, head_product
    elif name == "scale":
        score_bytes, score_flops = feat_test + logit_test, head_product
    elif name in ("maha", "maha++", "rmaha", "rmaha++"):
        # Triangular whitening: D(D+1)/2 multiply-adds per row (twice for the relative pair), then the class search.
        quadratic = 2 if name.startswith("r") else 1
        score_bytes, score_flops = feat_test, q * (quadratic * d * (d + 1) + 2.0 * d * c)
    elif name == "knn":
        fit_bytes, score_bytes = feat_fit, feat_test
        if params.get("index", "flat") == "ivf":
            nlist = float(params.get("nlist") or default_nlist(n, int(params.get("k", 1000))))
            nprobe = float(params.get("nprobe", 32))
            fit_flops = 2.0 * n * nlist * d  # assigning every row to its list
            score_flops = 2.0 * q * d * (nlist + n * min(1.0, nprobe / nlist))
        else:
            score_flops = 2.0 * q * n * d
    elif name in ("cosine", "mcm"):
        score_bytes, score_flops = feat_test, 2.0 * q * d * c
    elif name == "fdbd":
        fit_flops, score_bytes = 2.0 * c * c * d, feat_test + logit_test
    elif name == "neco":
        dim = params.get("dim", 100)
        k = int(dim) if isinstance(dim, int) else d
        score_bytes, score_flops = feat_test, 2.0 * q * d * k
    elif name == "nac":
        fit_rows_ = int(params.get("fit_rows", 1000) or n)
        fit_flops, fit_bytes = 2.0 * fit_rows_ * c * d, 4.0 * fit_rows_ * (d + c)
        score_bytes, score_flops = feat_test + logit_test, head_product
    elif name == "vim":
        from oodbench.detectors.hybrid import vim_default_dim

        residual = d - (params.get("dim") or vim_default_dim(d))
        fit_bytes, fit_flops = feat_fit + logit_fit, 2.0 * n * d * residual  # the residual-norm pass
        score_bytes, score_flops = feat_test + logit_test, 2.0 * q * d * residual
    elif name == "nnguide":
        bank = int(n * float(params.get("alpha", 0.01)))
        fit_bytes = 4.0 * bank * (d + c)
        score_bytes, score_flops = feat_test + logit_test, 2.0 * q * bank * d
    else:  # a detector this model does not know: one read of what it could need
        fit_bytes, score_bytes = feat_fit + logit_fit, feat_test + logit_test
    return {"fit_flops": fit_flops, "score_flops": score_flops, "fit_bytes": fit_bytes, "score_bytes": score_bytes}


def floor_seconds(work: Mapping[str, float], gflops: float, bytes_per_s: float) -> float:
    """max(FLOPs at the GEMM rate, one read of the arrays) for fit and score together."""
    flops = (work["fit_flops"] + work["score_flops"]) / (gflops * 1e9)
    reads = (work["fit_bytes"] + work["score_bytes"]) / bytes_per_s
    return max(flops, reads)


# ----------------------------------------------------------------------------------------------- the run
def detector_params(names: list[str], n: int, d: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Parameters passed with -p: knn's index, and the paper's k (dim) clipped where a scaled-down fit set (D) is too small."""
    params: dict[str, dict[str, Any]] = {}
    if "knn" in names:
        knn: dict[str, Any] = {}
        if n < 1000:
            knn["k"] = n
        if args.knn_index != "flat":
            knn["index"] = args.knn_index
            if args.knn_nlist is not None:
                knn["nlist"] = args.knn_nlist
            knn["nprobe"] = args.knn_nprobe
        if knn:
            params["knn"] = knn
    if "neco" in names and d <= 100:
        params["neco"] = {"dim": d // 2}
    if "nnguide" in names and int(n * 0.01) < 100:
        params["nnguide"] = {"k": max(1, int(n * 0.01))}
    return params


def run_evaluate(
    store: Path, out: Path, sizes: Mapping[str, int], names: list[str], params: Mapping[str, Mapping[str, Any]]
) -> None:
    """`oodbench evaluate` in this process (so its detectors can be timed one by one)."""
    from oodbench.cli.main import app

    argv = ["evaluate", "--store", str(store), "--model", MODEL, "--fit", FIT, "--id", ID_TEST]
    for name in sizes:
        if name not in (FIT, ID_TEST):
            argv += ["--ood", name]
    argv += ["--detectors", ",".join(names), "--out", str(out), "--no-progress"]
    for detector, values in params.items():
        for key, value in values.items():
            argv += ["-p", f"{detector}.{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    app(argv, standalone_mode=False)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and optionally writes) the report."""
    args = parse_args(argv)
    if args.extrapolate:
        estimate = extrapolate([json.loads(Path(p).read_text()) for p in args.extrapolate], args.scale)
        if args.json:
            atomic_write_text(Path(args.json), json.dumps(estimate, indent=2))
        print(extrapolation_markdown(estimate))
        return estimate
    log = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    if args.detectors == "paper":  # the paper's 21, in registry order
        names = [name for name in available() if name in POST_HOC_POOL]
    elif args.detectors == "all":
        names = available()
    else:
        names = [n.strip() for n in args.detectors.split(",") if n.strip()]
    unknown = [n for n in names if n not in available()]
    if unknown:
        raise SystemExit(f"paper_scale: unknown detectors {unknown}; `oodbench detectors` lists them")
    workdir = Path(args.workdir)
    store_root, run_root = workdir / "store", workdir / f"run-knn-{args.knn_index}"
    if store_root.exists() and not args.reuse_store:
        raise SystemExit(f"paper_scale: {store_root} exists; pass --reuse-store to evaluate it again, or delete it")
    if run_root.exists():
        shutil.rmtree(run_root)
    sizes = plan_sizes(args.scale)
    n, q, d = sizes[FIT], sum(v for k, v in sizes.items() if k != FIT), args.d
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
        "load_average_start": os.getloadavg(),
        "d": d,
        "classes": CLASSES,
        "scale": args.scale,
        "sizes": dict(sizes),
        "fit_rows": n,
        "test_rows": q,
    }
    log(f"paper_scale: D={d}, C={CLASSES}, fit {n:,} rows, test {q:,} rows in {len(sizes) - 1} sets")
    sampler = MemorySampler()
    try:
        if not args.reuse_store or not store_root.exists():
            start = time.perf_counter()
            entries = write_store(store_root, sizes, d, args.seed, log)
            report["store"] = {
                "seconds": time.perf_counter() - start,
                "bytes": disk_bytes(store_root),
                "entries": entries,
            }
        else:
            report["store"] = {"seconds": None, "bytes": disk_bytes(store_root), "reused": True}
        features = Store(store_root).read(MODEL, FIT).features
        report["read_bytes_per_s"] = read_rate(features)
        report["gemm_gflops"] = gemm_gflops(d)
        report["elementary_rates"] = elementary_rates(CLASSES, d)
        log(
            f"  rates: float32 GEMM {report['gemm_gflops']:.0f} GFLOP/s, "
            f"store read {report['read_bytes_per_s'] / 1e9:.2f} GB/s"
        )
        params = detector_params(names, n, d, args)
        report["params"] = params
        recorder = Recorder(sampler, log)
        hwm_before = _status_bytes("VmHWM")
        with recorder.installed(), sampler.phase() as run_memory:
            start = time.perf_counter()
            run_evaluate(store_root, run_root, sizes, names, params)
            report["evaluate_seconds"] = time.perf_counter() - start
        report["evaluate_peak_extra_bytes"] = run_memory["peak_extra_bytes"]
        report["peak_anon_bytes"] = sampler.run_peak
        report["peak_rss_bytes"] = max(hwm_before, _status_bytes("VmHWM"))
        report["run_dir_bytes"] = disk_bytes(run_root)
        report["shared_statistics"] = recorder.shared
        rows = {}
        for name in names:
            row = dict(recorder.rows.get(name, {"fit_s": 0.0, "score_s": 0.0, "peak_extra_bytes": 0.0}))
            work = work_model(name, {**default_params(name), **params.get(name, {})}, n, q, d, CLASSES)
            row.update(work)
            row["floor_s"] = floor_seconds(work, report["gemm_gflops"], report["read_bytes_per_s"])
            row["ratio"] = (row["fit_s"] + row["score_s"]) / row["floor_s"] if row["floor_s"] > 0 else None
            _add_elementary(
                row,
                elementary_work(name, {**default_params(name), **params.get(name, {})}, n, q, d, CLASSES),
                work,
                report,
            )
            rows[name] = row
        report["detectors"] = rows
        shared_floor = 2.0 * n * d * d / (report["gemm_gflops"] * 1e9)  # the raw and the normalised Gram, syrk-sized
        report["shared_statistics"]["floor_s"] = max(shared_floor, 4.0 * n * d / report["read_bytes_per_s"])
        shared = report["shared_statistics"]
        shared["elementary_work"] = shared_elementary_work(n, d, CLASSES)
        shared["elementary_s"] = elementary_seconds(shared["elementary_work"], report["elementary_rates"])
        shared["elementary_ratio"] = shared["seconds"] / shared["elementary_s"]
        run_json = json.loads((run_root / "run.json").read_text())
        report["knn_index"] = run_json["detectors"].get("knn", {})
    finally:
        sampler.stop()
        report["load_average_end"] = os.getloadavg()
        if not args.keep_store and store_root.exists():
            shutil.rmtree(store_root)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(report, indent=2, default=float))
    if args.markdown:
        atomic_write_text(Path(args.markdown), markdown(report))
    if not args.quiet:
        print(markdown(report))
    return report


def _add_elementary(
    row: dict[str, Any], elementary: Mapping[str, float], work: Mapping[str, float], report: Mapping[str, Any]
) -> None:
    """The row's floor with its float64 work counted: its float32 FLOPs at the GEMM rate plus the elementary
    kernels at their measured rates (rows without such work keep the plain floor)."""
    if not elementary:
        return
    flops32 = (work["fit_flops"] + work["score_flops"]) / (report["gemm_gflops"] * 1e9)
    row["elementary_work"] = dict(elementary)
    row["elementary_s"] = flops32 + elementary_seconds(elementary, report["elementary_rates"])
    row["elementary_ratio"] = (row["fit_s"] + row["score_s"]) / row["elementary_s"]


def default_params(name: str) -> dict[str, Any]:
    """The detector's constructor defaults (the work model reads k, alpha, dim, fit_rows, index from them)."""
    import inspect

    from oodbench.detectors import get_class

    signature = inspect.signature(get_class(name).__init__)
    return {key: p.default for key, p in signature.parameters.items() if key != "self" and p.default is not p.empty}


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown tables."""
    gb = 1e9
    lines = [
        f"D = {report['d']}, C = {report['classes']}, scale {report['scale']}: fit {report['fit_rows']:,} rows, "
        f"test {report['test_rows']:,} rows; float32 GEMM {report['gemm_gflops']:.0f} GFLOP/s, "
        f"store read {report['read_bytes_per_s'] / gb:.2f} GB/s; load average "
        f"{report['load_average_start'][0]:.1f} → {report['load_average_end'][0]:.1f}",
        "",
        "| detector | fit (s) | score (s) | floor (s) | × floor | with float64 work (s) | × that | peak extra memory (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def elementary(row: Mapping[str, Any]) -> str:
        if "elementary_s" not in row:
            return "– | –"
        return f"{row['elementary_s']:.2f} | {row['elementary_ratio']:.2f}"

    shared = report["shared_statistics"]
    lines.append(
        f"| shared fit statistics ({shared['passes']} pass) | {shared['seconds']:.1f} | – | {shared['floor_s']:.1f} "
        f"| {shared['seconds'] / shared['floor_s']:.2f} | {elementary(shared)} | {shared['peak_extra_bytes'] / 1e6:.0f} |"
    )
    for name, row in report["detectors"].items():
        ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(
            f"| {name} | {row['fit_s']:.1f} | {row['score_s']:.1f} | {row['floor_s']:.2f} | {ratio} "
            f"| {elementary(row)} | {row['peak_extra_bytes'] / 1e6:.0f} |"
        )
    rates = report["elementary_rates"]
    lines += [
        "",
        "Measured kernel rates (values/s): "
        + ", ".join(f"{kernel} {rates[kernel]:.3g}" for kernel in ELEMENTARY_KERNELS)
        + f"; float64 GEMM {rates['gemm64_gflops']:.0f} GFLOP/s.",
    ]
    store = report["store"]
    written = "reused (--reuse-store)" if store.get("seconds") is None else f"written in {store['seconds']:.0f} s"
    lines += [
        "",
        f"Run: `oodbench evaluate` {report['evaluate_seconds']:.0f} s; peak anonymous memory "
        f"{report['peak_anon_bytes'] / gb:.2f} GB (evaluate's own increase {report['evaluate_peak_extra_bytes'] / gb:.2f} "
        f"GB); peak resident set with mapped store pages {report['peak_rss_bytes'] / gb:.2f} GB; run directory "
        f"{report['run_dir_bytes'] / 1e6:.0f} MB. Store: {store['bytes'] / gb:.2f} GB on disk, {written}. "
        f"knn: {json.dumps(report['knn_index'])}.",
    ]
    return "\n".join(lines) + "\n"


def extrapolate(reports: list[Mapping[str, Any]], scale: float = 1.0) -> dict[str, Any]:
    """Each detector's fit and score time at `scale`, from runs at two smaller scales (same D, same machine).

    Per phase, time = fixed + rate x work, with work the phase's floor (FLOPs or bytes, whichever binds) at each
    run's sizes: the fixed part is what does not grow with the rows (the D³ decompositions, imports, per-call
    overheads). Two runs give both parts; where noise makes the rate negative, the time is scaled by the work alone.
    The result is an estimate, not a measurement.
    """
    if len(reports) != 2 or reports[0]["d"] != reports[1]["d"]:
        raise SystemExit("paper_scale: --extrapolate takes two reports of the same D")
    small, large = sorted(reports, key=lambda r: r["scale"])
    if small["fit_rows"] == large["fit_rows"]:
        raise SystemExit("paper_scale: --extrapolate needs two runs at different scales")
    d = small["d"]
    full = plan_sizes(scale)
    n, q = full[FIT], sum(v for k, v in full.items() if k != FIT)

    def floor_of(report: Mapping[str, Any], name: str, phase: str, n_: int, q_: int) -> float:
        params = {**default_params(name), **report["params"].get(name, {})}
        work = work_model(name, params, n_, q_, d, CLASSES)
        flops = work[f"{phase}_flops"] / (report["gemm_gflops"] * 1e9)
        return max(flops, work[f"{phase}_bytes"] / report["read_bytes_per_s"])

    rows: dict[str, dict[str, float]] = {}
    for name in small["detectors"]:
        row: dict[str, float] = {}
        for phase in ("fit", "score"):
            times = [r["detectors"][name][f"{phase}_s"] for r in (small, large)]
            works = [floor_of(r, name, phase, r["fit_rows"], r["test_rows"]) for r in (small, large)]
            target = floor_of(large, name, phase, n, q)
            same = small["params"].get(name) == large["params"].get(name)  # else only the larger run applies
            rate = (times[1] - times[0]) / (works[1] - works[0]) if same and works[1] > works[0] else -1.0
            if rate < 0 or times[1] - rate * works[1] < 0:
                estimate = times[1] * (target / works[1]) if works[1] > 0 else times[1]
            else:
                estimate = times[1] + rate * (target - works[1])
            row[f"{phase}_s"] = estimate
            row[f"{phase}_floor_s"] = target
        floor = row["fit_floor_s"] + row["score_floor_s"]
        row["ratio"] = (row["fit_s"] + row["score_s"]) / floor if floor > 0 else float("nan")
        rows[name] = row
    shared = [r["shared_statistics"]["seconds"] for r in (small, large)]
    shared_rate = (shared[1] - shared[0]) / (large["fit_rows"] - small["fit_rows"])
    return {
        "d": d,
        "from_scales": [small["scale"], large["scale"]],
        "fit_rows": n,
        "test_rows": q,
        "shared_statistics_s": (
            shared[1] + shared_rate * (n - large["fit_rows"])
            if shared_rate > 0 and shared[1] - shared_rate * large["fit_rows"] >= 0
            else shared[1] * n / large["fit_rows"]
        ),
        "detectors": rows,
    }


def extrapolation_markdown(estimate: Mapping[str, Any]) -> str:
    """The extrapolated table."""
    lines = [
        f"Extrapolated from scales {estimate['from_scales'][0]} and {estimate['from_scales'][1]} to fit "
        f"{estimate['fit_rows']:,} rows, test {estimate['test_rows']:,} rows, D = {estimate['d']} (an estimate):",
        "",
        "| detector | fit (s) | score (s) | floor (s) | × floor |",
        "|---|---:|---:|---:|---:|",
        f"| shared fit statistics | {estimate['shared_statistics_s']:.0f} | – | – | – |",
    ]
    for name, row in estimate["detectors"].items():
        floor = row["fit_floor_s"] + row["score_floor_s"]
        lines.append(f"| {name} | {row['fit_s']:.0f} | {row['score_s']:.0f} | {floor:.0f} | {row['ratio']:.1f} |")
    total = estimate["shared_statistics_s"] + sum(r["fit_s"] + r["score_s"] for r in estimate["detectors"].values())
    lines += ["", f"Total: {total:.0f} s ({total / 3600:.1f} h)."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--d",
        type=int,
        default=2048,
        help="feature dimension D (768, 2048 or 4096: ViT-B, ResNet-50 and the widest backbones)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of every row count (default 1: full size)")
    parser.add_argument("--workdir", required=True, help="where the store and run directory go (needs the disk)")
    parser.add_argument(
        "--detectors",
        default="paper",
        help="comma-separated registry names, 'paper' (the paper's 21) or 'all' (every registered detector; the "
        "network detectors are then skipped: the synthetic store has no extras)",
    )
    parser.add_argument("--knn-index", choices=("flat", "ivf"), default="flat", help="knn's faiss index")
    parser.add_argument("--knn-nlist", type=int, default=None, help="IVF lists (default: knn's rule)")
    parser.add_argument("--knn-nprobe", type=int, default=32, help="IVF lists searched per query")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-store", action="store_true", help="keep the synthetic store (it is deleted by default)")
    parser.add_argument("--reuse-store", action="store_true", help="evaluate a store an earlier --keep-store left")
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--markdown", help="write the tables as Markdown here")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--extrapolate", nargs=2, metavar="JSON", help="estimate the full-size times from two --json reports"
    )
    if argv is None:
        argv = sys.argv[1:]
    if "--extrapolate" in argv:  # no run: --workdir is not needed
        argv = [*argv, "--workdir", "-"]
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must lie in (0, 1]; got {args.scale}")
    if args.d < 1:
        parser.error(f"--d must be positive; got {args.d}")
    return args


if __name__ == "__main__":
    main()
