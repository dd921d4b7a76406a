"""Benchmark one shared decode for several models against extracting them one after another.

Both arms write real store entries from the same generated JPEGs (ImageNet-like sizes and file sizes):

* ``separate`` - `oodbench.extract.pipeline.extract` once per model (each run reads and decodes every image);
* ``grouped``  - `oodbench.extract.pipeline.extract_group` with all models (each image read and decoded once,
                 each model's own transform on it; identical transforms computed once).

Repeats are interleaved (separate, grouped, grouped, separate, ...) so load from other jobs hits both arms; the
best of each arm is compared, in wall time and in CPU seconds of this process and its DataLoader workers (the CPU
figure is robust when other jobs share the machine). The grouped arm's arrays are checked to be byte-identical to
the separate arm's. The 1-minute load average is printed before and after.

Example (the figure in docs/extract.md):
    python benchmarks/extract_group.py --images 2000 --repeats 2
    python benchmarks/extract_group.py --images 2000 --repeats 2 \
        --model test_vit --model test_resnet --model mobilenetv3_small_050.lamb_in1k
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from oodbench.core.store import Store
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import image_folder
from oodbench.extract.pipeline import GroupMember, extract, extract_group

DEFAULT_MODELS = ("mobilenetv3_small_050.lamb_in1k", "lcnet_050.ra2_in1k", "mobilenetv3_small_100.lamb_in1k")
# Width x height of ImageNet-like photos (the most common ILSVRC sizes).
SIZES = ((500, 375), (375, 500), (500, 333), (500, 400), (400, 300), (333, 500))


def make_jpegs(folder: Path, count: int, seed: int = 0) -> Path:
    """Gradients with noise at ImageNet sizes, JPEG quality 90 (about 90 KB each, like ImageNet's photos)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        w, h = SIZES[i % len(SIZES)]
        y, x = np.mgrid[0:h, 0:w]
        phase = rng.uniform(0, 2 * np.pi, 3)
        base = np.stack([127 + 100 * np.sin(x / (20 + 7 * c) + y / 31 + phase[c]) for c in range(3)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)
    return folder


def cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (the DataLoader workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def run_arm(arm: str, backbones: list, dataset, root: Path, args: argparse.Namespace) -> tuple[float, float, Path]:
    store_root = root / f"store-{arm}"
    shutil.rmtree(store_root, ignore_errors=True)
    store = Store(store_root)
    wall, cpu = time.perf_counter(), cpu_seconds()
    options = dict(shard_size=args.shard_size, num_workers=args.workers, device=args.device, progress=False)
    if arm == "separate":
        for name, backbone in backbones:
            extract(store, backbone, dataset, dataset_id="d", model_id=name, batch_size=args.batch_size, **options)
    else:
        members = [GroupMember(b, name, args.batch_size) for name, b in backbones]
        extract_group(store, members, dataset, dataset_id="d", **options)
    return time.perf_counter() - wall, cpu_seconds() - cpu, store_root


def same_arrays(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*.npy") if "head" not in p.parts)
    return bool(files) and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="timm model (random init); repeat (default: three small)")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--shard-size", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the forward pass")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", type=Path, default=None, help="keep images here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.model or list(DEFAULT_MODELS)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="oodbench-group-"))
    folder = root / "jpegs"
    if len(list(folder.glob("*.jpg"))) != args.images:
        shutil.rmtree(folder, ignore_errors=True)
        make_jpegs(folder, args.images)
    dataset = image_folder(folder, labels=False)
    backbones = [(name, load_timm(name, pretrained=False)) for name in names]
    mean_kb = sum(p.stat().st_size for p in folder.glob("*.jpg")) / args.images / 1024
    print(f"{args.images} JPEGs ({mean_kb:.0f} KB on average), models: " + ", ".join(names), file=sys.stderr)
    for name, backbone in backbones:
        print(f"  {name}: {backbone.preprocessing}", file=sys.stderr)
    load_before = os.getloadavg()[0]
    results: dict[str, list[tuple[float, float]]] = {"separate": [], "grouped": []}
    stores: dict[str, Path] = {}
    for repeat in range(args.repeats):
        order = ("separate", "grouped") if repeat % 2 == 0 else ("grouped", "separate")
        for arm in order:
            wall, cpu, stores[arm] = run_arm(arm, backbones, dataset, root, args)
            results[arm].append((wall, cpu))
            print(f"repeat {repeat}: {arm:<8} {wall:7.1f} s wall, {cpu:7.1f} CPU-s", file=sys.stderr)
    identical = same_arrays(stores["separate"], stores["grouped"])
    best = {arm: (min(w for w, _ in runs), min(c for _, c in runs)) for arm, runs in results.items()}
    report = {
        "images": args.images,
        "models": names,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "threads": args.threads,
        "device": args.device,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "runs": results,
        "best_wall_s": {arm: round(v[0], 2) for arm, v in best.items()},
        "best_cpu_s": {arm: round(v[1], 2) for arm, v in best.items()},
        "grouped_over_separate_wall": round(best["grouped"][0] / best["separate"][0], 3),
        "grouped_over_separate_cpu": round(best["grouped"][1] / best["separate"][1], 3),
        "byte_identical": identical,
    }
    print(json.dumps(report, indent=2))
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
