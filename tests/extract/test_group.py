"""One decode for several models: byte-identical to extracting each alone, resumable per model (also after SIGKILL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from oodbench.core.errors import ExtractError
from oodbench.core.store import Store
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import image_folder
from oodbench.extract.openclip import OpenClipBackbone, load_openclip
from oodbench.extract.pipeline import GroupMember, extract, extract_group

from .helpers import write_images

ROOT = Path(__file__).resolve().parents[2]


def write_photos(root: Path) -> Path:
    """scikit-image's photos as JPEG (RGB and grey, two qualities), PNG and CMYK JPEG, plus one corrupt file."""
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image

    (root / "photos").mkdir(parents=True)
    for i, name in enumerate(("chelsea", "coffee", "rocket", "astronaut", "camera", "immunohistochemistry")):
        image = Image.fromarray(np.asarray(getattr(skimage_data, name)()))
        image.save(root / "photos" / f"{name}.jpg", quality=90 - 10 * (i % 2))
    Image.fromarray(np.asarray(skimage_data.coffee())).save(root / "photos" / "coffee.png")
    Image.fromarray(np.asarray(skimage_data.chelsea())).convert("CMYK").save(root / "photos" / "chelsea_cmyk.jpg")
    (root / "photos" / "truncated.jpg").write_bytes((root / "photos" / "rocket.jpg").read_bytes()[:600])
    return root


def write_jpegs(root: Path, count: int, *, seed: int = 0) -> Path:
    """Generated JPEGs of varied sizes (smooth gradients plus noise, so they compress like photos)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = root / "gen"
    folder.mkdir(parents=True)
    for i in range(count):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=85)
    return folder


def three_models(tiny_clip: str) -> list[tuple]:
    """(backbone, batch size) of three tiny models: three resolutions, three interpolations, three libraries' transforms."""
    resnet = load_timm(
        "test_resnet", pretrained=False, image_size=32, preprocessing={"crop_pct": 0.9}, nac_layers=["layer3:10"]
    )
    effnet = load_timm(
        "test_efficientnet", pretrained=False, seed=1, image_size=40, preprocessing={"interpolation": "nearest"}
    )
    clip = OpenClipBackbone(load_openclip(tiny_clip, None, seed=2), patches=True)
    return [(resnet, 3), (effnet, 2), (clip, 4)]


def entry_files(store: Store, model_id: str, dataset_id: str) -> dict[str, bytes]:
    entry = store.entry_path(model_id, dataset_id)
    return {p.name: p.read_bytes() for p in sorted(entry.glob("*.npy"))}


def assert_same_entries(a: Store, b: Store, model_ids: list[str], dataset_id: str) -> None:
    for model_id in model_ids:
        files_a, files_b = entry_files(a, model_id, dataset_id), entry_files(b, model_id, dataset_id)
        assert files_a.keys() == files_b.keys() and "features.npy" in files_a, model_id
        for name in files_a:
            assert files_a[name] == files_b[name], (model_id, name)
        meta_a, meta_b = a.meta(model_id, dataset_id), b.meta(model_id, dataset_id)
        assert meta_a["skipped"] == meta_b["skipped"]
        assert meta_a["provenance"] == meta_b["provenance"]


@pytest.mark.parametrize("which", ["photos", "jpegs"])
def test_group_equals_separate_extractions(tmp_path, tiny_clip, which):
    root = write_photos(tmp_path) / "photos" if which == "photos" else write_jpegs(tmp_path, 11)
    dataset = image_folder(root, labels=False)
    models = three_models(tiny_clip)
    separate, grouped = Store(tmp_path / "separate"), Store(tmp_path / "grouped")
    for backbone, batch in models:
        extract(
            separate, backbone, dataset, dataset_id="d", batch_size=batch, shard_size=5, num_workers=0, progress=False
        )
    reports = extract_group(
        grouped,
        [GroupMember(backbone, None, batch) for backbone, batch in models],
        dataset,
        dataset_id="d",
        shard_size=5,
        num_workers=2,
        progress=False,
    )
    ids = [r.model_id for r in reports]
    assert ids == ["test_resnet", "test_efficientnet", f"{tiny_clip}"]
    assert_same_entries(separate, grouped, ids, "d")
    # The three resolutions really differ, and the NAC states and patch embeddings came through the group too.
    names = {i: set(entry_files(grouped, i, "d")) for i in ids}
    assert "extra.nac.layer3.npy" in names["test_resnet"] and "extra.patch_embeddings.npy" in names[tiny_clip]
    if which == "photos":
        skipped = grouped.meta("test_resnet", "d")["skipped"]
        assert [s["path"] for s in skipped] == ["truncated.jpg"]
        assert reports[0].num_rows == len(dataset) - 1
    assert reports[0].decode == {
        "device": 0,
        "pil": len(dataset) - (which == "photos"),
        "unreadable": which == "photos",
    }
    assert grouped.has_head("test_resnet") and grouped.has_head("test_efficientnet")


def test_group_resumes_each_model_at_its_own_shards(tmp_path, tiny_clip):
    dataset = image_folder(write_jpegs(tmp_path, 13), labels=False)
    models = three_models(tiny_clip)
    reference = Store(tmp_path / "reference")
    for backbone, batch in models:
        extract(
            reference, backbone, dataset, dataset_id="d", batch_size=batch, shard_size=4, num_workers=0, progress=False
        )
    store = Store(tmp_path / "store")
    # The first model is complete, the second has two of its four shards, the third none.
    extract(store, models[0][0], dataset, dataset_id="d", batch_size=3, shard_size=4, num_workers=0, progress=False)
    writer = store.writer(
        "test_efficientnet",
        "d",
        provenance=models[1][0].provenance(),
        num_items=len(dataset),
        shard_size=4,
        item_hash=dataset.item_hash(),
    )
    done = reference.read("test_efficientnet", "d")
    for shard in (0, 2):
        rows = writer.shard_rows(shard)
        arrays = {
            "features": done.features[rows],
            "logits": done.logits[rows],
            "index": np.arange(rows.start, rows.stop),
        }
        writer.write_shard(shard, arrays)
    reports = extract_group(
        store,
        [GroupMember(b, None, n) for b, n in models],
        dataset,
        dataset_id="d",
        shard_size=4,
        num_workers=0,
        progress=False,
    )
    assert [r.processed for r in reports] == [0, 5, 13]  # shards 1 and 3 (4 + 1 images) for the second model
    assert_same_entries(reference, store, [r.model_id for r in reports], "d")


def test_group_refuses_bad_input_before_writing(tmp_path, tiny_clip):
    dataset = image_folder(write_jpegs(tmp_path, 3), labels=False)
    resnet = load_timm("test_resnet", pretrained=False, image_size=32)
    store = Store(tmp_path / "store")
    with pytest.raises(ExtractError, match="appears twice"):
        extract_group(store, [GroupMember(resnet), GroupMember(resnet)], dataset, dataset_id="d", progress=False)
    with pytest.raises(ExtractError, match="must be positive"):
        extract_group(store, [GroupMember(resnet, batch_size=0)], dataset, dataset_id="d", progress=False)
    with pytest.raises(ExtractError, match="autocast dtype"):
        extract_group(store, [GroupMember(resnet)], dataset, dataset_id="d", amp_dtype="fp8", progress=False)
    extract(store, resnet, dataset, dataset_id="d", num_workers=0, progress=False)
    other = load_timm("test_resnet", pretrained=False, seed=5, image_size=32)
    effnet = load_timm("test_efficientnet", pretrained=False, image_size=32)
    with pytest.raises(ExtractError, match="pass another --model-id"):
        extract_group(store, [GroupMember(effnet), GroupMember(other)], dataset, dataset_id="e", progress=False)
    assert not (store.root / "test_efficientnet").exists()  # nothing written for the model that was valid


KILLER = textwrap.dedent("""
    import os, signal, sys
    import open_clip
    import oodbench.core.store as store_module
    open_clip.add_model_config(sys.argv[2])
    limit = int(sys.argv[1])
    calls = {"n": 0}
    original = store_module.atomic_save_npy

    def save_then_die(path, array):
        calls["n"] += 1
        if calls["n"] > limit:
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-shard of one model, after whole shards of others
        return original(path, array)

    store_module.atomic_save_npy = save_then_die
    import typer
    from oodbench.extract.cli import register
    app = typer.Typer()
    register(app)
    app(sys.argv[3:])
""")


def test_killed_group_resumes_each_model_to_identical_bytes(tmp_path, tiny_clip):
    import open_clip

    from oodbench.extract.cli import register

    config = Path(open_clip.factory._MODEL_CONFIG_PATHS[-1])
    config = config if config.suffix == ".json" else config / f"{tiny_clip}.json"
    images = write_images(tmp_path / "imgs", {"a": 7, "b": 6}, size=(40, 52), corrupt=["b/zz.png"])
    models = ["--model", "test_resnet", "--model", "test_efficientnet", "--model", tiny_clip]
    args = [*models, "--no-pretrained", "--image-size", "36", "--data", str(images), "--batch-size", "2"]
    args += ["--shard-size", "4", "--workers", "0", "--no-progress", "--patches"]
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    # Per shard each model writes 4 arrays (features, logits or patch embeddings, index, labels). Die after shard 0
    # of all three (12 files), shard 1 of test_resnet (4) and 2 files of test_efficientnet's shard 1.
    killed = subprocess.run(
        [sys.executable, str(script), "18", str(config), "extract", *args, "--store", str(tmp_path / "killed")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr

    def done(model: str) -> list[str]:
        return sorted(p.name[:5] for p in (tmp_path / "killed" / model / "imgs" / "shards").glob("*.done.json"))

    assert done("test_resnet") == ["00000", "00001"]
    assert done("test_efficientnet") == ["00000"] and done(tiny_clip) == ["00000"]
    assert len(list((tmp_path / "killed" / "test_efficientnet" / "imgs" / "shards").glob("*.00001.npy"))) == 2
    import typer

    app = typer.Typer()
    register(app)
    runner = CliRunner()
    resumed = runner.invoke(app, ["extract", *args, "--store", str(tmp_path / "killed")])
    assert resumed.exit_code == 0, resumed.output
    clean = Store(tmp_path / "clean")
    for model in ("test_resnet", "test_efficientnet", tiny_clip):  # each model alone, the reference
        alone = [a for a in args if a not in models[1::2]]
        alone = ["--model", model] + [a for a in alone if a != "--model"]
        if model != tiny_clip:
            alone = [a for a in alone if a != "--patches"]
        else:
            at = alone.index("--image-size")
            alone = alone[:at] + alone[at + 2 :]
        result = runner.invoke(app, ["extract", *alone, "--store", str(clean.root)])
        assert result.exit_code == 0, result.output
    killed_store = Store(tmp_path / "killed")
    assert_same_entries(killed_store, clean, ["test_resnet", "test_efficientnet", tiny_clip], "imgs")
    assert len(killed_store.meta("test_resnet", "imgs")["skipped"]) == 1
    meta = json.loads((tmp_path / "killed" / tiny_clip / "imgs" / "meta.json").read_text())
    assert "runtime" not in meta["provenance"]  # the default CPU path records nothing new


def test_models_with_one_preprocessing_share_the_transform(tmp_path):
    from oodbench.extract.decode import GroupLoader, transform_key

    dataset = image_folder(write_jpegs(tmp_path, 7), labels=False)
    a = load_timm("test_resnet", pretrained=False, image_size=32)
    b = load_timm("test_efficientnet", pretrained=False, image_size=32, preprocessing={"interpolation": "bilinear"})
    c = load_timm("test_resnet", pretrained=False, seed=3, image_size=32)
    d = load_timm("test_resnet", pretrained=False, image_size=32, preprocessing={"crop_pct": 0.8})
    assert transform_key(a.transform) == transform_key(c.transform) != transform_key(d.transform)
    assert a.preprocessing == c.preprocessing and b.preprocessing["interpolation"] == "bilinear"
    loader = GroupLoader(dataset, [a.transform, b.transform, c.transform, d.transform], "pil")
    # test_efficientnet's data config differs (ImageNet mean/std) from test_resnet's, so only a and c share
    assert loader.same_as == [0, 1, 0, 3]
    assert transform_key(lambda image: image) != transform_key(lambda image: image)  # unknown callables never share
    separate, grouped = Store(tmp_path / "separate"), Store(tmp_path / "grouped")
    members = [GroupMember(a, "a", 3), GroupMember(b, "b", 2), GroupMember(c, "c", 3), GroupMember(d, "d", 4)]
    for m in members:
        extract(separate, m.backbone, dataset, dataset_id="x", model_id=m.model_id, batch_size=m.batch_size,
                shard_size=4, num_workers=0, progress=False)  # fmt: skip
    extract_group(grouped, members, dataset, dataset_id="x", shard_size=4, num_workers=0, progress=False)
    assert_same_entries(separate, grouped, ["a", "b", "c", "d"], "x")


def test_memory_estimate_and_first_fit_packing():
    from oodbench.extract.passes import ACTIVATION_FACTOR, Footprint, footprint_of, pack_passes

    small = Footprint(1_000_000, (3, 224, 224), 64)
    weights, activations = 4 * 1_000_000 * 1.2, 4 * ACTIVATION_FACTOR * 64 * 3 * 224 * 224
    assert small.nbytes == int(weights + activations)
    assert Footprint(1_000_000, (3, 224, 224), 64, gradients=True).nbytes == int(weights + 3 * activations)
    # First fit in order; a model too large for the budget, or of unknown size, runs alone.
    assert pack_passes([4, 3, 5, 2, 11, None, 1], budget=10) == [[0, 1, 3, 6], [2], [4], [5]]
    assert pack_passes([6, 6, 6], budget=10) == [[0], [1], [2]]
    assert pack_passes([], budget=10) == []
    resnet = load_timm("test_resnet", pretrained=False, image_size=32, nac_layers=["layer3:10"])
    found = footprint_of(resnet, 8)
    assert found == Footprint(sum(p.numel() for p in resnet.model.parameters()), (3, 32, 32), 8, gradients=True)


def test_group_with_the_default_worker_count_runs(tmp_path, monkeypatch):
    """`engine.workers` unset reaches the group engine as None: it takes the local engine's default, as `extract`."""
    import oodbench.extract.engines.local as local

    monkeypatch.setattr(local, "available_cores", lambda: 2)  # one loader worker, whatever this machine has
    dataset = image_folder(write_jpegs(tmp_path, 6), labels=False)
    resnet = load_timm("test_resnet.r160_in1k", pretrained=False)
    store = Store(tmp_path / "store")
    reports = extract_group(
        store, [GroupMember(resnet, None, 4)], dataset, dataset_id="d", num_workers=None, progress=False
    )
    assert reports[0].num_rows == 6


def test_model_threads_leave_the_loader_workers_their_cores(monkeypatch):
    import torch

    import oodbench.extract.engines.local as local

    monkeypatch.setattr(local, "available_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with local.model_threads(torch.device("cpu"), 1) as threads:
            assert threads == 1 and torch.get_num_threads() == 1  # two cores: one for the worker, one for the model
        assert torch.get_num_threads() == 2
        with local.model_threads(torch.device("cpu"), 0):
            assert torch.get_num_threads() == 2  # no workers: the model keeps every thread
        with local.model_threads(torch.device("cuda"), 1):
            assert torch.get_num_threads() == 2  # a GPU model: the CPU threads are not its bottleneck
    finally:
        torch.set_num_threads(before)
