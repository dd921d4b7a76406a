"""A run directory verifies the store entries it reads once, and again whenever an entry's files changed since."""

from __future__ import annotations

import os

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.core.errors import StoreError
from oodbench.core.rundir import RunDir

pytestmark = pytest.mark.hostile

PROV = {"model": "m", "checkpoint": "c", "preprocessing": {}}


def _verified_run(tmp_path):
    store = Store(tmp_path / "store")
    rng = np.random.default_rng(0)
    store.write_outputs("m", "feat", Outputs(rng.normal(size=(50, 8)).astype(np.float32)), provenance=PROV)
    run = RunDir(tmp_path / "run")
    assert run.verify_store(store, "m", ["feat"]).startswith("verified 1 store entries")
    run.path.mkdir()
    run.write_info({"model": "m", "complete": True})  # the record is written with the run description
    assert run.verify_store(store, "m", ["feat"]).startswith("store entries already verified")
    return store, run


@pytest.mark.parametrize("where", ["first data byte", "middle", "last byte"])
def test_a_flipped_byte_in_a_verified_features_only_entry_is_found(tmp_path, where):
    store, run = _verified_run(tmp_path)
    path = store.entry_path("m", "feat") / "features.npy"
    data = bytearray(path.read_bytes())
    at = {"first data byte": len(data) - 50 * 8 * 4, "middle": len(data) - 800, "last byte": len(data) - 1}[where]
    data[at] ^= 0x40
    before = os.stat(path)
    path.write_bytes(bytes(data))  # same size: the cheap reads see nothing
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))  # a distinct mtime on coarse clocks
    with pytest.raises(StoreError, match="features.npy: rows .* changed since they were written"):
        run.verify_store(store, "m", ["feat"])


def test_an_entry_replaced_by_a_copy_with_the_same_times_is_verified_again(tmp_path):
    store, run = _verified_run(tmp_path)
    path = store.entry_path("m", "feat") / "features.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    info = os.stat(path)
    replacement = path.with_name("features.new")
    replacement.write_bytes(bytes(data))
    os.utime(replacement, ns=(info.st_atime_ns, info.st_mtime_ns))  # same size and mtime, another inode
    os.replace(replacement, path)
    with pytest.raises(StoreError, match="changed since they were written"):
        run.verify_store(store, "m", ["feat"])
