"""The OOD sets' published sizes (the paper's Table 3 and Table A3) and their official image lists.

No official list file is available offline (oodbench carries only their provenance), so these tests write small
synthetic files in each upstream format (NINCO's CSVs, SSB's JSON pair, ViM's OpenImage-O lines) and register their
checksums in place of the pinned ones."""

from __future__ import annotations

import csv
import hashlib
import http.server
import importlib.resources
import io
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import DataError
from oodbench.extract import dataset_registry, imagelists
from oodbench.extract.cli import register
from oodbench.extract.datasets import match_list

from .helpers import write_images

# Table 3 of the Fi-ImageNet-1k paper, column n (number of OOD images), copied from the paper's text.
TABLE_3 = {
    "inat-ood-plants": 10_000,
    "openimage-o": 17_632,
    "360openset": 11_800,
    "cood": 10_350,
    "imagenet-o": 2_000,
    "textures": 5_640,
    "places": 10_000,
    "ssb-easy": 50_000,
    "ssb-hard": 49_000,
    "species": 10_000,
    "in1k-ood": 50_000,
    "clean-ood": 2_715,
    "ninco": 5_879,
    "imagenet-ood": 31_802,
    "fi-imagenet-1k": 655,
}
# Table A3 of the paper, the second n column: the clean sub-sample NINCO released of each of the 11 datasets.
TABLE_A3_CLEAN = {
    "inat-ood-plants-clean": 383,
    "openimage-o-clean": 368,
    "360openset-clean": 236,
    "cood-clean": 212,
    "imagenet-o-clean": 309,
    "textures-clean": 288,
    "places-clean": 153,
    "ssb-easy-clean": 151,
    "ssb-hard-clean": 208,
    "species-clean": 172,
    "in1k-ood-clean": 235,
}
# The paper's printed dataset names (Tables 3 and A3) -> registry names.
PRINTED = {
    "iNat-OOD Plants": "inat-ood-plants",
    "OpenImage-O": "openimage-o",
    "360OpenSet": "360openset",
    "COOD": "cood",
    "ImageNet-O": "imagenet-o",
    "Textures": "textures",
    "Places": "places",
    "SSB easy": "ssb-easy",
    "SSB hard": "ssb-hard",
    "Species": "species",
    "IN1k-OOD": "in1k-ood",
    "CLEAN-OOD": "clean-ood",
    "NINCO": "ninco",
    "ImageNet-OOD": "imagenet-ood",
    "Fi-ImageNet-1k": "fi-imagenet-1k",
}
PAPER = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "000_f55e5cfaf4a4485f.txt"


def test_every_set_has_its_table_3_size():
    """Table 3 gives n for the 14 comparison sets and Fi-ImageNet-1k; ImageNet-OOD has 31,802 images, not 31,807."""
    for name, count in TABLE_3.items():
        entry = dataset_registry.get(name)
        assert (entry.expected_count, entry.table, entry.role) == (count, "Table 3", "ood"), name
    assert dataset_registry.get("imagenet-ood").expected_count == 31_802


def test_the_eleven_clean_subsamples_have_their_table_a3_sizes_and_make_clean_ood():
    """Table A3: NINCO's 11 cleaned sub-samples; CLEAN-OOD's n in Table 3 (2,715) is their sum."""
    for name, count in TABLE_A3_CLEAN.items():
        assert (dataset_registry.get(name).expected_count, dataset_registry.get(name).table) == (count, "Table A3")
    assert sum(TABLE_A3_CLEAN.values()) == TABLE_3["clean-ood"]


def test_sizes_agree_with_the_packaged_published_tables():
    """The tables `report --against` uses were transcribed separately: their n must be the registry's."""
    published = Path(str(importlib.resources.files("oodbench") / "data" / "published"))
    with open(published / "table3.csv", newline="", encoding="utf-8") as handle:
        table3 = {PRINTED[r["dataset"]]: int(r["value"]) for r in csv.DictReader(handle) if r["metric"] == "n"}
    assert table3 == TABLE_3
    with open(published / "tableA3.csv", newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["metric"] == "n" and r["subset"] == "clean"]
    clean = {f"{PRINTED[r['dataset']]}-clean": int(r["value"]) for r in rows if r["dataset"] != "Fi-ImageNet-1k"}
    assert clean == TABLE_A3_CLEAN


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper's text is in ../shared, which a user's clone lacks")
def test_sizes_agree_with_the_paper_text():
    """Read Table 3's rows ("<name> [ref]<TAB><n with thin spaces>") straight from the paper's text."""
    text = PAPER.read_text(encoding="utf-8")
    block = text[text.index("Dataset\t$n$\tFPR@95") : text.index("Table 3 compares")]
    found = {}
    for line in block.splitlines()[1:]:
        match = re.match(r"^(.+?)(?: \[\d+\])?\t([\d ]+)\t", line)
        if match:
            found[PRINTED[match.group(1)]] = int(match.group(2).replace(" ", ""))
    assert found == TABLE_3


# ----------------------------------------------------------------------------------------------- provenance
def test_no_list_file_is_in_the_package_only_its_provenance():
    """The lists are fetched by the user; oodbench carries where each comes from and the checksum that pins it."""
    assert not (importlib.resources.files("oodbench") / "data" / "imagelists").is_dir()
    used = {file for e in dataset_registry.REGISTRY.values() if e.official_list for file in e.official_list.files}
    assert used == set(imagelists.LIST_SOURCES)
    for file, source in imagelists.LIST_SOURCES.items():
        assert source.path.rsplit("/", 1)[-1] == file
        assert re.fullmatch(r"[0-9a-f]{40}", source.commit) and re.fullmatch(r"[0-9a-f]{64}", source.sha256)
        assert source.url == f"https://raw.githubusercontent.com/{source.repo}/{source.commit}/{source.path}"
        assert source.licence and source.entries > 0


def test_list_sizes_agree_with_the_papers_counts():
    """A whole-file list holds the set's Table 3 n; SSB's 50 validation files per class give Easy and Hard."""
    sources = imagelists.LIST_SOURCES
    whole = {
        "ninco": "NINCO_OOD_classes.csv",
        "clean-ood": "NINCO_popular_datasets_subsamples.csv",
        "inat-ood-plants": "OOD_iNaturalist_MOS_labels.csv",
        "openimage-o": "openimage_o.txt",
    }
    for name, file in whole.items():
        assert dataset_registry.get(name).official_list.files == (file,)  # type: ignore[union-attr]
        assert sources[file].entries == TABLE_3[name], name
    assert sources["imagenet_21k_val_files.json"].entries == 50 * (1_000 + 980)
    assert (50 * 1_000, 50 * 980) == (TABLE_3["ssb-easy"], TABLE_3["ssb-hard"])
    assert sources["imagenet_ssb_splits.json"].entries == 1_000 + 980
    for name in TABLE_A3_CLEAN:
        spec = dataset_registry.get(name).official_list
        assert spec is not None and spec.files == ("NINCO_popular_datasets_subsamples.csv",) and spec.select


# ----------------------------------------------------------------------------------------------- synthetic lists
# NINCO's folder (= `class` value) of each cleaned sub-sample, and how many rows the synthetic CSV gives it.
CLEAN_FOLDERS = {name: dataset_registry.get(name).official_list.select for name in TABLE_A3_CLEAN}  # type: ignore[union-attr]
SUBSAMPLE_ROWS = {folder: 2 + i % 3 for i, folder in enumerate(CLEAN_FOLDERS.values())}
NINCO_CLASSES = {"Caracal caracal caracal": 2, "Jellyfish": 3}
OPENIMAGE_O = ["000d5efd9500e718.jpg", "0010a3d096cd57b2.jpg", "0012a7cf33c6f427.jpg"]
INAT = [("000309dd0c724a5104df8e716b9008a0.jpg", "Toxicodendron diversilobum"), ("0008e0e9.jpg", "Lotus corniculatus")]
SSB_EASY, SSB_HARD, SSB_OTHER = ["n01848648", "n09999999"], ["n04399382"], "n07777777"


def _csv(header: list[str], rows: list[list[str]]) -> bytes:
    """A CSV as NINCO writes it (csv module, CRLF line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def synthetic_files() -> dict[str, bytes]:
    """One small file per official list, in its upstream format."""
    ninco = [
        [f"NINCO_OOD_classes/{cls}/{cls}_{i:03d}_{i}.jpg", cls] for cls, n in NINCO_CLASSES.items() for i in range(n)
    ]
    subsamples = [
        [f"NINCO_popular_datasets_subsamples/{folder}/{folder}_{i:03d}_x.jpg", folder]
        for folder, n in SUBSAMPLE_ROWS.items()
        for i in range(n)
    ]
    val_files = {wnid: [f"{wnid}_{k}.JPEG" for k in (11, 7, 302)] for wnid in [*SSB_EASY, *SSB_HARD, SSB_OTHER]}
    splits = {
        "known_classes": ["n01440764"],
        "unknown_classes": {"Hard": SSB_HARD, "Easy": SSB_EASY},
        "known_unknown_pairs": {"Easy": {}, "Hard": {}},
    }
    return {
        "NINCO_OOD_classes.csv": _csv(["image_location", "class"], ninco),
        "NINCO_popular_datasets_subsamples.csv": _csv(["image_location", "class"], subsamples),
        "OOD_iNaturalist_MOS_labels.csv": _csv(
            ["image_location", "species", "taxon"], [[f, s, "Plantae"] for f, s in INAT]
        ),
        "openimage_o.txt": "".join(f"{name}\n" for name in OPENIMAGE_O).encode(),
        "imagenet_21k_val_files.json": json.dumps(val_files, indent=4).encode(),
        "imagenet_ssb_splits.json": json.dumps(splits, indent=4).encode(),
    }


def register_checksums(monkeypatch, files: dict[str, bytes]) -> None:
    """Pin the synthetic bytes in place of the upstream ones, as the registry pins the real files."""
    for file, data in files.items():
        source = replace(imagelists.LIST_SOURCES[file], sha256=hashlib.sha256(data).hexdigest())
        monkeypatch.setitem(imagelists.LIST_SOURCES, file, source)


@pytest.fixture
def lists(tmp_path, monkeypatch) -> Path:
    """A lists folder holding every synthetic list file, each registered by its checksum."""
    files = synthetic_files()
    register_checksums(monkeypatch, files)
    folder = tmp_path / "imagelists"
    folder.mkdir()
    for file, data in files.items():
        (folder / file).write_bytes(data)
    return folder


def _publish(monkeypatch, name: str, count: int) -> None:
    """Give a set the size of its synthetic list (the real published sizes are pinned above)."""
    monkeypatch.setitem(dataset_registry.REGISTRY, name, replace(dataset_registry.get(name), expected_count=count))


def _place(root: Path, relatives) -> None:
    """Put a tiny real PNG at each path under `root`."""
    png = (write_images(root.parent / "_png", {"x": 1}) / "x" / "img000.png").read_bytes()
    for relative in relatives:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)


def test_each_upstream_format_is_read(lists):
    ninco = dataset_registry.official_entries("ninco", lists)
    assert ninco[:2] == ("Caracal caracal caracal/Caracal caracal caracal_000_0.jpg",) + (
        "Caracal caracal caracal/Caracal caracal caracal_001_1.jpg",
    )  # NINCO_OOD_classes/ stripped: the set's folder stands for it; the CRLF line ends are NINCO's
    assert len(ninco) == 5
    assert dataset_registry.official_entries("inat-ood-plants", lists) == tuple(f for f, _ in INAT)
    assert dataset_registry.official_entries("openimage-o", lists) == tuple(OPENIMAGE_O)
    easy = dataset_registry.official_entries("ssb-easy", lists)
    assert easy == tuple(f"{w}/{w}_{k}.JPEG" for w in SSB_EASY for k in (11, 7, 302))
    hard = dataset_registry.official_entries("ssb-hard", lists)
    assert {e.split("/")[0] for e in hard} == set(SSB_HARD) and len(hard) == 3  # a class of neither split is left out


def test_a_set_without_an_official_list_has_none(lists):
    with pytest.raises(DataError, match="publish no image list"):
        dataset_registry.official_entries("360openset", lists)


def test_the_clean_subsamples_are_the_rows_of_their_folder_and_clean_ood_their_union(lists):
    union = []
    for name, folder in CLEAN_FOLDERS.items():
        entries = dataset_registry.official_entries(name, lists)
        assert len(entries) == SUBSAMPLE_ROWS[folder], name
        assert all(e.startswith(f"{folder}_") and "/" not in e for e in entries), name
        union += [f"{folder}/{e}" for e in entries]
    clean_ood = dataset_registry.official_entries("clean-ood", lists)
    assert list(clean_ood) == union and len(clean_ood) == sum(SUBSAMPLE_ROWS.values())


def test_a_modified_list_is_refused_by_its_checksum(lists, tmp_path):
    path = lists / "openimage_o.txt"
    path.write_bytes(path.read_bytes().replace(b"000d5efd9500e718", b"000d5efd9500e719"))
    with pytest.raises(DataError, match=r"openimage_o.txt is not github.com/haoqiwang/vim @ dabf9e5b242d .*SHA-256"):
        dataset_registry.official_entries("openimage-o", lists)
    root = tmp_path / "data"
    _place(root / "openimage_o", OPENIMAGE_O)
    (status,) = dataset_registry.check(root, datasets=["openimage-o"], lists=lists)
    assert status.status == "unreadable" and "datasets lists fetch" in status.message
    with pytest.raises(DataError, match="SHA-256"):
        dataset_registry.open_registered("openimage-o", root, lists=lists)


def test_an_absent_list_falls_back_to_every_image_under_the_folder(tmp_path, monkeypatch):
    root = tmp_path / "data"
    write_images(root / "NINCO" / "NINCO_OOD_classes", {"a": 2, "b": 1})
    empty = tmp_path / "empty-lists"
    empty.mkdir()
    for lists in (None, empty):
        images = dataset_registry.open_registered("ninco", root, lists=lists)
        assert len(images) == 3 and "listed" not in images.source
        assert "official list NINCO_OOD_classes.csv missing" in images.source["absent_list"]
        (status,) = dataset_registry.check(root, datasets=["ninco"], lists=lists)
        assert (status.status, status.found, status.listed, status.official_list) == (
            "count mismatch",
            3,
            None,
            "missing",
        )
        assert "3 images under the folder but 5,879 published" in status.message
        assert "oodbench datasets lists fetch --to DIR" in status.message
    _publish(monkeypatch, "ninco", 3)  # the count is what the fallback checks: equal, the set is ok, still without list
    (status,) = dataset_registry.check(root, datasets=["ninco"], lists=empty)
    assert status.status == "ok" and f"not in {empty}" in status.message
    with pytest.raises(DataError, match="lists folder .* does not exist"):
        dataset_registry.check(root, lists=tmp_path / "nope")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DataError, match="lists folder .*a-file is a file, not a folder"):
        dataset_registry.check(root, lists=tmp_path / "a-file")


def test_check_reports_listed_present_missing_and_extra(lists, tmp_path, monkeypatch):
    root = tmp_path / "data"
    clean = root / "NINCO" / "NINCO_popular_datasets_subsamples"
    entries = dataset_registry.official_entries("clean-ood", lists)
    _place(clean, entries[1:])  # one listed image absent
    _place(clean, ["Places/unlisted_a.jpg", "Textures/more/unlisted_b.png"])  # two files the list does not name
    total = len(entries)
    _publish(monkeypatch, "clean-ood", total)
    report = {s.name: s for s in dataset_registry.check(root, datasets=["clean-ood", *TABLE_A3_CLEAN], lists=lists)}
    status = report["clean-ood"]
    assert (status.status, status.listed, status.present, status.missing_images, status.extra) == (
        "images missing",
        total,
        total - 1,
        1,
        2,
    )
    assert status.missing_examples == [entries[0]] and status.official_list == "used"
    assert sorted(status.extra_examples) == ["Places/unlisted_a.jpg", "Textures/more/unlisted_b.png"]
    first = next(iter(CLEAN_FOLDERS))  # the sub-sample holding the absent image
    assert report[first].missing_images == 1 and report[first].status == "images missing"
    places = report["places-clean"]  # listed images all there, one other file ignored; size differs from Table A3's
    n = SUBSAMPLE_ROWS["Places"]
    assert (places.listed, places.present, places.extra, places.status) == (n, n, 1, "count mismatch")
    assert f"the list names {n} images but 153 published" in places.message
    _place(clean, entries[:1])
    _publish(monkeypatch, "places-clean", n)
    (places,) = dataset_registry.check(root, datasets=["places-clean"], lists=lists)
    assert places.status == "ok" and "1 other file(s)" in places.message and "ignored" in places.message
    images = dataset_registry.open_registered("places-clean", root, lists=lists)
    assert list(images.items) == [f"Places_{i:03d}_x.jpg" for i in range(n)]
    assert images.source["ignored"] == 1 and images.source["listed"] == n


def test_a_name_list_finds_files_in_any_layout_of_a_superset_folder(lists, tmp_path, monkeypatch):
    """OpenImage-O's list names files: the whole OpenImages test folder may hold them, in any sub-folder."""
    root = tmp_path / "data"
    _place(root / "openimages" / "test", [f"part{i}/{name}" for i, name in enumerate(OPENIMAGE_O)] + ["other.jpg"])
    _publish(monkeypatch, "openimage-o", 3)
    (status,) = dataset_registry.check(root, datasets=["openimage-o"], lists=lists)
    assert (status.status, status.listed, status.present, status.extra) == ("ok", 3, 3, 1)
    assert status.path.endswith("openimages/test")


def test_check_cli_says_which_lists_are_missing_and_how_to_get_them(lists, tmp_path):
    root = tmp_path / "data"
    write_images(root / "NINCO" / "NINCO_OOD_classes", {"a": 1})
    write_images(root / "openimage_o", {"a": 1})
    (lists / "NINCO_OOD_classes.csv").unlink()
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    args = ["datasets", "check", "--root", str(root), "--only", "ninco", "--only", "openimage-o", "--lists", str(lists)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"1 set(s) checked without their official image list, not found in {lists}: ninco" in result.output
    assert "oodbench datasets lists fetch --to DIR" in result.output
    rows = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert [(r["name"], r["official_list"], r["listed"]) for r in rows] == [
        ("ninco", "missing", None),
        ("openimage-o", "used", 3),
    ]
    bad = CliRunner().invoke(app, ["datasets", "check", "--root", str(root), "--lists", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "does not exist" in bad.output and "Traceback" not in bad.output


def test_extract_takes_the_listed_images_and_says_how_many_it_ignored(lists, tmp_path):
    root = tmp_path / "data"
    folder = root / "NINCO" / "NINCO_popular_datasets_subsamples"
    listed = dataset_registry.official_entries("ssb-easy-clean", lists)
    _place(folder / "SSB_easy", listed)
    write_images(folder / "SSB_easy" / "junk", {"a": 2})
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    args = ["extract", "--model", "test_resnet", "--no-pretrained", "--image-size", "32", "--store"]
    args += [str(tmp_path / "store"), "--dataset", "ssb-easy-clean", "--root", str(root), "--workers", "0"]
    result = CliRunner().invoke(app, [*args, "--lists", str(lists), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"{len(listed)} listed images" in result.output and "ignored 2 other file(s)" in result.output
    from oodbench import Store

    meta = Store(tmp_path / "store").meta("test_resnet", "ssb-easy-clean")
    assert meta["num_rows"] == len(listed) and meta["dataset"]["ignored"] == 2
    fallback = CliRunner().invoke(app, [*args, "--dataset-id", "all", "--no-progress"])
    assert fallback.exit_code == 0, fallback.output
    assert (
        f"every image under the folder taken ({len(listed) + 2})" in fallback.output
        and "lists fetch" in fallback.output
    )
    refused = CliRunner().invoke(app, [*args, "--lists", str(tmp_path / "nope")])
    assert refused.exit_code == 2 and "is not a folder" in refused.output


def test_the_runner_reads_the_lists_folder_and_keys_the_list_it_used(lists, tmp_path, capsys):
    from oodbench.runner.kinds import DatasetSpec, dataset_kind

    root = tmp_path / "data"
    places = root / "NINCO" / "NINCO_popular_datasets_subsamples" / "Places"
    _place(places, dataset_registry.official_entries("places-clean", lists))
    write_images(places / "junk", {"a": 2})
    kind = dataset_kind("registry")

    def spec(**params) -> DatasetSpec:
        return DatasetSpec("p", "registry", {"root": str(root), "name": "places-clean", **params}, "datasets.p")

    with_lists, without = spec(lists=str(lists)), spec()
    n = SUBSAMPLE_ROWS["Places"]
    assert len(kind.open(with_lists)) == n
    assert f"{n} listed images taken; ignored 2 other file(s)" in capsys.readouterr().err
    assert len(kind.open(without)) == n + 2
    assert "official list NINCO_popular_datasets_subsamples.csv missing" in capsys.readouterr().err
    pinned = imagelists.LIST_SOURCES["NINCO_popular_datasets_subsamples.csv"].sha256
    assert kind.identity(with_lists)["official_list_sha256"] == [pinned]
    assert kind.identity(without)["official_list_sha256"] is None  # other images, another unit key
    assert "lists" not in kind.identity(with_lists)  # the folder's path does not matter, the list's checksum does
    assert "official (NINCO, MIT)" in kind.describe(with_lists) and "missing" in kind.describe(without)
    assert kind.missing(spec(lists=str(tmp_path / "nope"))) == {
        "datasets.p.lists": f"lists folder {tmp_path / 'nope'} does not exist; fill it with "
        f"`oodbench datasets lists fetch --to {tmp_path / 'nope'}`"
    }
    mine, moved = tmp_path / "mine.txt", tmp_path / "moved.txt"
    mine.write_text("a.png\n")
    moved.write_text("a.png\n")
    given = DatasetSpec("x", "registry", {"root": str(root), "name": "imagenet-ood", "list": str(mine)}, "datasets.x")
    same = DatasetSpec("x", "registry", {"root": str(root), "name": "imagenet-ood", "list": str(moved)}, "datasets.x")
    assert kind.identity(given) == kind.identity(same)  # a given list: its content, not its path
    moved.write_text("b.png\n")
    assert kind.identity(given) != kind.identity(same)


# ----------------------------------------------------------------------------------------------- fetching
class _Server:
    """An HTTP server on 127.0.0.1 answering GET <path> with the bytes registered for it (404 otherwise)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        served = files

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                body = served.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body if body is not None else b"not found")

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(monkeypatch) -> Iterator[tuple[_Server, dict[str, bytes]]]:
    """The synthetic lists, registered by checksum and served at their repositories' raw paths on 127.0.0.1."""
    for variable in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    files = synthetic_files()
    register_checksums(monkeypatch, files)
    by_path = {}
    for file, data in files.items():
        source = imagelists.LIST_SOURCES[file]
        by_path[f"/{source.repo}/{source.commit}/{source.path}"] = data
    server = _Server(by_path)
    monkeypatch.setattr(imagelists, "RAW_BASE", server.base)
    yield server, by_path
    server.close()


def test_fetch_downloads_each_list_at_its_commit_and_verifies_it(served, tmp_path):
    _, by_path = served
    to = tmp_path / "lists"
    seen = []
    results = imagelists.fetch_lists(to, progress=seen.append)
    assert [r.action for r in results] == ["downloaded"] * 6 and seen == results
    assert sorted(p.name for p in to.iterdir()) == sorted(imagelists.LIST_SOURCES)
    for file, source in imagelists.LIST_SOURCES.items():
        assert (to / file).read_bytes() == by_path[f"/{source.repo}/{source.commit}/{source.path}"]
    again = imagelists.fetch_lists(to)
    assert [r.action for r in again] == ["already present"] * 6
    # what was fetched is what the registry reads
    assert dataset_registry.official_entries("openimage-o", to) == tuple(OPENIMAGE_O)


def test_fetch_refuses_bytes_that_are_not_the_pinned_file(served, tmp_path):
    _, by_path = served
    source = imagelists.LIST_SOURCES["openimage_o.txt"]
    by_path[f"/{source.repo}/{source.commit}/{source.path}"] = b"000d5efd9500e718.jpg\n"  # the server now differs
    to = tmp_path / "lists"
    with pytest.raises(DataError, match=r"openimage_o.txt gave 21 bytes with SHA-256 .*not the pinned"):
        imagelists.fetch_lists(to, files=["openimage_o.txt"])
    assert not to.exists()  # nothing written, not even the folder
    del by_path[f"/{source.repo}/{source.commit}/{source.path}"]
    with pytest.raises(DataError, match="answered HTTP 404"):
        imagelists.fetch_lists(to, files=["openimage_o.txt"])
    to.mkdir()
    (to / "openimage_o.txt").write_bytes(b"edited by hand\n")  # a modified file is replaced only by the pinned one
    with pytest.raises(DataError, match="HTTP 404"):
        imagelists.fetch_lists(to, files=["openimage_o.txt"])
    assert (to / "openimage_o.txt").read_bytes() == b"edited by hand\n" and sorted(to.iterdir()) == [
        to / "openimage_o.txt"
    ]


def test_fetch_without_network_fails_at_once_with_one_line(monkeypatch, tmp_path):
    calls = []

    def unreachable(request, timeout=None):
        calls.append(request.full_url)
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    to = tmp_path / "lists"
    with pytest.raises(DataError, match="cannot reach raw.githubusercontent.com") as caught:
        imagelists.fetch_lists(to)
    assert len(calls) == 1 and "\n" not in str(caught.value)  # stops at the first file
    assert calls[0] == imagelists.LIST_SOURCES["NINCO_OOD_classes.csv"].url and not to.exists()
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    result = CliRunner().invoke(app, ["datasets", "lists", "fetch", "--to", str(to)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert "cannot reach raw.githubusercontent.com" in line and str(to) in line


def test_fetch_from_a_closed_port_fails_with_one_line(monkeypatch, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on: connection refused, no network needed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for variable in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(imagelists, "RAW_BASE", f"http://127.0.0.1:{port}")
    with pytest.raises(DataError, match=f"cannot reach 127.0.0.1:{port}"):
        imagelists.fetch_lists(tmp_path / "lists", timeout=5)


def test_lists_show_names_every_source_and_what_a_folder_holds(lists):
    (lists / "openimage_o.txt").write_bytes(b"changed\n")
    (lists / "imagenet_ssb_splits.json").unlink()
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    result = CliRunner().invoke(app, ["datasets", "lists", "show", "--lists", str(lists), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["file"]: row for row in json.loads(result.stdout)}
    assert set(rows) == set(imagelists.LIST_SOURCES)
    assert rows["openimage_o.txt"]["state"] == "modified" and rows["imagenet_ssb_splits.json"]["state"] == "absent"
    assert rows["NINCO_OOD_classes.csv"]["state"] == "ok" and rows["NINCO_OOD_classes.csv"]["sets"] == ["ninco"]
    assert rows["openimage_o.txt"]["url"].startswith("https://raw.githubusercontent.com/haoqiwang/vim/dabf9e5b242d")
    table = CliRunner().invoke(app, ["datasets", "lists", "show"])
    assert table.exit_code == 0 and "NINCO_popular_datasets_subsamples.csv" in table.stdout


def test_match_by_name_finds_files_in_any_layout_and_refuses_ambiguity(tmp_path):
    write_images(tmp_path / "test", {"a": 2, "b": 1})
    found = match_list(["img001.png", "img009.png"], folder=tmp_path / "test", base=tmp_path / "test", by="name")
    assert found.present == ("a/img001.png",) and found.missing == ("img009.png",)
    assert set(found.extra) == {"a/img000.png", "b/img000.png"}
    with pytest.raises(DataError, match="matches 2 files"):
        match_list(["img000.png"], folder=tmp_path / "test", base=tmp_path / "test", by="name")
    with pytest.raises(DataError, match="more than once"):
        match_list(["a/img000.png", "a/img000.png"], folder=tmp_path / "test", base=tmp_path / "test")


def test_a_given_list_is_recognised_as_the_authors_or_not(tmp_path, monkeypatch):
    root = tmp_path / "data"
    write_images(root / "imagenet-ood", {"n02925009": 3})
    mine = tmp_path / "imagenetood.txt"
    mine.write_text("n02925009/img000.png\nn02925009/img001.png\n")
    (status,) = dataset_registry.check(root, datasets=["imagenet-ood"], list_files={"imagenet-ood": mine})
    assert status.image_list.endswith("(differs from the authors' list)")
    assert (status.status, status.listed, status.extra) == ("count mismatch", 2, 1)
    assert "the list names 2 images but 31,802 published" in status.message
    authors = replace(dataset_registry.get("imagenet-ood"), list_sha256=hashlib.sha256(mine.read_bytes()).hexdigest())
    monkeypatch.setitem(dataset_registry.REGISTRY, "imagenet-ood", authors)
    (status,) = dataset_registry.check(root, datasets=["imagenet-ood"], list_files={"imagenet-ood": mine})
    assert status.image_list.endswith("(the authors' list)")
    with pytest.raises(DataError, match="does not exist"):
        dataset_registry.open_registered("imagenet-ood", root, list_file=tmp_path / "nope.txt")


def test_datasets_list_shows_every_published_size():
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    result = CliRunner().invoke(app, ["datasets", "list"])
    assert result.exit_code == 0, result.output
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    for name, count in {**TABLE_3, **TABLE_A3_CLEAN}.items():
        assert f"{count:,}" in rows[name], name
    assert "official (NINCO, MIT)" in rows["ninco"]
    listed = json.loads(CliRunner().invoke(app, ["datasets", "list", "--json"]).stdout)
    assert listed["ninco"]["official_list"]["files"] == ["NINCO_OOD_classes.csv"]
