"""An import's staging folder is never trusted: an entry staged by an interrupted import (of this pack or of
another) enters the store only when it is byte for byte the entry the manifest describes; anything else there
(other data, an extra or missing file, a link, a pipe) is discarded without following links and staged again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core import pack as pack_module
from oodbench.core.errors import StoreError
from oodbench.core.pack import PackStore, export_pack, import_pack

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {"size": 8}}
DATASETS = ("fit", "test")


def _make_pack(root: Path, seed: int) -> Path:
    """A store of two entries and a head from `seed`, exported as a pack; the same ids for every seed."""
    rng = np.random.default_rng(seed)
    store = Store(root / "store")
    for name in DATASETS:
        z = rng.normal(size=(40, 8)).astype(np.float32)
        store.write_outputs(
            "toy", name, Outputs(z, z[:, :3].copy(), rng.integers(0, 3, 40)), provenance=PROV, shard_size=16
        )
    store.write_head("toy", Head(rng.normal(size=(3, 8)).astype(np.float32), np.zeros(3, np.float32)), provenance=PROV)
    export_pack(store, root / "pack", [("toy", d) for d in DATASETS])
    return root / "pack"


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Packs A and B: the same model and dataset ids, other data."""
    return _make_pack(tmp_path_factory.mktemp("a"), 0), _make_pack(tmp_path_factory.mktemp("b"), 1)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _stage_only(pack: Path, store: Path) -> Path:
    """Import `pack` into `store` until every entry is staged, then fail (a FIFO at the first entry's lock file)."""
    (store / "toy").mkdir(parents=True, exist_ok=True)
    os.mkfifo(store / "toy" / ".fit.lock")
    with pytest.raises(StoreError, match="FIFO") as info:
        import_pack(pack, store)
    assert "\n" not in str(info.value)
    (store / "toy" / ".fit.lock").unlink()
    staging = store / ".pack-import"
    assert sorted(p.name for p in (staging / "toy").iterdir()) == ["fit", "head", "test"]
    return staging


def _assert_holds(store: Path, pack: Path) -> None:
    """`store` holds exactly `pack`'s entries and head, byte for byte as exported, and no staging folder."""
    source = pack.parent / "store" / "toy"
    for name in (*DATASETS, "head"):
        assert not (store / "toy" / name).is_symlink()
        assert _tree(store / "toy" / name) == _tree(source / name), name
    for name in DATASETS:
        assert Store(store).verify("toy", name).ok
        np.testing.assert_array_equal(
            Store(store).read("toy", name).features, PackStore(pack).read("toy", name).features
        )
    assert not (store / ".pack-import").exists()


def test_an_import_of_another_pack_never_moves_in_entries_staged_from_the_first(packs, tmp_path, capsys):
    pack_a, pack_b = packs
    store = tmp_path / "store"
    _stage_only(pack_a, store)  # A's verified entries stay staged
    with pytest.raises(SystemExit) as code:
        main(["pack", "import", str(pack_b), "--store", str(store), "--no-progress"])
    captured = capsys.readouterr()
    assert code.value.code in (0, None), captured.err
    assert "imported 3 entries and heads" in captured.out
    _assert_holds(store, pack_b)  # B's data, not A's


def _flip_byte(entry: Path, outside: Path) -> None:
    data = bytearray((entry / "features.npy").read_bytes())
    data[-1] ^= 0x01
    (entry / "features.npy").write_bytes(bytes(data))


def _entry_is_link(entry: Path, outside: Path) -> None:
    shutil.move(entry, outside / "fit")  # a valid staged copy, but reached through a link
    entry.symlink_to(outside / "fit", target_is_directory=True)


def _array_is_link(entry: Path, outside: Path) -> None:
    shutil.move(entry / "features.npy", outside / "features.npy")
    (entry / "features.npy").symlink_to(outside / "features.npy")


def _model_folder_is_link(entry: Path, outside: Path) -> None:
    shutil.move(entry.parent, outside / "toy")
    entry.parent.symlink_to(outside / "toy", target_is_directory=True)


def _meta_of_other_entry(entry: Path, outside: Path) -> None:
    shutil.copy(entry.parent / "test" / "meta.json", entry / "meta.json")


def _replaced_by(make: Callable[[Path], None]) -> Callable[[Path, Path], None]:
    def change(entry: Path, outside: Path) -> None:
        shutil.rmtree(entry)
        make(entry)

    return change


CASES: dict[str, Callable[[Path, Path], None]] = {
    "a flipped byte in an array": _flip_byte,
    "an extra file": lambda entry, outside: (entry / "notes.txt").write_text("extra"),
    "a missing array": lambda entry, outside: (entry / "labels.npy").unlink(),
    "meta.json of another entry": _meta_of_other_entry,
    "the entry folder is a link to a valid copy": _entry_is_link,
    "an array is a link to a valid copy": _array_is_link,
    "the model's staging folder is a link": _model_folder_is_link,
    "the entry is a file": _replaced_by(lambda entry: entry.write_bytes(b"not a folder")),
    "the entry is a named pipe": _replaced_by(os.mkfifo),
    "an empty folder": _replaced_by(Path.mkdir),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_staged_entry_that_is_not_byte_for_byte_the_entry_is_staged_again(case, packs, tmp_path, monkeypatch):
    _, pack = packs
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    staging = _stage_only(pack, store)
    CASES[case](staging / "toy" / "fit", outside)
    before = {str(p): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file() and not p.is_symlink()}
    staged: list[str] = []
    original = pack_module._stage_entry
    monkeypatch.setattr(
        pack_module, "_stage_entry", lambda p, m, d, *rest: (staged.append(d), original(p, m, d, *rest))[1]
    )
    summary = import_pack(pack, store)
    assert len(summary.entries) == 3
    # Only what changed is staged again: test and head are this pack's, byte for byte, and kept, unless they were
    # reached through the linked model folder (removed, the link itself, never followed).
    assert staged == (["fit", "test", "head"] if case == "the model's staging folder is a link" else ["fit"])
    _assert_holds(store, pack)
    after = {str(p): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file() and not p.is_symlink()}
    assert after == before  # nothing outside the store was followed, deleted or written


def test_an_intact_staged_entry_of_the_same_pack_is_kept(packs, tmp_path, monkeypatch):
    _, pack = packs
    store = tmp_path / "store"
    _stage_only(pack, store)
    monkeypatch.setattr(pack_module, "_stage_entry", lambda *args: pytest.fail(f"staged again: {args[1:3]}"))
    summary = import_pack(pack, store)
    assert len(summary.entries) == 3
    _assert_holds(store, pack)


def test_a_second_import_into_the_same_store_is_refused_while_one_stages(packs, tmp_path):
    _, pack = packs
    store = tmp_path / "store"
    (store / ".pack-import").mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
            "sys.stdin.read()",
            str(store / ".pack-import" / ".lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match="staging folder .* is being written by") as info:
            import_pack(pack, store)
        assert "\n" not in str(info.value)
        assert not (store / "toy").exists()
    finally:
        holder.communicate("")
    import_pack(pack, store)  # the lock is released with its holder
    _assert_holds(store, pack)
