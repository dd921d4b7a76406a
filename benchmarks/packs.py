"""Feature packs measured: bytes per row against the store, export / verify / import against the disk's read rate
measured in the same run, and the AUROC / FPR@95 change a float16 pack causes.

Two stores: the digits demo's (``oodbench demo``'s CNN, every array it stores) and the paper-scale synthetic store of
``benchmarks/paper_scale.py`` (the fit set, the ID test set and the 15 OOD sets of the paper's Table 3 at
``--scale`` of their sizes, features of dimension ``--d``, logits and labels for 1000 classes, the head).

Rates are cold: before each timed step, the pages of the files it reads are dropped from the page cache
(``posix_fadvise(DONTNEED)`` after ``fsync``), so every step reads from the disk, as the disk read rate does. The
ratio is each step's seconds over the seconds the disk takes to read the same bytes (the brief's goal: <= 1.5).

Usage: python benchmarks/packs.py --workdir /var/tmp/packs --d 2048 --scale 0.01 [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_scale import FIT, ID_TEST, MODEL, plan_sizes, write_store  # noqa: E402

from oodbench.core.pack import export_pack, import_pack, verify_pack  # noqa: E402
from oodbench.core.store import Store  # noqa: E402


def files_under(root: Path) -> list[Path]:
    """Regular files under `root`."""
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def drop_cache(paths: Iterable[Path]) -> None:
    """Write back and drop the page-cache pages of `paths`, so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_seconds(paths: list[Path]) -> tuple[float, int]:
    """Seconds to read every byte of `paths` from the disk (cache dropped first), and the bytes."""
    drop_cache(paths)
    buffer, total = bytearray(16 * 2**20), 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(buffer):
                total += got
    return time.perf_counter() - started, total


def disk_write_seconds(path: Path, nbytes: int) -> float:
    """Seconds to write `nbytes` to a new file and fsync it (the disk's write rate), the file removed after."""
    block = bytes(16 * 2**20)
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for start in range(0, nbytes, len(block)):
            handle.write(block[: min(len(block), nbytes - start)])
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def sha256_rate(nbytes: int = 256 * 2**20) -> float:
    """GB/s of SHA-256 on one core (from memory)."""
    data = os.urandom(nbytes)
    started = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return nbytes / (time.perf_counter() - started) / 1e9


def timed(step: Callable[[], Any], reads: list[Path]) -> tuple[float, Any]:
    """Seconds of `step` with `reads` dropped from the cache first."""
    drop_cache(reads)
    started = time.perf_counter()
    result = step()
    return time.perf_counter() - started, result


def throughput(store_root: Path, work: Path, entries: list[tuple[str, str]]) -> dict[str, Any]:
    """Export, verify and import one pack of `entries`, each cold, against the disk read rate of the same bytes."""
    store = Store(store_root)
    sources = [p for m, d in entries for p in files_under(store.entry_path(m, d))] + files_under(
        store_root / MODEL / "head"
    )
    read_s, read_bytes = disk_read_seconds(sources)
    for name in ("pack", "imported"):
        shutil.rmtree(work / name, ignore_errors=True)
    export_s, summary = timed(lambda: export_pack(store, work / "pack", entries), sources)
    pack_files = files_under(work / "pack")
    pack_read_s, pack_bytes = disk_read_seconds(pack_files)
    verify_s, (_, verified, _) = timed(lambda: verify_pack(work / "pack"), pack_files)
    assert not verified.problems
    import_s, _ = timed(lambda: import_pack(work / "pack", work / "imported"), pack_files)
    write_s = disk_write_seconds(work / "write-test", pack_bytes)
    sha_rate = sha256_rate()
    return {
        "disk_write_s": write_s,
        "disk_write_GBps": pack_bytes / write_s / 1e9,
        "sha256_GBps_one_core": sha_rate,
        "store_bytes": read_bytes,
        "pack_bytes": pack_bytes,
        "disk_read_store_s": read_s,
        "disk_read_pack_s": pack_read_s,
        "disk_read_GBps": read_bytes / read_s / 1e9,
        "export_s": export_s,
        "verify_s": verify_s,
        "import_s": import_s,
        "export_ratio": export_s / read_s,
        "verify_ratio": verify_s / pack_read_s,
        "import_ratio": import_s / pack_read_s,
        "cpus": os.cpu_count(),
    }


def bytes_per_row(
    store_root: Path, pack_root: Path, pack16_root: Path, entries: list[tuple[str, str]]
) -> dict[str, float]:
    """Bytes per row of the store's arrays, the float32 pack's and the float16 pack's, over `entries`."""
    store = Store(store_root)
    rows = sum(store.meta(m, d)["num_rows"] for m, d in entries)
    npy = sum(p.stat().st_size for m, d in entries for p in store.entry_path(m, d).glob("*.npy"))
    pack = sum((pack_root / m / d / "arrays.safetensors").stat().st_size for m, d in entries)
    half = sum((pack16_root / m / d / "arrays.safetensors").stat().st_size for m, d in entries)
    return {"rows": rows, "store": npy / rows, "pack": pack / rows, "pack_float16": half / rows}


def metric_changes(
    store_root: Path, pack16_root: Path, work: Path, model: str, fit: str, id_set: str, oods: list[str], plan: dict
) -> dict[str, Any]:
    """Evaluate `plan` on the store and on the float16 pack; the largest |change| of AUROC and FPR@95 per detector."""
    from oodbench.evaluation.evaluate import evaluate_store

    tables = []
    for source, name in ((store_root, "run32"), (pack16_root, "run16")):
        shutil.rmtree(work / name, ignore_errors=True)
        evaluate_store(source, model, fit, id_set, oods, plan, out_dir=work / name, progress=False)
        import pandas as pd

        tables.append(pd.read_parquet(work / name / "results.parquet"))
    keys = ["detector", "ood_dataset", "metric"]
    joined = tables[0].merge(tables[1], on=keys, suffixes=("_32", "_16"))
    joined = joined[joined.metric.isin(["auroc", "fpr95"])]
    joined["change"] = (joined.value_16 - joined.value_32).abs() * 100
    out: dict[str, Any] = {}
    for (detector, metric), group in joined.groupby(["detector", "metric"]):
        out.setdefault(detector, {})[metric] = float(group.change.max())
    return out


def main() -> None:
    """Run both stores' measurements and print them as Markdown (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/packs"))
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--detectors", default="msp,maxlogit,energy,maha,rmaha,knn,vim,react")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--throughput-only", action="store_true", help="Skip the demo and the float16 evaluations.")
    args = parser.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}

    if not args.throughput_only:
        demo_report(work, report)
    synthetic_report(work, args, report)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=float))


def demo_report(work: Path, report: dict[str, Any]) -> None:
    """The demo store's bytes per row and float16 metric changes."""
    from oodbench.demo import FIT as DEMO_FIT
    from oodbench.demo import ID_TEST as DEMO_ID
    from oodbench.demo import MODEL_ID, OOD_SETS, demo_detector_params, prepare

    demo = prepare(work / "demo", seed=0)
    demo_entries = [(MODEL_ID, d) for d in demo.store.datasets(MODEL_ID)]
    for name, half in (("demo-pack", False), ("demo-pack16", True)):
        shutil.rmtree(work / name, ignore_errors=True)
        export_pack(demo.store, work / name, demo_entries, float16=half)
    report["demo_bytes_per_row"] = bytes_per_row(
        demo.store.root, work / "demo-pack", work / "demo-pack16", demo_entries
    )
    fit_meta = demo.store.meta(MODEL_ID, DEMO_FIT)
    plan = demo_detector_params(fit_meta["num_rows"], fit_meta["arrays"]["features"]["shape"][1], 6)
    report["demo_float16"] = metric_changes(
        demo.store.root, work / "demo-pack16", work, MODEL_ID, DEMO_FIT, DEMO_ID, list(OOD_SETS), plan
    )


def synthetic_report(work: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The paper-scale synthetic store's throughput, bytes per row and float16 metric changes."""
    sizes = plan_sizes(args.scale)
    synthetic = work / f"synthetic-d{args.d}-s{args.scale}"
    if not (synthetic / MODEL / FIT / "meta.json").is_file():
        shutil.rmtree(synthetic, ignore_errors=True)
        write_store(synthetic, sizes, args.d, 0, print)
    entries = [(MODEL, d) for d in sizes]
    report["synthetic"] = {"d": args.d, "scale": args.scale, "rows": sizes}
    report["throughput"] = throughput(synthetic, work, entries)
    shutil.rmtree(work / "pack16", ignore_errors=True)
    export_pack(Store(synthetic), work / "pack16", entries, float16=True)
    report["synthetic_bytes_per_row"] = bytes_per_row(synthetic, work / "pack", work / "pack16", entries)
    if args.throughput_only:
        return
    names = [d.strip() for d in args.detectors.split(",")]
    knn_k = max(1, min(1000, sizes[FIT] // 100))
    synthetic_plan = {name: ({"k": knn_k} if name == "knn" else {}) for name in names}
    oods = [d for d in sizes if d not in (FIT, ID_TEST)]
    report["synthetic_float16"] = metric_changes(
        synthetic, work / "pack16", work, MODEL, FIT, ID_TEST, oods, synthetic_plan
    )


def print_report(report: dict[str, Any]) -> None:
    """The report as Markdown tables."""
    t = report["throughput"]
    print(
        f"disk read {t['disk_read_GBps']:.2f} GB/s, disk write {t['disk_write_GBps']:.2f} GB/s (fsync), SHA-256 "
        f"{t['sha256_GBps_one_core']:.2f} GB/s on one core, over {t['store_bytes'] / 1e9:.2f} GB, {t['cpus']} CPUs"
    )
    print("| step | seconds | disk read of the same bytes (s) | ratio to the read | disk write of them (s) |")
    print("|---|---:|---:|---:|---:|")
    for step, base in (("export", "disk_read_store_s"), ("verify", "disk_read_pack_s"), ("import", "disk_read_pack_s")):
        write = f"{t['disk_write_s']:.2f}" if step != "verify" else "-"
        print(f"| {step} | {t[step + '_s']:.2f} | {t[base]:.2f} | {t[step + '_ratio']:.2f} | {write} |")
    for key in ("demo_bytes_per_row", "synthetic_bytes_per_row"):
        if key not in report:
            continue
        b = report[key]
        print(
            f"{key}: store {b['store']:,.0f}, pack {b['pack']:,.0f}, float16 pack {b['pack_float16']:,.0f} ({b['rows']:,} rows)"
        )
    for key in ("demo_float16", "synthetic_float16"):
        if key not in report:
            continue
        print(f"| {key} detector | max abs change AUROC (pp) | max abs change FPR@95 (pp) |\n|---|---:|---:|")
        for detector, change in sorted(report[key].items()):
            print(f"| {detector} | {change.get('auroc', float('nan')):.3f} | {change.get('fpr95', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
