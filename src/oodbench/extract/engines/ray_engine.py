"""Ray engine: Ray Data decodes and preprocesses on CPU workers and runs the backbone on (GPU) actors.

Each Ray Data row is one planned batch (the same batches as the local engine), so both engines produce the
same arrays. Results stream back to the driver, which writes shards into the store exactly as the local
engine does; a rerun only plans the shards still missing. Connects to a running cluster (``RAY_ADDRESS`` or
`address`) or starts a local Ray instance.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ...core.errors import ExtractError
from ..backbones.base import Backbone
from .common import BatchResult, BatchTask, load_batch, pack, unpack

__all__ = ["iter_results"]


def _decode(row: dict[str, Any], loader: Callable[[int], torch.Tensor]) -> dict[str, Any]:
    """Ray Data task: load and preprocess the items of one batch row (CPU)."""
    pixels, ok, skipped = load_batch(loader, json.loads(row["positions"]))
    arrays = {} if pixels is None else {"pixels": pixels.numpy()}
    return {"task": row["task"], "payload": pack(arrays, ok=ok, skipped=skipped)}


class _Infer:
    """Ray Data actor: holds the backbone on its device and runs it on decoded batches."""

    def __init__(self, backbone_ref: list[Any], device: str, amp: bool, threads: int | None) -> None:
        import ray

        if threads:
            torch.set_num_threads(threads)
        self.backbone: Backbone = ray.get(backbone_ref[0]).to(device)
        self.amp = amp

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        arrays, meta = unpack(row["payload"])
        outputs = self.backbone.infer(torch.from_numpy(arrays["pixels"]), amp=self.amp) if "pixels" in arrays else {}
        return {"task": row["task"], "payload": pack(outputs, ok=meta["ok"], skipped=meta["skipped"])}


def iter_results(
    backbone: Backbone,
    loader: Callable[[int], torch.Tensor],
    tasks: Sequence[BatchTask],
    *,
    amp: bool = True,
    address: str | None = None,
    num_actors: int | None = None,
    gpus_per_actor: float | None = None,
    cpus_per_actor: float = 1.0,
    decode_cpus: float = 1.0,
    threads_per_actor: int | None = None,
) -> Iterator[BatchResult]:
    """Run the planned batches on Ray; results come back as they finish (not necessarily in order).

    On CPU, float kernels round differently with different intra-op thread counts, so CPU actors use the
    driver's ``torch.get_num_threads()`` unless `threads_per_actor` says otherwise (arrays then match a local run).
    """
    try:
        import ray
        import ray.data
    except ImportError as exc:  # pragma: no cover - ray is a declared optional dependency
        raise ExtractError("the Ray engine needs ray[data]: pip install 'oodbench[ray]'") from exc
    if not tasks:
        return
    if not ray.is_initialized():
        ray.init(
            address=address,
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    gpus_available = float(ray.cluster_resources().get("GPU", 0))
    if gpus_per_actor is None:
        gpus_per_actor = 1.0 if gpus_available >= 1 else 0.0
    if num_actors is None:
        num_actors = max(1, int(gpus_available // gpus_per_actor)) if gpus_per_actor > 0 else 1
    device = "cuda" if gpus_per_actor > 0 else "cpu"
    if device == "cpu" and threads_per_actor is None:
        # CPU kernels round differently with other thread counts: match the driver so arrays equal a local run.
        threads_per_actor = torch.get_num_threads()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.verbose_stats_logs = False
    # The driver keeps the backbone; actors get it through the object store (one copy, same weights everywhere).
    backbone_ref = ray.put(backbone.to("cpu"))
    rows = [{"task": index, "positions": json.dumps(list(task.positions))} for index, task in enumerate(tasks)]
    dataset = ray.data.from_items(rows, override_num_blocks=min(len(rows), 200))
    # With GPU actors the decode tasks stay separate CPU tasks; in CPU-only runs Ray fuses them into the actors
    # (equal resource requests), which costs nothing there since both compete for the same cores anyway.
    dataset = dataset.map(_decode, fn_kwargs={"loader": loader}, num_cpus=decode_cpus)
    dataset = dataset.map(
        _Infer,
        fn_constructor_kwargs={
            "backbone_ref": [backbone_ref],
            "device": device,
            "amp": amp,
            "threads": threads_per_actor,
        },
        num_cpus=cpus_per_actor,
        num_gpus=gpus_per_actor or None,
        compute=ray.data.ActorPoolStrategy(size=num_actors),
    )
    for row in dataset.iter_rows():
        arrays, meta = unpack(row["payload"])
        yield BatchResult(tasks[int(row["task"])], np.asarray(meta["ok"], dtype=np.int64), arrays, meta["skipped"])
