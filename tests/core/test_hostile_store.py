"""Hostile files planted in a shared feature store: links, FIFOs, devices, directories and link loops.

Every file a store opens, for reading or for writing, must be a regular file reached without a final link: a
link planted as an entry's lock file must not let the next writer (or `delete`) empty a file outside the store,
a FIFO must not hang a read, and a link to a valid file elsewhere must not be read in its place. Each case
checks one line (a `StoreError`), that the victim outside the store is intact, and that the operation ended
(a FIFO that an old version would block on is unblocked by the test, which then fails).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.core.errors import StoreError

from ..hostile import bounded

pytestmark = pytest.mark.hostile

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
VICTIM = b"precious bytes outside the store\n"
KINDS = ("link-to-victim", "link-to-copy", "link-to-dev-zero", "fifo", "directory", "link-loop")


def _toy_store(root: Path) -> Store:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, np.float32)
    store = Store(root)
    z = rng.normal(size=(20, 4)).astype(np.float32)
    store.write_outputs("toy", "fit", Outputs(z, z @ weight.T, rng.integers(0, 3, 20)), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


@pytest.fixture(scope="module")
def toy_template(tmp_path_factory) -> Path:
    """One toy store written through `Store`, which each case copies (writing it costs more than the case)."""
    root = tmp_path_factory.mktemp("template") / "store"
    _toy_store(root)
    return root


def _copy_of(template: Path, root: Path) -> Store:
    """A fresh store with the template's files (regular files and folders only, times kept)."""
    shutil.copytree(template, root, symlinks=True)
    return Store(root)


def _plant(path: Path, kind: str, victim: Path) -> None:
    """Replace `path` with a hostile object of `kind` (`link-to-copy` links to a copy of the file it replaces)."""
    original = path.read_bytes() if path.is_file() else VICTIM
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "link-to-victim":
        path.symlink_to(victim)
    elif kind == "link-to-copy":
        copy = victim.parent / f"copy-of-{path.name}"
        copy.write_bytes(original)
        path.symlink_to(copy)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link-loop":
        other = path.with_name(path.name + ".loop")
        path.symlink_to(other.name)
        other.symlink_to(path.name)


def _assert_refused(exc: BaseException | None, victim: Path) -> None:
    assert isinstance(exc, StoreError), f"expected a StoreError, got {exc!r}"
    assert "\n" not in str(exc), str(exc)
    assert victim.read_bytes() == VICTIM


READ_TARGETS = {
    "entry meta.json": ("toy/fit/meta.json", lambda s: s.read("toy", "fit")),
    "entry features.npy": ("toy/fit/features.npy", lambda s: np.asarray(s.read("toy", "fit").features)),
    "entry logits.npy": ("toy/fit/logits.npy", lambda s: np.asarray(s.read("toy", "fit").logits)),
    "entry labels.npy": ("toy/fit/labels.npy", lambda s: np.asarray(s.read("toy", "fit").labels)),
    "entry index.npy": ("toy/fit/index.npy", lambda s: s.read_array("toy", "fit", "index")),
    "entry verify": ("toy/fit/features.npy", lambda s: s._raise_damage(s.verify("toy", "fit"))),
    "head meta.json": ("toy/head/meta.json", lambda s: s.read_head("toy")),
    "head weight.npy": ("toy/head/weight.npy", lambda s: s.read_head("toy")),
    "head bias.npy": ("toy/head/bias.npy", lambda s: s.read_head("toy")),
    "head verify": ("toy/head/bias.npy", lambda s: s._raise_damage(s.verify_head("toy"))),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", sorted(READ_TARGETS))
def test_a_planted_file_is_never_read(tmp_path, toy_template, target, kind):
    store = _copy_of(toy_template, tmp_path / "store")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    relative, read = READ_TARGETS[target]
    path = store.root / relative
    _plant(path, kind, victim)
    _assert_refused(bounded(lambda: read(store), path if kind == "fifo" else None), victim)


WRITE_TARGETS = {
    "writer of a new entry": (
        "toy/.new.lock",
        lambda s: s.writer("toy", "new", provenance=PROV, num_items=4, shard_size=2),
    ),
    "write_outputs": (
        "toy/.new.lock",
        lambda s: s.write_outputs("toy", "new", Outputs(np.ones((4, 4), np.float32)), provenance=PROV),
    ),
    "overwrite": (
        "toy/.fit.lock",
        lambda s: s.write_outputs("toy", "fit", Outputs(np.ones((4, 4), np.float32)), provenance=PROV, overwrite=True),
    ),
    "delete": ("toy/.fit.lock", lambda s: s.delete("toy", "fit")),
    "write_head": (
        "toy/.head.lock",
        lambda s: s.write_head("toy", Head(np.ones((3, 4), np.float32), np.zeros(3, np.float32)), provenance=PROV),
    ),
}


@pytest.mark.parametrize("kind", ("link-to-victim", "link-to-dev-zero", "fifo", "directory", "link-loop"))
@pytest.mark.parametrize("target", sorted(WRITE_TARGETS))
def test_a_planted_lock_file_is_never_opened(tmp_path, toy_template, target, kind):
    store = _copy_of(toy_template, tmp_path / "store")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    relative, write = WRITE_TARGETS[target]
    _plant(store.root / relative, kind, victim)
    exc = bounded(lambda: write(store), None)
    _assert_refused(exc, victim)
    assert "lock" in str(exc)
    assert store.entry_path("toy", "fit").is_dir()  # delete and overwrite did nothing


@pytest.mark.parametrize("kind", ("link-to-victim", "fifo", "directory"))
def test_a_planted_partial_file_is_never_written_by_finalize(tmp_path, kind):
    store = Store(tmp_path / "store")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    writer = store.writer("toy", "ds", provenance=PROV, num_items=4, shard_size=2)
    for shard in range(2):
        writer.write_shard(shard, {"features": np.full((2, 4), shard, np.float32)})
    _plant(store.entry_path("toy", "ds") / ".features.npy.partial", kind, victim)
    _assert_refused(bounded(writer.finalize, None), victim)
    writer.close()


def test_a_store_root_reached_through_a_link_still_works(tmp_path):
    """Only links inside the store are refused: a store folder that is itself a link is the user's choice."""
    _toy_store(tmp_path / "real")
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    store = Store(tmp_path / "linked")
    assert store.read("toy", "fit").features.shape == (20, 4)
    store.delete("toy", "fit")
    assert not (tmp_path / "real" / "toy" / "fit").exists()
    shutil.rmtree(tmp_path / "real")
