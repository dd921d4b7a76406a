"""A small but real evaluation run directory: synthetic Gaussian features, a linear head, `evaluate_store`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oodbench.core.outputs import Head, Outputs
from oodbench.core.store import Store, hash_items
from oodbench.evaluation.evaluate import evaluate_store

LOGIT_DETECTORS = ["msp", "maxlogit", "kl_matching", "energy", "gen"]
OOD_SIZES = {"near": 300, "far": 260, "noise": 220}


def _outputs(rng: np.random.Generator, head: Head, means: np.ndarray, n: int, scale: float, labelled: bool) -> Outputs:
    labels = rng.integers(0, means.shape[0], n)
    features = (means[labels] + scale * rng.standard_normal((n, means.shape[1]))).astype(np.float32)
    logits = head.logits(features).astype(np.float32)
    return Outputs(features, logits, labels if labelled else None)


def make_run(
    root: Path,
    model: str = "toy-model",
    seed: int = 0,
    shift: float = 1.0,
    names: dict[str, str] | None = None,
    ood_labels: bool = False,
) -> Path:
    """Store entries for one model (fit, ID test, three OOD sets) and its evaluation run directory.

    `names` renames the OOD sets (near, far, noise), e.g. to datasets of the Fi-ImageNet-1k paper; `ood_labels`
    stores class labels with them (the class each image was drawn around).
    """
    names = names or {}
    rng = np.random.default_rng(seed)
    classes, dim = 4, 8
    means = 3.0 * rng.standard_normal((classes, dim))
    head = Head((means / 3.0).astype(np.float32), np.zeros(classes, np.float32))
    store = Store(root / "store")
    provenance = {"model": model, "checkpoint": f"sha256:{seed:064x}", "preprocessing": "none"}
    sets = {
        "fit": _outputs(rng, head, means, 600, 1.0, True),
        "id-test": _outputs(rng, head, means, 400, 1.0, True),
        "near": _outputs(
            rng, head, means + shift * rng.standard_normal((classes, dim)), OOD_SIZES["near"], 1.3, ood_labels
        ),
        "far": _outputs(rng, head, 0.3 * means, OOD_SIZES["far"], 2.0, ood_labels),
        "noise": _outputs(rng, head, np.zeros((1, dim)), OOD_SIZES["noise"], 3.0, False),
    }
    sets = {names.get(name, name): outputs for name, outputs in sets.items()}
    for name, outputs in sets.items():
        store.write_outputs(
            model,
            name,
            outputs,
            provenance=provenance,
            item_hash=hash_items(f"{name}/{i}.png" for i in range(len(outputs))),
        )
    store.write_head(model, head, provenance=provenance)
    run_dir = root / f"run-{model}"
    evaluate_store(
        store,
        model,
        "fit",
        "id-test",
        [names.get(o, o) for o in OOD_SIZES],
        LOGIT_DETECTORS,
        out_dir=run_dir,
        progress=False,
    )
    return run_dir
