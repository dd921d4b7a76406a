"""`oodbench rehearse make-root`: the rehearsal data root has the registry's folders, the official lists' file
names and the published sizes; its images are determined by their paths; its defects are what they claim; a
second run writes nothing and a damaged file is rewritten."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from oodbench.cli.main import app
from oodbench.core.errors import DataError
from oodbench.extract import dataset_registry, rehearsal
from oodbench.extract.datasets import UnreadableImage, imagenet, load_rgb

from .helpers import shared_lists

LISTS = shared_lists()
needs_lists = pytest.mark.skipif(LISTS is None, reason="the official image lists are in ../shared, absent here")


def test_train_counts_sum_to_the_published_size_and_scale_by_the_running_total() -> None:
    full = rehearsal._train_counts(1.0)
    assert len(full) == 1000 and sum(full) == dataset_registry.get("imagenet-1k-train").expected_count == 1_281_167
    assert set(full) == {1281, 1282}
    for scale in (0.1, 0.01, 1 / 1000):
        scaled = rehearsal._train_counts(scale)
        assert sum(scaled) == int(np.floor(1_281_167 * scale))  # the running total's last floor
        assert min(scaled) >= 1  # 1,281 * scale >= 1.28: every class keeps a file


def test_by_group_keeps_folders_in_proportion() -> None:
    files = [f"c{c}/{k}.jpg" for c in range(4) for k in range(10)]
    kept = rehearsal._by_group(files, 0.25)
    assert len(kept) == 10 and kept[:2] == ["c0/0.jpg", "c0/1.jpg"]  # floor(10*.25)=2, floor(20*.25)-2=3, ...
    assert [sum(f.startswith(f"c{c}/") for f in kept) for c in range(4)] == [2, 3, 2, 3]
    assert rehearsal._by_group(["a.jpg", "b.jpg"], 0.01) == ["a.jpg"]  # at least one file


def test_pixels_come_from_the_path_and_a_wrong_image_is_detected(tmp_path) -> None:
    a, b = "ood/species/species_000/000_000.jpg", "ood/species/species_000/000_001.jpg"
    assert rehearsal.image_bytes(a) == rehearsal.image_bytes(a)
    assert not np.array_equal(rehearsal.expected_pixels(a), rehearsal.expected_pixels(b))
    for name in (a, "ood/x/y.png"):
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(rehearsal.image_bytes(name))
        assert rehearsal.image_matches(path, name)
        assert not rehearsal.image_matches(path, b)
    png = tmp_path / "p.png"
    png.write_bytes(rehearsal.image_bytes("ood/x/y.png"))
    assert Image.open(png).format == "PNG"  # PNG for .png names, JPEG otherwise


def test_defect_bytes_are_what_they_claim(tmp_path) -> None:
    def opened(kind: str, name: str = "ood/d/f.jpg") -> Image.Image:
        path = tmp_path / f"{kind}.bin"
        path.write_bytes(rehearsal.image_bytes(name, kind))
        return Image.open(path)

    assert opened("cmyk-jpeg").mode == "CMYK"
    assert opened("grey-png", "ood/d/f.png").mode == "L"
    assert opened("png16", "ood/d/f.png").mode.startswith("I")
    assert opened("exif-rotated").getexif()[0x0112] == 6
    assert rehearsal.image_bytes("x.jpg", "zero-byte") == b""
    for kind in ("truncated-jpeg", "html", "zero-byte"):
        path = tmp_path / f"{kind}.jpg"
        path.write_bytes(rehearsal.image_bytes("ood/d/f.jpg", kind))
        with pytest.raises(UnreadableImage):
            load_rgb(path)
    with pytest.raises(DataError, match="unknown rehearsal file kind"):
        rehearsal.image_bytes("x.jpg", "nonsense")


@needs_lists
def test_plan_pins_every_set_to_the_registry_at_full_size() -> None:
    """Full size: each OOD set (Table 3) and clean sub-sample (Table A3) has its published count of files, in one of
    the registry's candidate folders; val has 50,000 in its shipped class folders."""
    plan = rehearsal.plan_root(lists=LISTS, sets=[s for s in rehearsal.ROOT_SETS if s != "imagenet-1k-train"])
    by_name = {p.name: p for p in plan.sets}
    expected = {name for name in dataset_registry.names("ood") if name != "fi-imagenet-1k"} | {"imagenet-1k-val"}
    assert set(by_name) == expected
    for name, set_plan in by_name.items():
        entry = dataset_registry.get(name)
        assert len(set_plan.files) == set_plan.listed == entry.expected_count, name
        assert len(set(set_plan.files)) == len(set_plan.files), name
        assert any(f"ood/{folder}" == set_plan.folder or f"imagenet/{folder.split('/')[-1]}" == set_plan.folder
                   for folder in entry.folders), (name, set_plan.folder)  # fmt: skip
    assert sum(1 for p in plan.sets if p.name.endswith("-clean")) == 11
    fi = [plan.texts[f"fi-imagenet-1k/{f}"].split() for f in rehearsal.FI_FILES]
    assert [len(names) for names in fi] == [655, 980] and not set(fi[0]) & set(fi[1])
    assert len(plan.texts["ood/imagenetood.txt"].split("\n")) - 1 == 31_802
    assert {kind for kind in plan.defects.values()} == set(rehearsal.DEFECTS)


@needs_lists
def test_make_root_writes_a_root_the_registry_reads_and_resumes(tmp_path) -> None:
    root = tmp_path / "root"
    sets = ["imagenet-val", "openimage-o", "ninco", "species", "clean-ood", "imagenet-ood"]
    lines: list[str] = []
    report = rehearsal.make_root(root, lists=LISTS, sets=sets, fraction=0.01, workers=1, progress=lines.append)
    assert report.written == report.files and lines[0].startswith("make-root:")
    manifest = json.loads(report.manifest.read_text())
    ood = root / "ood"
    statuses = {
        s.name: s
        for s in dataset_registry.check(ood, lists=root / "imagelists", datasets=["openimage-o", "ninco", "clean-ood"])
    }
    for name in ("openimage-o", "ninco", "clean-ood"):
        status = statuses[name]
        assert status.official_list == "not used" and status.missing_images == 0  # the subset list <name>.txt
        assert status.present == manifest["sets"][name]["files"]
    assert statuses["openimage-o"].extra == 2 and statuses["ninco"].extra == 1  # files beside a list, ignored
    val = imagenet(root / "imagenet" / "val", split="val")
    assert len(val) == manifest["sets"]["imagenet-1k-val"]["files"] == 500
    relative = f"imagenet/val/{val.items[10]}"
    assert rehearsal.image_matches(val.path(10), relative) and not rehearsal.image_matches(val.path(11), relative)
    for defect in manifest["defects"]:
        path = root / defect["path"]
        if defect["kind"] in ("truncated-jpeg", "zero-byte", "html"):
            with pytest.raises(UnreadableImage):
                load_rgb(path)
        else:
            load_rgb(path)
    assert (root / "imagelists" / "openimage_o.txt").read_bytes() == (LISTS / "openimage_o.txt").read_bytes()
    again = rehearsal.make_root(root, lists=LISTS, sets=sets, fraction=0.01, workers=1, progress=lines.append)
    assert (again.written, again.present) == (0, report.files)
    damaged = val.path(10)
    damaged.write_bytes(damaged.read_bytes()[:20])
    third = rehearsal.make_root(root, lists=LISTS, sets=sets, fraction=0.01, workers=2, progress=lines.append)
    assert third.written == 1 and rehearsal.image_matches(damaged, relative)


def test_make_root_refuses_bad_input(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        rehearsal.plan_root(lists=tmp_path / "absent")
    with pytest.raises(DataError, match=r"must lie in \(0, 1\]"):
        rehearsal.plan_root(lists=tmp_path, scale=0)
    with pytest.raises(DataError, match="no rehearsal set 'nope'"):
        rehearsal.plan_root(lists=tmp_path, sets=["nope"])
    result = CliRunner().invoke(
        app, ["rehearse", "make-root", str(tmp_path / "r"), "--lists", str(tmp_path), "--fraction", "2"]
    )
    assert result.exit_code == 2 and "must lie in (0, 1]" in result.output


@needs_lists
def test_make_root_command(tmp_path) -> None:
    args = ["rehearse", "make-root", str(tmp_path / "r"), "--lists", str(LISTS), "--sets", "ninco"]
    result = CliRunner().invoke(app, [*args, "--fraction", "0.01", "--workers", "1"])
    assert result.exit_code == 0, result.output
    count = rehearsal.plan_root(lists=LISTS, sets=["ninco"], fraction=0.01).count()
    assert f"{count:,} files under" in result.output
    assert (tmp_path / "r" / "rehearsal.json").is_file()


@needs_lists
def test_a_small_fraction_keeps_every_clean_sub_sample() -> None:
    """0.5 % of Places-clean's 153 images is none; each of the 11 sub-samples is a set, so each keeps a file."""
    plan = rehearsal.plan_root(lists=LISTS, sets=["clean-ood"], fraction=0.005)
    clean = [p for p in plan.sets if p.name.endswith("-clean")]
    assert len(clean) == 11 and all(p.files for p in clean)
    assert all(plan.texts[p.subset_list].strip() for p in clean if p.subset_list)


def test_synsets_are_timms_class_order() -> None:
    """make-root reads the 1000 synsets from the shipped val index (no torch import); they are timm's, in order."""
    from oodbench.extract.datasets import imagenet_synsets

    assert rehearsal._synsets() == list(imagenet_synsets())
