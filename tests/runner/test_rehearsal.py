"""The small rehearsal: configs/fi-imagenet-1k.toml, unchanged but for its paths and a few of its models, runs its
extraction on a rehearsal root (`oodbench rehearse make-root`: real folders, real list file names, the fit set and
the test sets scaled down) with stand-in models (OODBENCH_STAND_INS=1). Every set is found and read, every defective
file is one line naming it, every row of every entry is the image its item names, and a rerun does nothing.
Needs the official image lists in ../shared (skips with one line without them)."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from oodbench import Store
from oodbench.cli.main import app
from oodbench.extract import rehearsal, stand_ins
from oodbench.extract.datasets import load_rgb

from ..extract.helpers import shared_lists, single_torch_thread
from .helpers import CONFIGS

LISTS = shared_lists()
pytestmark = pytest.mark.skipif(LISTS is None, reason="the official image lists are in ../shared, absent here")

# One model per route: a timm classifier, a probe's frozen timm backbone, an open_clip ViT, transformers' AIMv2.
MODELS = ("ResNet50", "DINOv2-g-14", "CLIP-B-16", "AIMv2-L")
SCALE, FRACTION = 1 / 500, 0.005  # 2,562 fit images (2 or 3 a class: the probe holds some out); 250 val images


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for these names
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    raise TypeError(value)


def models_override(ids: tuple[str, ...]) -> str:
    """`--set models=[...]`: the config's own model tables whose id is in `ids`, as they stand in the file."""
    raw = tomllib.loads((CONFIGS / "fi-imagenet-1k.toml").read_text(encoding="utf-8"))
    return "models=" + _toml([table for table in raw["models"] if table["id"] in ids])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rehearsal") / "root"
    rehearsal.make_root(folder, lists=LISTS, scale=SCALE, fraction=FRACTION, workers=2, progress=lambda line: None)
    return folder


def test_datasets_check_finds_every_set(root) -> None:
    result = CliRunner().invoke(
        app, ["datasets", "check", "--root", str(root / "ood"), "--lists", str(root / "imagelists"), "--json"]
    )
    assert result.exit_code == 0, result.output
    statuses = {s["name"]: s for s in json.loads(result.stdout)}
    manifest = json.loads((root / "rehearsal.json").read_text())
    for name, written in manifest["sets"].items():
        if name.startswith("imagenet-1k"):
            continue
        status = statuses[name]
        assert status["status"] == "count mismatch" and status["found"] == written["files"], name  # a fraction
        assert not status["missing_images"], name


def test_the_fi_config_extracts_the_rehearsal_root(root, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(stand_ins.ENV, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    paths = {"imagenet": root / "imagenet", "ood": root / "ood", "fi": root / "fi-imagenet-1k"}
    paths["lists"] = root / "imagelists"
    args = ["run", str(CONFIGS / "fi-imagenet-1k.toml"), "--out", str(tmp_path / "run"), "--only", "extract"]
    args += [f"--set=paths.{key}={value}" for key, value in paths.items()]
    args += [f"--set={models_override(MODELS)}", "--set=engine.workers=0", "--no-progress", "--device", "cpu"]
    with single_torch_thread():
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((root / "rehearsal.json").read_text())
    unreadable = [d["path"] for d in manifest["defects"] if d["kind"] in ("truncated-jpeg", "zero-byte", "html")]
    assert unreadable
    for path in unreadable:  # one line naming the file, in every pass that reads it, never none
        assert f"skipped {root / path}: " in result.output
    store = Store(tmp_path / "run" / "store")
    raw = tomllib.loads((CONFIGS / "fi-imagenet-1k.toml").read_text(encoding="utf-8"))
    expected = {raw["id"]["fit"], raw["id"]["test"], "imagenet-val", *raw["ood"]["datasets"]}
    val = json.loads((root / "rehearsal.json").read_text())["sets"]["imagenet-1k-val"]["files"]
    fi = [len((root / "fi-imagenet-1k" / f).read_text().split()) for f in rehearsal.FI_FILES]
    for model in ("ResNet50", "vit_giant_patch14_dinov2.lvd142m", "CLIP-B-16", "AIMv2-L"):
        datasets = set(store.datasets(model))
        wanted = expected - ({raw["id"]["fit"]} if model in ("CLIP-B-16", "AIMv2-L") else set())  # zero-shot: no fit
        assert datasets == wanted, (model, sorted(datasets ^ wanted))
        meta = store.meta(model, "imagenet-val")
        assert meta["num_items"] == val and meta["provenance"]["checkpoint"].startswith("stand-in:")
        assert {s["path"] for s in meta["skipped"]} == {p[len("imagenet/val/") :] for p in unreadable if "/val/" in p}
        derived = store.meta(model, "imagenet-val-fi-id")["num_items"]
        assert derived == val - sum(fi)  # the ID set: val minus the Fi lists' images
    # every row is the image its item names: recompute three rows of the timm model from the files
    from oodbench.extract.backbones.timm_backbone import load_timm

    backbone = load_timm("resnet50.a1_in1k")  # the stand-in again (OODBENCH_STAND_INS is set)
    items = (store.entry_path("ResNet50", "ninco") / "items.txt").read_text().splitlines()
    index = store.read_array("ResNet50", "ninco", "index")
    features = store.read_array("ResNet50", "ninco", "features")
    folder = root / "ood" / "NINCO" / "NINCO_OOD_classes"
    defects = {d["path"] for d in manifest["defects"]}
    for row in (0, len(index) // 2, len(index) - 1):
        item = items[int(index[row])]
        relative = f"ood/NINCO/NINCO_OOD_classes/{item}"
        assert relative in defects or rehearsal.image_matches(folder / item, relative)
        with single_torch_thread():
            expected = backbone.infer(torch.stack([backbone.transform(load_rgb(folder / item))]), amp=False)
        # the same float32 network on one image instead of a batch: other kernels, ≲ 100·eps32 relative
        np.testing.assert_allclose(features[row], expected["features"][0], rtol=1e-5, atol=1e-6)
    with single_torch_thread():
        again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "skipped /" not in again.output  # all cached: no image read again
