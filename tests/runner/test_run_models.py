"""A run with real model kinds on generated images: timm classifier from a checkpoint, a frozen backbone with a
linear probe, an open_clip VLM scored zero-shot, a subset derived from an extracted entry, and the Ray engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from oodbench.core.results import read_rows
from oodbench.core.store import Store
from oodbench.runner.config import load_config
from oodbench.runner.executor import run_experiment
from oodbench.runner.plan import build_plan

from .. import reference
from ..extract.helpers import TINY_CLIP, register_tiny_clip, single_torch_thread, write_images


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread (see `single_torch_thread`)."""
    with single_torch_thread():
        yield


def _checkpoints(folder: Path) -> dict[str, Path]:
    """Seeded random weights saved as local checkpoint files (the offline stand-in for hub weights)."""
    import open_clip
    import timm
    import torch

    paths = {"config": register_tiny_clip(folder)}
    torch.manual_seed(0)
    for name in ("test_resnet.r160_in1k", "test_vit.r160_in1k"):
        paths[name] = folder / f"{name}.pth"
        torch.save(timm.create_model(name, pretrained=False, num_classes=10).state_dict(), paths[name])
    paths[TINY_CLIP] = folder / "tiny_clip.pt"
    torch.save(open_clip.create_model(TINY_CLIP, pretrained=None).state_dict(), paths[TINY_CLIP])
    return paths


EXPERIMENT = """
[experiment]
name = "models"
[engine]
workers = 0                       # decode images in the main process: tiny sets, 2 shared cores
[paths]
data = "{data}"
[[models]]
kind = "timm"
id = "resnet"
name = "test_resnet.r160_in1k"
checkpoint = "{resnet}"
batch_size = 8
[[models]]
kind = "probe"
id = "vit-probe"
backbone = "test_vit.r160_in1k"
backbone_id = "vit"
checkpoint = "{vit}"
probe = {{ val_fraction = 0.25, max_epochs = 20, method = "lbfgs" }}
[[models]]
kind = "open_clip"
id = "clip"
name = "{clip}"
config_file = "{clip_config}"      # a custom architecture: open_clip learns it from this file (in every worker)
checkpoint = "{clip_weights}"
[datasets.fit]
kind = "folder"
root = "${{data}}/fit"
labels = true
[datasets.val]
kind = "folder"
root = "${{data}}/val"
labels = true
[datasets.val-clean]
kind = "subset"
of = "val"
exclude = ["${{data}}/ambiguous.txt"]
[datasets.far]
kind = "folder"
root = "${{data}}/far"
[id]
fit = "fit"
test = "val-clean"
[ood]
datasets = ["far"]
[detectors]
include = ["msp", "energy", "maha", "knn"]
params = {{ knn = {{ k = 2 }} }}
[zeroshot]
classes = "${{data}}/classes.txt"
scores = ["mcm", "energy", "neglabel"]
[zeroshot.vocabularies.negatives]
ref = "negatives"
kind = "custom"
[report]
formats = ["markdown"]
score_figures = false
"""


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    data = root / "data"
    write_images(data / "fit", {"cat": 6, "dog": 6}, seed=1)
    write_images(data / "val", {"cat": 4, "dog": 4}, seed=2)
    write_images(data / "far", {"x": 5}, seed=3, size=(40, 20))
    (data / "ambiguous.txt").write_text("path\ncat/img001.png\ndog/img002.png\n")
    (data / "classes.txt").write_text("cat\ndog\n")
    weights = _checkpoints(root / "weights")
    text = EXPERIMENT.format(
        data=data,
        resnet=weights["test_resnet.r160_in1k"],
        vit=weights["test_vit.r160_in1k"],
        clip=TINY_CLIP,
        clip_weights=weights[TINY_CLIP],
        clip_config=weights["config"],
    )
    path = root / "experiment.toml"
    path.write_text(text)
    from oodbench.zeroshot.vocab.artefact import VocabStore, Vocabulary

    VocabStore(root / "run" / "vocab").save(Vocabulary("negatives", "custom", ["tree", "car", "cloud", "boat"]))
    return path


@pytest.fixture(scope="module")
def first_run(experiment: Path) -> tuple[Path, object]:
    """The experiment's first (local) run: its work directory and report."""
    workdir = experiment.parent / "run"
    return workdir, run_experiment(load_config(experiment, workdir=workdir), progress=False, device="cpu")


def test_models_run_end_to_end_and_then_is_cached(experiment: Path, first_run) -> None:
    workdir, report = first_run
    assert sorted(report.executed["extract"]) == sorted(
        [f"extract:{m}/{d}" for m in ("resnet", "vit") for d in ("fit", "val", "val-clean", "far")]
        + ["extract:vit-probe/probe"]
        + [f"extract:clip/{d}" for d in ("val", "val-clean", "far")]
    )
    store = Store(workdir / "store")

    # The subset holds the parent's rows minus the two listed images, in order, with its own item list.
    parent_items = (store.entry_path("resnet", "val") / "items.txt").read_text().splitlines()
    items = (store.entry_path("resnet", "val-clean") / "items.txt").read_text().splitlines()
    assert items == [i for i in parent_items if i not in ("cat/img001.png", "dog/img002.png")] and len(items) == 6
    parent, subset = store.read("resnet", "val"), store.read("resnet", "val-clean")
    keep = [parent_items.index(i) for i in items]
    np.testing.assert_array_equal(subset.features, parent.features[keep])
    np.testing.assert_array_equal(subset.labels, parent.labels[keep])
    store.check_compatible(("resnet", "val"), ("resnet", "val-clean"))

    # The probe wrote its head and logits under the probe's id; detectors ran on it like on any classifier.
    assert store.has_head("vit-probe") and store.read("vit-probe", "val-clean").logits.shape == (6, 2)
    rows = read_rows(workdir / "results.parquet")
    by_model = {m: {r.detector for r in rows if r.model == m} for m in ("resnet", "vit-probe", "clip")}
    assert by_model["resnet"] == by_model["vit-probe"] == {"msp", "energy", "maha", "knn"}
    assert by_model["clip"] == {"mcm", "energy", "neglabel@negatives"}
    assert all(r.n_id == 6 and r.n_ood == 5 for r in rows)
    assert (workdir / "report" / "report.md").is_file()
    # The numbers are the detectors' own: MSP and energy recomputed here from the stored logits in float64. The
    # detectors work on the same float32 logits; exp/log of values of order 1 over C = 2 classes differ by a few
    # float32 ulps at most (< 1e-6 relative).
    for model in ("resnet", "vit-probe"):
        logits = store.read(model, "far").logits.astype(np.float64)
        for name, definition in (("msp", reference.msp), ("energy", reference.energy)):
            written = np.load(workdir / "units" / "scores" / model / name / "far.npy")
            np.testing.assert_allclose(written, definition(logits), rtol=1e-6, atol=1e-7, err_msg=f"{model}/{name}")

    again = run_experiment(load_config(experiment, workdir=workdir), progress=False, device="cpu")
    assert again.total_executed == 0


def test_missing_root_stops_the_run_before_any_work(experiment: Path, tmp_path: Path) -> None:
    from oodbench.core.errors import ConfigError

    config = load_config(
        experiment,
        workdir=tmp_path / "w",
        overrides=[
            f"datasets.far.root={tmp_path / 'nowhere'}",
            f"zeroshot.vocab_store={experiment.parent / 'run' / 'vocab'}",
        ],
    )
    with pytest.raises(ConfigError, match=r"^datasets\.far\.root: .*nowhere does not exist"):
        run_experiment(config, progress=False, device="cpu")
    assert not (tmp_path / "w").exists()


def test_changed_checkpoint_reextracts_that_model_only(experiment: Path, first_run, tmp_path: Path) -> None:
    import shutil

    import timm
    import torch

    local = first_run[0]
    workdir = tmp_path / "run"
    shutil.copytree(local, workdir)
    torch.manual_seed(1)
    other = tmp_path / "other.pth"
    torch.save(timm.create_model("test_resnet.r160_in1k", pretrained=False, num_classes=10).state_dict(), other)
    config = load_config(experiment, workdir=workdir, overrides=[f"models[0].checkpoint={other}"])
    report = run_experiment(config, progress=False, device="cpu")
    assert sorted(report.executed["extract"]) == sorted(
        f"extract:resnet/{d}" for d in ("fit", "val", "val-clean", "far")
    )
    assert {u.split("/")[0] for u in report.executed["score"]} == {"score:resnet"}
    old = Store(local / "store").meta("resnet", "far")["provenance"]["checkpoint"]
    new = Store(workdir / "store").meta("resnet", "far")["provenance"]["checkpoint"]
    assert old != new and new.endswith(timm_sha(other))


def timm_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_ray_engine_gives_the_local_results(experiment: Path, first_run, tmp_path: Path) -> None:
    """Extraction and fit+score as Ray tasks on a local Ray instance give what the local engine gives."""
    import shutil

    import ray

    local = first_run[0]
    extracted, scored = tmp_path / "ray-extract", tmp_path / "ray-score"
    shutil.copytree(local / "vocab", extracted / "vocab")
    # Same store and extraction records as the local run, nothing else: only fit+score (and later stages) run.
    for part in ("store", "vocab", "ledger/extract"):
        shutil.copytree(local / part, scored / part)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}},
    )
    try:
        extract_config = load_config(experiment, workdir=extracted)
        report = run_experiment(extract_config, engine="ray", progress=False, device="cpu", only="extract")
        assert len(report.executed["extract"]) == 12  # one Ray task per (model, dataset), then the probe
        score_config = load_config(experiment, workdir=scored, overrides=["engine.cpus_per_score=0.5"])
        report = run_experiment(score_config, engine="ray", progress=False, device="cpu")
    finally:
        ray.shutdown()

    # Extraction: the same arrays up to float32 rounding (separate processes may pick other CPU kernels, which sum
    # each layer's products in another order). A reordered float32 sum of K terms moves by at most about K·2⁻²⁴ of
    # the sum of |terms|; these tiny models' layers have K ≤ 192, so rtol 1e-5 (≈ 170 ulps) plus atol 1e-6 for
    # near-zero features covers it.
    ray_store, local_store = Store(extracted / "store"), Store(local / "store")
    for model in ("resnet", "vit", "vit-probe", "clip"):
        for dataset in ("val-clean", "far"):
            np.testing.assert_allclose(
                ray_store.read(model, dataset).features, local_store.read(model, dataset).features, rtol=1e-5, atol=1e-6
            )
            assert ray_store.meta(model, dataset)["item_hash"] == local_store.meta(model, dataset)["item_hash"]

    # Fit+score on identical inputs: identical scores and rows.
    assert report.executed["extract"] == []
    assert len(report.executed["fit"]) == 2 * 4  # one Ray task per (classifier, detector)
    assert len(report.executed["score"]) == 2 * 4 * 2 + 1  # their score units, and the zero-shot unit
    for model in ("resnet", "vit-probe"):
        for detector in ("msp", "energy", "maha", "knn"):
            for dataset in ("val-clean", "far"):
                relative = Path("units/scores") / model / detector / f"{dataset}.npy"
                np.testing.assert_array_equal(np.load(scored / relative), np.load(local / relative))
    ray_rows = {(r.model, r.ood_dataset, r.detector, r.metric): r.value for r in read_rows(scored / "results.parquet")}
    local_rows = {(r.model, r.ood_dataset, r.detector, r.metric): r.value for r in read_rows(local / "results.parquet")}
    assert ray_rows == local_rows
    assert all(u.status in ("cached", "skipped") for u in build_plan(score_config).units)


def test_extraction_passes_share_the_decode_and_match_one_model_at_a_time(
    experiment: Path, first_run, tmp_path: Path
) -> None:
    from oodbench.runner.passes import extraction_passes
    from oodbench.runner.plan import format_plan

    workdir, _ = first_run
    # The first run extracted each dataset's models in one pass: all of them fit in this machine's memory.
    config = load_config(experiment, workdir=tmp_path / "planned")
    plan = build_plan(config)
    passes = extraction_passes(config, plan.pending("extract"), "cpu")
    shared = {p.units[0].dataset: sorted(u.model for u in p.units) for p in passes if p.shared}
    assert shared == {"fit": ["resnet", "vit"], "val": ["clip", "resnet", "vit"], "far": ["clip", "resnet", "vit"]}
    text = format_plan(plan)
    assert "[extract passes] 3 passes over the images (3 shared by several models" in text
    assert any(
        line.split()[2:5] == ["val", "3", "model(s),"] and line.endswith(": resnet, vit-probe, clip")
        for line in text.splitlines()
    )
    # With a budget no model fits in, every model runs alone: the arrays are the same bytes.
    alone_config = load_config(experiment, workdir=tmp_path / "alone", overrides=("engine.pass_memory_gb=1e-9",))
    assert not any(p.shared for p in extraction_passes(alone_config, build_plan(alone_config).pending("extract")))
    assert "size unknown" not in format_plan(build_plan(alone_config))
    # One intra-op thread for both runs: with several, CPU GEMM kernels may split and round a batch differently
    # from one run to the next (last-bit differences), which would hide what is compared here, the pixels.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        grouped_config = load_config(experiment, workdir=tmp_path / "grouped")
        run_experiment(grouped_config, only="extract", progress=False, device="cpu")
        run_experiment(alone_config, only="extract", progress=False, device="cpu")
    finally:
        torch.set_num_threads(threads)
    grouped, alone = Store(tmp_path / "grouped" / "store"), Store(tmp_path / "alone" / "store")
    for model in ("resnet", "vit", "clip"):
        for dataset in [d for d in ("fit", "val", "val-clean", "far") if grouped.exists(model, d)]:
            a, b = grouped.entry_path(model, dataset), alone.entry_path(model, dataset)
            names = sorted(p.name for p in a.glob("*.npy"))
            assert names and names == sorted(p.name for p in b.glob("*.npy"))
            for name in names:
                assert (a / name).read_bytes() == (b / name).read_bytes(), (model, dataset, name)
