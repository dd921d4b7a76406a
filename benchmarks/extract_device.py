"""Extraction throughput at the device's limit: decode on CPU workers or on the GPU, one model or a group of four.

For each model (random weights, eval mode, autocast on CUDA), in one run:

* ``alone``       - the forward pass over one preprocessed batch already on the device, repeated: the device limit;
* ``cpu_decode``  - `extract_group` with this model alone, PIL decode + timm transform in ``--workers`` processes;
* ``gpu_decode``  - the same with ``decode="device"`` (``torchvision.io.decode_jpeg`` on the device, tensor
                    preprocessing; skipped on a CPU device unless ``--device-decode-on-cpu``);

and for the ``--group`` models together (one decode shared by all):

* ``group_cpu_decode`` / ``group_gpu_decode`` - images/s through all of them, against the group's limit
  (1 / Σ 1/alone of its models).

Every figure is also given as a ratio to its limit. JPEGs are generated at ImageNet-like sizes (about 90 KB each).

Example (the table of docs/extract.md; about 5 minutes on one H200 with 16 cores):
    python benchmarks/extract_device.py --device cuda --images 4096 --batch-size 256
Tiny CPU check of the script itself:
    python benchmarks/extract_device.py --device cpu --images 16 --batch-size 4 --workers 1 \
        --model test_resnet --model test_vit --group test_resnet,test_vit,test_efficientnet,test_convnext \
        --device-decode-on-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from oodbench.core.store import Store
from oodbench.extract.backbones.base import autocast, resolve_device
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import image_folder, load_rgb
from oodbench.extract.pipeline import GroupMember, extract_group

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_group import make_jpegs  # noqa: E402  (the same generated photos as the CPU benchmark)

DEFAULT_MODELS = ("resnet50.a1_in1k", "vit_base_patch16_384.augreg_in1k")
DEFAULT_GROUP = "resnet50.a1_in1k,vit_base_patch16_384.augreg_in1k,convnext_tiny.fb_in1k,efficientnet_b0.ra_in1k"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alone_rate(backbone, first_image, device: torch.device, batch_size: int, batches: int, amp: bool) -> float:
    """Images/s of the bare forward over one preprocessed batch resident on the device (the model's limit)."""
    batch = torch.stack([backbone.transform(first_image)] * batch_size).to(device)
    model = backbone.model.to(device).eval()
    with torch.no_grad(), autocast(device, amp):
        model(batch)  # warm-up (cuDNN autotuning, allocator)
        sync(device)
        started = time.perf_counter()
        for _ in range(batches):
            model(batch)
        sync(device)
    return batches * batch_size / (time.perf_counter() - started)


def pipeline_rate(backbones, dataset, root: Path, args, decode: str) -> float:
    """Images/s of one shared-decode pass of `backbones` into a fresh store."""
    store_root = root / "store"
    shutil.rmtree(store_root, ignore_errors=True)
    members = [GroupMember(b, f"m{i}", args.batch_size) for i, b in enumerate(backbones)]
    sync(resolve_device(args.device))
    started = time.perf_counter()
    extract_group(
        Store(store_root),
        members,
        dataset,
        dataset_id="d",
        shard_size=args.images,
        num_workers=args.workers,
        device=args.device,
        amp=args.amp,
        decode=decode,
        progress=False,
    )
    return len(dataset) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--model", action="append", help=f"models measured alone (default: {', '.join(DEFAULT_MODELS)})"
    )
    parser.add_argument("--group", default=DEFAULT_GROUP, help="comma-separated models sharing one decode")
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--alone-batches", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader workers (all cores)")
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    parser.add_argument("--device-decode-on-cpu", action="store_true", help="run the device-decode arms on a CPU")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="oodbench-device-"))
    folder = root / "jpegs"
    if len(list(folder.glob("*.jpg"))) != args.images:
        shutil.rmtree(folder, ignore_errors=True)
        make_jpegs(folder, args.images)
    dataset = image_folder(folder, labels=False)
    first = load_rgb(dataset.path(0))
    device_decode = device.type == "cuda" or args.device_decode_on_cpu
    rows: list[dict] = []
    limits: dict[str, float] = {}
    for name in dict.fromkeys([*(args.model or DEFAULT_MODELS), *args.group.split(",")]):
        backbone = load_timm(name, pretrained=False)
        limits[name] = alone_rate(backbone, first, device, args.batch_size, args.alone_batches, args.amp)
        if name not in (args.model or DEFAULT_MODELS):
            continue
        row = {"what": name, "alone": limits[name], "cpu_decode": pipeline_rate([backbone], dataset, root, args, "pil")}
        if device_decode:
            row["gpu_decode"] = pipeline_rate([backbone], dataset, root, args, "device")
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    group = [load_timm(name, pretrained=False) for name in args.group.split(",")]
    group_limit = 1 / sum(1 / limits[name] for name in args.group.split(","))
    row = {"what": f"group of {len(group)}: {args.group}", "alone": group_limit}
    row["cpu_decode"] = pipeline_rate(group, dataset, root, args, "pil")
    if device_decode:
        row["gpu_decode"] = pipeline_rate(group, dataset, root, args, "device")
    rows.append(row)
    for row in rows:
        for arm in ("cpu_decode", "gpu_decode"):
            if arm in row:
                row[f"{arm}_ratio"] = round(row[arm] / row["alone"], 3)
        for key in ("alone", "cpu_decode", "gpu_decode"):
            if key in row:
                row[key] = round(row[key], 1)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    report = {
        "device": str(device),
        "gpu": gpu,
        "cores": os.cpu_count(),
        "workers": args.workers,
        "images": args.images,
        "batch_size": args.batch_size,
        "amp": args.amp,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "rows": rows,
    }
    print(json.dumps(report, indent=2))
    print("\n| measured | alone (img/s) | CPU decode, img/s (ratio) | GPU decode, img/s (ratio) |", file=sys.stderr)
    for row in rows:
        gpu_cell = f"{row['gpu_decode']} ({row['gpu_decode_ratio']})" if "gpu_decode" in row else "—"
        print(
            f"| {row['what']} | {row['alone']} | {row['cpu_decode']} ({row['cpu_decode_ratio']}) | {gpu_cell} |",
            file=sys.stderr,
        )
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
