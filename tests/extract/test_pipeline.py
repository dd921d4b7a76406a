"""Extraction end to end: store round trip, corrupt images, resumption after SIGKILL, detectors consuming entries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from oodbench import Store, detectors
from oodbench.core import metrics
from oodbench.core.errors import ExtractError
from oodbench.evaluation import evaluate_store
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.cli import register
from oodbench.extract.datasets import image_folder
from oodbench.extract.engines.common import plan_tasks
from oodbench.extract.pipeline import extract

from .. import reference
from .helpers import write_images

ROOT = Path(__file__).resolve().parents[2]


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _cli(*args: str):
    return CliRunner().invoke(_app(), list(args))


def test_plan_restarts_batches_at_every_shard():
    tasks = plan_tasks([(0, slice(0, 5)), (2, slice(10, 13))], 2)
    assert [(t.shard, t.seq, t.positions) for t in tasks] == [
        (0, 0, (0, 1)),
        (0, 1, (2, 3)),
        (0, 2, (4,)),
        (2, 0, (10, 11)),
        (2, 1, (12,)),
    ]


def test_cli_extract_round_trip_with_corrupt_file(image_dir, tmp_path):
    store_dir = tmp_path / "store"
    extract = ["extract", "--model", "test_resnet", "--no-pretrained", "--image-size", "32", "--store", str(store_dir)]
    extract += ["--data", str(image_dir), "--batch-size", "3", "--shard-size", "4", "--no-progress"]
    result = _cli(*extract, "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "1 unreadable image(s) skipped" in result.output and "dog/broken.png" in result.output
    store = Store(store_dir)
    out = store.read("test_resnet", "images")
    meta = store.meta("test_resnet", "images")
    # 10 items (5 cats, 4 dogs, 1 broken): 9 rows, the broken one is listed, never a silent hole.
    assert meta["num_items"] == 10 and meta["num_rows"] == 9 and meta["num_shards"] == 3
    assert meta["skipped"] == [{"item": 5, "path": "dog/broken.png", "error": meta["skipped"][0]["error"]}]
    assert "UnidentifiedImageError" in meta["skipped"][0]["error"]
    index = store.read_array("test_resnet", "images", "index")
    assert index.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert out.labels.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    items = (store.entry_path("test_resnet", "images") / "items.txt").read_text().splitlines()
    assert items == meta["items"] and items[5] == "dog/broken.png" and len(items) == 10
    assert meta["dataset"]["class_names"] == ["cat", "dog"]
    head = store.read_head("test_resnet")
    head.check_outputs(out)
    assert store.head_meta("test_resnet")["provenance"]["checkpoint"] == "random-init:seed=0"
    # The same arrays as a direct forward pass over the same images.
    backbone = load_timm("test_resnet", pretrained=False, image_size=32)
    import torch

    from oodbench.extract.datasets import load_rgb

    dataset = image_folder(image_dir)
    pixels = torch.stack([backbone.transform(load_rgb(dataset.path(i))) for i in index.tolist()])
    # Batches of 3 in 2 workers vs one batch of 9: the same float32 network, other batch shapes may pick other
    # kernels (summation orders) for its ≤ 100-term sums: ≲ 100·eps32 ≈ 1e-5 relative, 1e-6 near zero.
    np.testing.assert_allclose(out.features, backbone.infer(pixels)["features"], rtol=1e-5, atol=1e-6)
    # A rerun finds the entry complete and does nothing.
    again = _cli(*extract, "--workers", "0")
    assert again.exit_code == 0 and "already complete" in again.output


def test_entries_feed_detectors_and_metrics(tmp_path):
    id_dir = write_images(tmp_path / "id", {"a": 6, "b": 6}, seed=1)
    ood_dir = write_images(tmp_path / "ood", {"x": 8}, size=(12, 40), seed=2)
    store = Store(tmp_path / "store")
    backbone = load_timm("test_vit", pretrained=False, seed=0)
    extract(store, backbone, image_folder(id_dir), dataset_id="id", num_workers=0, progress=False, batch_size=4)
    extract(store, backbone, image_folder(ood_dir, labels=False), dataset_id="ood", num_workers=0, progress=False)
    store.check_compatible(("test_vit", "id"), ("test_vit", "ood"))
    fit, ood = store.read("test_vit", "id"), store.read("test_vit", "ood")
    assert ood.labels is None and fit.labels is not None
    for name, definition in (("msp", reference.msp), ("energy", reference.energy)):
        detector = detectors.create(name).fit(fit, store.read_head("test_vit"))
        scores_id, scores_ood = detector.score(fit), detector.score(ood)
        assert scores_id.shape == (12,) and scores_ood.shape == (8,)
        np.testing.assert_allclose(scores_id, definition(fit.logits), rtol=reference.SCORE_RTOL)
        np.testing.assert_allclose(scores_ood, definition(ood.logits), rtol=reference.SCORE_RTOL)
        expected = reference.auroc(scores_id, scores_ood)
        assert metrics.auroc(scores_id, scores_ood) == pytest.approx(expected, abs=reference.AUROC_ABS)


def test_all_corrupt_shard_and_model_id_conflicts(tmp_path):
    root = write_images(tmp_path / "d", {"a": 3}, corrupt=["b/1.png", "b/2.png", "b/3.png"])
    store = Store(tmp_path / "store")
    backbone = load_timm("test_resnet", pretrained=False, image_size=32)
    report = extract(
        store, backbone, image_folder(root), dataset_id="d", shard_size=3, batch_size=2, num_workers=0, progress=False
    )
    assert report.num_rows == 3 and len(report.skipped) == 3
    out = store.read("test_resnet", "d")
    assert out.features.shape == (3, 96) and out.labels.tolist() == [0, 0, 0]
    other = load_timm("test_resnet", pretrained=False, seed=1, image_size=32)
    with pytest.raises(ExtractError, match="pass another --model-id"):
        extract(store, other, image_folder(root), dataset_id="d2", num_workers=0, progress=False)
    extract(store, other, image_folder(root), dataset_id="d2", model_id="resnet-seed1", num_workers=0, progress=False)
    assert store.exists("resnet-seed1", "d2")


def test_everything_unreadable_is_an_error(tmp_path):
    root = write_images(tmp_path / "d", {}, corrupt=["a/1.png", "a/2.png"])
    backbone = load_timm("test_resnet", pretrained=False, image_size=32)
    report = extract(Store(tmp_path / "s"), backbone, image_folder(root), dataset_id="d", num_workers=0, progress=False)
    assert report.num_rows == 0 and len(report.skipped) == 2


KILLER = textwrap.dedent("""
    import os, signal, sys
    import oodbench.core.store as store_module
    limit = int(sys.argv[1])
    calls = {"n": 0}
    original = store_module.atomic_save_npy

    def save_then_die(path, array):
        calls["n"] += 1
        if calls["n"] > limit:
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-shard: some array files written, no done marker
        return original(path, array)

    store_module.atomic_save_npy = save_then_die
    import typer
    from oodbench.extract.cli import register
    app = typer.Typer()
    register(app)
    app(sys.argv[2:])
""")


def test_killed_extraction_resumes_to_identical_bytes(tmp_path):
    images = write_images(tmp_path / "imgs", {"a": 7, "b": 6}, corrupt=["b/zz.png"])
    args = [
        "extract",
        "--model",
        "test_resnet",
        "--no-pretrained",
        "--image-size",
        "32",
        "--data",
        str(images),
        "--batch-size",
        "2",
        "--shard-size",
        "4",
        "--workers",
        "0",
        "--no-progress",
        "--nac",
        "layer3:10",
    ]
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    # Same intra-op thread count as this process (the `one_thread` fixture): CPU kernels round per thread count.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    # 5 arrays per shard (features, logits, index, labels, NAC states): die after 2 shards and 2 files of the third.
    killed = subprocess.run(
        [sys.executable, str(script), "12", *args, "--store", str(tmp_path / "killed")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    shard_dir = tmp_path / "killed" / "test_resnet" / "imgs" / "shards"
    assert sorted(p.name for p in shard_dir.glob("*.done.json")) == ["00000.done.json", "00001.done.json"]
    assert len(list(shard_dir.glob("*.00002.npy"))) == 2
    assert not Store(tmp_path / "killed").exists("test_resnet", "imgs")
    resumed = _cli(*args, "--store", str(tmp_path / "killed"))
    assert resumed.exit_code == 0, resumed.output
    clean = _cli(*args, "--store", str(tmp_path / "clean"))
    assert clean.exit_code == 0, clean.output
    a, b = tmp_path / "killed" / "test_resnet" / "imgs", tmp_path / "clean" / "test_resnet" / "imgs"
    names = sorted(p.name for p in b.glob("*.npy"))
    assert names == ["extra.nac.layer3.npy", "features.npy", "index.npy", "labels.npy", "logits.npy"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    meta_a, meta_b = (json.loads((d / "meta.json").read_text()) for d in (a, b))
    assert meta_a["skipped"] == meta_b["skipped"] and len(meta_a["skipped"]) == 1
    assert not (a / "shards").exists()


def test_oodbench_evaluate_consumes_extracted_entries(tmp_path):
    from oodbench.cli.main import app

    fit = write_images(tmp_path / "fit", {"a": 6, "b": 6}, seed=3)
    test = write_images(tmp_path / "test", {"a": 4, "b": 4}, seed=4)
    ood = write_images(tmp_path / "ood", {"noise": 6}, size=(50, 20), seed=5)
    store = str(tmp_path / "store")
    common = [
        "--model",
        "test_efficientnet",
        "--no-pretrained",
        "--image-size",
        "32",
        "--store",
        store,
        "--workers",
        "0",
        "--no-progress",
    ]
    runner = CliRunner()
    for path, extra in [(fit, []), (test, []), (ood, ["--no-labels"])]:
        result = runner.invoke(app, ["extract", *common, "--data", str(path), *extra])
        assert result.exit_code == 0, result.output
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--store",
            store,
            "--model",
            "test_efficientnet",
            "--fit",
            "fit",
            "--id",
            "test",
            "--ood",
            "ood",
            "-d",
            "msp,energy,maha",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "msp" in result.output and "maha" in result.output
    run = tmp_path / "run"
    reported = reference.run_results(run)
    assert {(d, o) for d, o, _ in reported} == {(d, "ood") for d in ("msp", "energy", "maha")}
    # The same numbers by the library's path from the same store entries (the CLI adds only plumbing).
    direct = evaluate_store(
        store, "test_efficientnet", "fit", "test", ["ood"], ["msp", "energy", "maha"], progress=False
    )
    np.testing.assert_equal(reported, {(r.detector, r.ood_dataset, r.metric): r.value for r in direct.rows})
    # And from the definitions: MSP and energy of the stored logits, and the AUROC of the scores the run saved.
    entries = Store(store)
    for name, definition in (("msp", reference.msp), ("energy", reference.energy)):
        saved = {ds: reference.run_scores(run, ds)[name] for ds in ("test", "ood")}
        for ds, scores in saved.items():
            logits = entries.read("test_efficientnet", ds).logits
            np.testing.assert_allclose(scores, definition(logits), rtol=reference.SCORE_RTOL)
        expected = reference.auroc(saved["test"], saved["ood"])
        assert reported[(name, "ood", "auroc")] == pytest.approx(expected, abs=reference.AUROC_ABS)
