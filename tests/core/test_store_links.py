"""Folders linked out of a store, .npy headers that declare more than their file holds, and non-numeric dtypes.

A store's model, entry, head and shard folders must be real directories: a link planted in their place (say,
``store/m1`` linked to a folder elsewhere) is refused in one line before anything is read, written or deleted
through it, and the folder outside keeps every file (an older version deleted ``victim/ood`` and created
``victim/.ood.lock``). Every .npy header is checked against its file's size before an array is allocated,
legacy heads without recorded specs included (an older version allocated 8 TiB for a 128-byte file). Only
booleans, integers and floats in native byte order are stored or read (an older version called entries of
strings, void bytes and dates intact).
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core import store as store_module
from oodbench.core.errors import StoreError

pytestmark = pytest.mark.hostile

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
ONES = Outputs(np.ones((4, 4), np.float32))
HEAD = Head(np.ones((3, 4), np.float32), np.zeros(3, np.float32))


def _toy_store(root: Path) -> Store:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, np.float32)
    store = Store(root)
    for name in ("fit", "ood"):
        z = rng.normal(size=(20, 4)).astype(np.float32)
        store.write_outputs("toy", name, Outputs(z, z @ weight.T, rng.integers(0, 3, 20)), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """One toy store written through `Store`, which each case copies."""
    root = tmp_path_factory.mktemp("template") / "store"
    _toy_store(root)
    return root


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (dot files too) with its bytes (None for a folder), links not followed."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if not p.is_symlink()
    }


def _refused(action: Callable[[], object], *names: str) -> str:
    with pytest.raises(StoreError) as info:
        action()
    message = str(info.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, message
    return message


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


# ------------------------------------------------------------------------------------------------ linked folders
def _everything(store: Store) -> dict[str, Callable[[], object]]:
    """Every act of a store on the entry toy/fit and the head of toy: reads, writes and deletions."""
    return {
        "meta": lambda: store.meta("toy", "fit"),
        "exists": lambda: store.exists("toy", "fit"),
        "read": lambda: store.read("toy", "fit"),
        "read unmapped": lambda: store.read("toy", "fit", mmap=False),
        "read_array": lambda: store.read_array("toy", "fit", "index"),
        "verify": lambda: store.verify("toy", "fit"),
        "file_stamps": lambda: store.file_stamps("toy", "fit"),
        "delete": lambda: store.delete("toy", "fit"),
        "overwrite": lambda: store.write_outputs("toy", "fit", ONES, provenance=PROV, overwrite=True),
        "writer": lambda: store.writer("toy", "fit", provenance=PROV, num_items=4, shard_size=2),
        "read_head": lambda: store.read_head("toy"),
        "verify_head": lambda: store.verify_head("toy"),
        "head_meta": lambda: store.head_meta("toy"),
        "write_head": lambda: store.write_head("toy", HEAD, provenance=PROV),
    }


def test_a_model_folder_linked_outside_is_never_followed(tmp_path, template, capsys):
    """The auditor's case: `store/toy` links to a folder elsewhere; `delete` emptied its `fit` and left a lock."""
    outside = tmp_path / "outside"
    shutil.copytree(template / "toy", outside, symlinks=True)
    (outside / "fit" / "precious.txt").write_text("keep")
    before = _snapshot(outside)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "toy").symlink_to(outside)
    store = Store(tmp_path / "store")
    acts = {
        **_everything(store),
        "datasets": lambda: store.datasets("toy"),
        "has_head": lambda: store.has_head("toy"),
        "new entry": lambda: store.write_outputs("toy", "new", ONES, provenance=PROV),
    }
    for act in acts.values():
        _refused(act, f"{tmp_path / 'store' / 'toy'} is a symbolic link")
    assert _snapshot(outside) == before  # nothing deleted, no lock file or entry created there
    code, _, err = _run(["store", "verify", "--store", str(tmp_path / "store")], capsys)
    assert code == 2 and "toy is a symbolic link" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("folder", ["toy/fit", "toy/head"])
def test_an_entry_or_head_folder_linked_outside_is_never_followed(tmp_path, template, capsys, folder):
    """A link to a valid copy elsewhere: refused, not read in its place; deleting or overwriting leaves it intact."""
    store = Store(tmp_path / "store")
    shutil.copytree(template, store.root, symlinks=True)
    outside = tmp_path / "outside"
    shutil.move(store.root / folder, outside)
    (store.root / folder).symlink_to(outside)
    before = _snapshot(outside)
    name = str(store.root / folder)
    for what, act in _everything(store).items():
        if folder.endswith("head") == ("head" in what):
            _refused(act, f"{name} is a symbolic link")
    assert store.has_head("toy")  # listed, so that `store verify` names it
    assert _snapshot(outside) == before
    assert (store.root / folder).is_symlink()  # the link itself is not deleted either
    code, out, err = _run(["store", "verify", "--store", str(store.root)], capsys)
    assert code == 2 and f"{folder}: damaged: {name} is a symbolic link" in out, out
    assert len(err.strip().splitlines()) == 1


def test_a_shard_folder_linked_outside_is_never_written(tmp_path):
    store = Store(tmp_path / "store")
    writer = store.writer("toy", "fit", provenance=PROV, num_items=4, shard_size=2)
    writer.write_shard(0, {"features": np.ones((2, 4), np.float32)})
    shards = store.entry_path("toy", "fit") / "shards"
    shutil.move(shards, tmp_path / "outside")
    shards.symlink_to(tmp_path / "outside")
    before = _snapshot(tmp_path / "outside")
    _refused(lambda: writer.write_shard(1, {"features": np.ones((2, 4), np.float32)}), f"{shards} is a symbolic link")
    _refused(writer.pending_shards, f"{shards} is a symbolic link")
    _refused(writer.finalize, f"{shards} is a symbolic link")
    _refused(lambda: store.describe_incomplete("toy", "fit"), f"{shards} is a symbolic link")
    writer.close()
    assert _snapshot(tmp_path / "outside") == before


@pytest.mark.parametrize("act", ["delete", "overwrite"])
def test_a_link_planted_while_the_lock_is_taken_is_refused_under_it(tmp_path, template, monkeypatch, act):
    """The check is made again under the entry's lock: a folder swapped for a link before it was taken is refused."""
    store = Store(tmp_path / "store")
    shutil.copytree(template, store.root, symlinks=True)
    outside = tmp_path / "outside"
    entry = store.root / "toy" / "fit"
    real_acquire = store_module._acquire

    def acquire_then_plant(path, what, wait):
        taken = real_acquire(path, what, wait)
        if path.name == ".fit.lock" and not entry.is_symlink():
            shutil.move(entry, outside)
            entry.symlink_to(outside)
        return taken

    monkeypatch.setattr(store_module, "_acquire", acquire_then_plant)
    before = _snapshot(store.root)
    do = _everything(store)[act]
    _refused(do, f"{entry} is a symbolic link")
    assert _snapshot(outside) == {k[len("toy/fit/") :]: v for k, v in before.items() if k.startswith("toy/fit/")}


def test_a_store_root_given_through_links_above_it_still_works(tmp_path, template):
    """Links above the store, and the root itself, are the user's choice: only what lies below the root is judged."""
    real = tmp_path / "disk" / "store"
    shutil.copytree(template, real, symlinks=True)
    (tmp_path / "alias").symlink_to(tmp_path / "disk")
    store = Store(tmp_path / "alias" / "store")
    assert store.read("toy", "fit").features.shape == (20, 4)
    assert store.read_head("toy").num_classes == 3
    store.write_outputs("toy", "new", ONES, provenance=PROV)
    store.delete("toy", "fit")
    assert not (real / "toy" / "fit").exists() and (real / "toy" / "new" / "meta.json").is_file()


# ------------------------------------------------------------------------------------------------ .npy headers
def _header(dtype: str, shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _legacy_head(root: Path) -> Path:
    """The head written without recorded specs (meta.json without ``arrays``), as older versions wrote it."""
    head = root / "toy" / "head"
    meta = json.loads((head / "meta.json").read_text())
    del meta["arrays"]
    (head / "meta.json").write_text(json.dumps(meta))
    return head


LEGACY_HEAD_FILES = {
    "8 TiB declared in 128 bytes": lambda: _header("float64", (2**20, 2**20)),
    "2^63 bytes declared (an int64 product overflows)": lambda: _header("uint8", (2**33, 2**30)),
    "one row more than the file holds": lambda: _header("float32", (4, 4)) + np.ones((3, 4), np.float32).tobytes(),
    "padded": lambda: _header("float32", (3, 4)) + np.ones((3, 4), np.float32).tobytes() + b"\0" * 16,
    "strings": lambda: _header("<U2", (3, 4)) + b"\0" * 96,
    "big-endian floats": lambda: _header(">f4", (3, 4)) + np.ones((3, 4), ">f4").tobytes(),
}


@pytest.mark.parametrize("case", sorted(LEGACY_HEAD_FILES))
def test_a_legacy_head_file_is_checked_against_its_size_before_allocating(tmp_path, template, case, capsys):
    store = Store(tmp_path / "store")
    shutil.copytree(template, store.root, symlinks=True)
    head = _legacy_head(store.root)
    (head / "weight.npy").write_bytes(LEGACY_HEAD_FILES[case]())
    _refused(lambda: store.read_head("toy"), "weight.npy")
    _refused(lambda: store.read_head("toy", verify=True), "weight.npy")
    assert not store.verify_head("toy").ok
    code, out, _ = _run(["store", "verify", "--store", str(store.root)], capsys)
    assert code == 2 and "toy/head: damaged: weight.npy" in out


def test_a_legacy_head_that_is_intact_still_reads(tmp_path, template):
    store = Store(tmp_path / "store")
    shutil.copytree(template, store.root, symlinks=True)
    _legacy_head(store.root)
    head = store.read_head("toy")
    assert head.weight.shape == (3, 4) and store.verify_head("toy").ok


# ------------------------------------------------------------------------------------------------ dtypes
def _retype(entry: Path, name: str, array: np.ndarray, dtype: object) -> None:
    """Replace one array of an entry by `array` and record `dtype` for it, without checksums (format 1)."""
    np.save(entry / f"{name}.npy", array)
    meta = json.loads((entry / "meta.json").read_text())
    meta["arrays"][name] = {"shape": list(array.shape), "dtype": dtype}
    for spec in meta["arrays"].values():
        spec.pop("sha256", None), spec.pop("header_sha256", None)
    meta.pop("checksum_rows", None)
    meta["format"] = 1
    (entry / "meta.json").write_text(json.dumps(meta))


NOT_NUMERIC = {
    "unicode": ("labels", lambda: np.array(["ab"] * 20), "<U2"),
    "bytes": ("labels", lambda: np.array([b"ab"] * 20), "|S2"),
    "void": ("labels", lambda: np.zeros(20, "V8"), "|V8"),
    "structured": ("labels", lambda: np.zeros(20, [("a", "<f4"), ("b", "<i8")]), [["a", "<f4"], ["b", "<i8"]]),
    "datetime": ("features", lambda: np.zeros((20, 4), "M8[s]"), "datetime64[s]"),
    "timedelta": ("labels", lambda: np.zeros(20, "m8[s]"), "timedelta64[s]"),
    "complex": ("features", lambda: np.zeros((20, 4), np.complex64), "complex64"),
    "big-endian": ("features", lambda: np.zeros((20, 4), ">f4"), ">f4"),
    "long double": ("features", lambda: np.zeros((20, 4), np.longdouble), str(np.dtype(np.longdouble))),
}


@pytest.mark.parametrize("case", sorted(NOT_NUMERIC))
def test_an_entry_of_a_non_numeric_dtype_is_refused(tmp_path, template, capsys, case):
    store = Store(tmp_path / "store")
    shutil.copytree(template, store.root, symlinks=True)
    name, make, recorded = NOT_NUMERIC[case]
    _retype(store.root / "toy" / "ood", name, make(), recorded)
    _refused(lambda: store.read("toy", "ood"), "invalid dtype")
    _refused(lambda: store.meta("toy", "ood"), "invalid dtype")
    code, out, _ = _run(["store", "verify", "--store", str(store.root)], capsys)
    assert code == 2 and "toy/ood: damaged: " in out and "invalid dtype" in out
    code, out, _ = _run(["store", "ls", "--store", str(store.root)], capsys)
    assert code == 2 and "  ood: unreadable: " in out and "  fit: complete; " in out


PLAIN = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
PLAIN += ["float16", "float32", "float64"]


def test_every_dtype_the_store_writes_reads_back(tmp_path):
    store = Store(tmp_path / "store")
    extras = {f"x{dtype}": np.arange(40).reshape(20, 2).astype(dtype) for dtype in PLAIN}
    extras["swapped"] = np.arange(20, dtype=">f8")  # written in native byte order
    store.write_outputs("toy", "fit", Outputs(np.ones((20, 4), np.float32), extras=extras), provenance=PROV)
    for mmap in (True, False):
        read = store.read("toy", "fit", mmap=mmap, verify=True).extras
        for key, value in extras.items():
            assert read[key].dtype.isnative and read[key].dtype.kind == value.dtype.kind
            assert np.array_equal(read[key], value)


@pytest.mark.parametrize("dtype", ["<U2", "datetime64[s]", "complex64"])
def test_a_writer_refuses_a_non_numeric_array_in_one_line(tmp_path, dtype):
    store = Store(tmp_path / "store")
    writer = store.writer("toy", "fit", provenance=PROV, num_items=2, shard_size=2)
    arrays = {"features": np.ones((2, 4), np.float32), "extra.bad": np.zeros(2, dtype)}
    _refused(lambda: writer.write_shard(0, arrays), "extra.bad", "booleans, integers and floats")
    writer.close()


def test_deleting_a_model_or_its_head_follows_no_link(tmp_path):
    # The runner resets a model whose definition changed (delete_model) and a stale probe's head (delete_head):
    # a link in the model's or the head's place is refused in one StoreError line and what it points to survives.
    store = Store(tmp_path / "store")
    z = np.ones((4, 3), dtype=np.float32)
    store.write_outputs("m", "fit", Outputs(z, z[:, :2], np.array([0, 1, 0, 1])), provenance=PROV)
    store.write_head("m", Head(np.ones((2, 3), np.float32), np.zeros(2, np.float32)), provenance=PROV)
    outside = tmp_path / "outside"
    (outside / "head").mkdir(parents=True)
    (outside / "head" / "precious.txt").write_text("keep")
    (tmp_path / "store" / "linked").symlink_to(outside)
    with pytest.raises(StoreError, match="symbolic link"):
        store.delete_model("linked")
    with pytest.raises(StoreError, match="symbolic link"):
        store.delete_head("linked")
    assert (outside / "head" / "precious.txt").read_text() == "keep"
    store.delete_head("m")
    assert not store.has_head("m") and store.exists("m", "fit")
    store.delete_model("m")
    assert "m" not in store.models() and not (tmp_path / "store" / "m").exists()
