"""Datasets: image folders, file lists, ImageNet layouts, the dataset registry and `oodbench datasets check`."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import DataError
from oodbench.extract import dataset_registry
from oodbench.extract.cli import register
from oodbench.extract.datasets import UnreadableImage, file_list, image_folder, imagenet, imagenet_synsets, load_rgb

from .helpers import write_images


def test_image_folder_labels_follow_sorted_class_folders(tmp_path):
    root = write_images(tmp_path / "d", {"zebra": 2, "ant": 3})
    data = image_folder(root)
    assert data.class_names == ("ant", "zebra")
    assert data.items[:3] == ("ant/img000.png", "ant/img001.png", "ant/img002.png")
    assert data.labels.tolist() == [0, 0, 0, 1, 1]
    assert data.path(3) == root / "zebra" / "img000.png"
    assert image_folder(root, labels=False).labels is None


def test_flat_folder_is_unlabelled_and_recursive(tmp_path):
    root = write_images(tmp_path / "d", {"": 0})
    write_images(root, {".": 2})
    write_images(root / "deeper", {"x": 1})
    data = image_folder(root)
    assert data.labels is None
    assert data.items == ("img000.png", "img001.png", "deeper/x/img000.png")


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        image_folder(tmp_path / "empty")


def test_csv_list_with_header_and_synsets(tmp_path):
    (tmp_path / "list.csv").write_text("label,path\nn01440764,a.jpg\nn01443537,sub/b.jpg\n")
    data = file_list(tmp_path / "list.csv")
    assert data.items == ("a.jpg", "sub/b.jpg")
    assert data.labels.tolist() == [0, 1]
    assert data.class_names[0] == "n01440764"
    assert data.root == tmp_path


def test_csv_and_txt_lists_without_header(tmp_path):
    (tmp_path / "l.csv").write_text("x/a.png,3\nx/b.png,7\n")
    assert file_list(tmp_path / "l.csv").labels.tolist() == [3, 7]
    (tmp_path / "l.txt").write_text("# comment\nimages/a file.png 2\n\nimages/b.png 0\n")
    data = file_list(tmp_path / "l.txt", root=tmp_path / "elsewhere")
    assert data.items == ("images/a file.png", "images/b.png")
    assert data.labels.tolist() == [2, 0]
    assert data.root == tmp_path / "elsewhere"
    (tmp_path / "n.txt").write_text("a.png\nb.png\n")
    assert file_list(tmp_path / "n.txt").labels is None


def test_list_errors_name_the_problem(tmp_path):
    (tmp_path / "mixed.csv").write_text("path,label\na.png,1\nb.png,\n")
    with pytest.raises(DataError, match="no label while others do"):
        file_list(tmp_path / "mixed.csv")
    (tmp_path / "words.csv").write_text("path,label\na.png,cat\n")
    with pytest.raises(DataError, match="neither an integer"):
        file_list(tmp_path / "words.csv")
    (tmp_path / "bad.csv").write_text("file,kind\na.png,cat\n")
    with pytest.raises(DataError, match="header naming a 'path'"):
        file_list(tmp_path / "bad.csv")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9.png\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt is not UTF-8 text \(byte 3"):
        file_list(tmp_path / "latin1.txt")


def test_imagenet_synset_folders_and_validation_order(tmp_path):
    synsets = imagenet_synsets()
    assert len(synsets) == 1000 and synsets[0] == "n01440764" and synsets[-1] == "n15075141"
    val = tmp_path / "imagenet" / "val"
    from PIL import Image

    for synset, number in [(synsets[5], 3), (synsets[0], 2), (synsets[5], 1)]:
        (val / synset).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(val / synset / f"ILSVRC2012_val_{number:08d}.JPEG")
    data = imagenet(tmp_path / "imagenet", split="val")
    assert [item.split("/")[1] for item in data.items] == [f"ILSVRC2012_val_{n:08d}.JPEG" for n in (1, 2, 3)]
    assert data.labels.tolist() == [5, 0, 5]
    assert len(data.class_names) == 1000


def test_imagenet_flat_val_with_solution_file(tmp_path):
    from PIL import Image

    val = tmp_path / "val"
    val.mkdir()
    for number in (2, 1):
        Image.new("RGB", (8, 8)).save(val / f"ILSVRC2012_val_{number:08d}.JPEG")
    (tmp_path / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\nILSVRC2012_val_00000001,n01443537 1 2 3 4\nILSVRC2012_val_00000002,n01440764 1 2 3 4\n"
    )
    data = imagenet(tmp_path, split="val")
    assert data.items == ("ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000002.JPEG")
    assert data.labels.tolist() == [1, 0]
    with pytest.raises(DataError, match="synset"):
        imagenet(tmp_path / "val", split="train")


def test_load_rgb_reports_corrupt_and_converts_modes(tmp_path):
    from PIL import Image

    Image.new("L", (5, 4), 7).save(tmp_path / "gray.png")
    Image.new("CMYK", (5, 4)).save(tmp_path / "cmyk.jpg")
    assert load_rgb(tmp_path / "gray.png").mode == "RGB"
    assert load_rgb(tmp_path / "cmyk.jpg").size == (5, 4)
    (tmp_path / "trunc.png").write_bytes((tmp_path / "gray.png").read_bytes()[:30])
    with pytest.raises(UnreadableImage):
        load_rgb(tmp_path / "trunc.png")
    with pytest.raises(UnreadableImage, match="No such file|FileNotFound"):
        load_rgb(tmp_path / "missing.png")


def test_registry_lists_the_seed_sets():
    names = dataset_registry.names("ood")
    for expected in (
        "inat-ood-plants",
        "openimage-o",
        "360openset",
        "cood",
        "imagenet-o",
        "textures",
        "places",
        "ssb-easy",
        "ssb-hard",
        "species",
        "in1k-ood",
        "ninco",
        "clean-ood",
        "imagenet-ood",
        "fi-imagenet-1k",
    ):
        assert expected in names
    assert dataset_registry.get("NINCO").expected_count == 5879
    with pytest.raises(DataError, match="unknown dataset"):
        dataset_registry.get("cifar10")


def _fake_root(tmp_path):
    """Sets without an official list: 360OpenSet as a folder (3 images), ImageNet-O as a folder plus a user list."""
    root = tmp_path / "data"
    write_images(root / "360OpenSet", {"a": 2, "b": 1})
    write_images(root / "imagenet-o", {"n01443537": 3})
    (root / "imagenet-o.txt").write_text("n01443537/img000.png\nn01443537/img002.png\n")
    write_images(root / "NINCO" / "NINCO_OOD_classes", {"a": 2})  # no lists folder given: every image under it
    return root


def test_check_reports_present_missing_and_mismatched(tmp_path):
    root = _fake_root(tmp_path)
    report = {s.name: s for s in dataset_registry.check(root)}
    assert report["360openset"].status == "count mismatch" and report["360openset"].found == 3
    assert report["360openset"].listed is None and "11,800 published" in report["360openset"].message
    imagenet_o = report["imagenet-o"]  # a user's list selects within the folder: 2 listed, 1 extra file ignored
    assert (imagenet_o.listed, imagenet_o.present, imagenet_o.missing_images, imagenet_o.extra) == (2, 2, 0, 1)
    assert imagenet_o.status == "count mismatch" and imagenet_o.path.endswith("imagenet-o.txt")
    ninco = report["ninco"]
    assert ninco.status == "count mismatch" and (ninco.found, ninco.listed, ninco.official_list) == (2, None, "missing")
    assert ninco.path.endswith("NINCO_OOD_classes") and "official list NINCO_OOD_classes.csv missing" in ninco.message
    assert report["textures"].status == "missing" and report["textures"].found is None
    data = dataset_registry.open_registered("360openset", root)
    assert len(data) == 3 and data.labels is None and data.source["registry"] == "360openset"
    listed = dataset_registry.open_registered("imagenet-o", root)
    assert listed.items == ("n01443537/img000.png", "n01443537/img002.png") and listed.source["ignored"] == 1
    assert dataset_registry.open_registered("ninco", root).source["absent_list"].startswith("official list")


def test_check_verify_finds_unreadable(tmp_path):
    root = tmp_path / "data"
    write_images(root / "dtd" / "images", {"banded": 2}, corrupt=["banded/zz.jpg"])
    (status,) = dataset_registry.check(root, datasets=["textures"], verify=True)
    assert status.found == 3 and len(status.unreadable) == 1 and "zz.jpg" in status.unreadable[0]


def test_datasets_cli(tmp_path):
    root = _fake_root(tmp_path)
    (root / "exact.txt").write_text("n01443537/img000.png\nn01443537/img001.png\n")
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    runner = CliRunner()
    result = runner.invoke(
        app, ["datasets", "check", "--root", str(root), "--json", "--only", "360openset", "--only", "imagenet-o"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["status"] for r in rows] == ["count mismatch", "count mismatch"]
    given = runner.invoke(
        app,
        [
            "datasets",
            "check",
            "--root",
            str(root),
            "--json",
            "--only",
            "imagenet-o",
            "--list",
            f"imagenet-o={root / 'exact.txt'}",
        ],
    )
    (row,) = json.loads(given.stdout)
    assert row["image_list"] == f"given: {root / 'exact.txt'}" and row["extra_examples"] == ["n01443537/img002.png"]
    assert runner.invoke(app, ["datasets", "check", "--root", str(root), "--strict"]).exit_code == 1
    bad = runner.invoke(app, ["datasets", "check", "--root", str(root), "--list", "imagenet-o"])
    assert bad.exit_code == 2 and "NAME=FILE" in bad.output
    listing = runner.invoke(app, ["datasets", "list"])
    assert listing.exit_code == 0 and "ninco" in listing.stdout
    assert "Example" in runner.invoke(app, ["datasets", "check", "--help"]).stdout


def test_extract_a_registered_dataset(tmp_path):
    root = _fake_root(tmp_path)
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    result = CliRunner().invoke(
        app,
        [
            "extract",
            "--model",
            "test_resnet",
            "--no-pretrained",
            "--image-size",
            "32",
            "--store",
            str(tmp_path / "store"),
            "--dataset",
            "360openset",
            "--root",
            str(root),
            "--workers",
            "0",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    from oodbench import Store

    meta = Store(tmp_path / "store").meta("test_resnet", "360openset")
    assert meta["num_rows"] == 3 and "labels" not in meta["arrays"]
    assert meta["dataset"]["registry"] == "360openset" and meta["dataset"]["root"].endswith("360OpenSet")
    missing = CliRunner().invoke(
        app,
        [
            "extract",
            "--model",
            "test_resnet",
            "--no-pretrained",
            "--store",
            str(tmp_path / "store"),
            "--dataset",
            "textures",
            "--root",
            str(root),
        ],
    )
    assert missing.exit_code == 2 and "not found under" in missing.output
