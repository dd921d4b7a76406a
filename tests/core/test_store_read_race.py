"""A reader racing a writer that overwrites the entry: the arrays it returns come from one writer, with that
writer's metadata, never a mix; when the entry keeps changing, one line says so.

The race is made deterministic: the overwrite runs inside the reader, between the opening of two arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.core.errors import StoreError

pytestmark = pytest.mark.hostile

PROV = {"model": "m", "checkpoint": "c", "preprocessing": {}}
ROWS = 12


def _outputs(seed: int) -> Outputs:
    """Data that says which writer wrote it: every feature and every label equals `seed`."""
    return Outputs(np.full((ROWS, 4), seed, np.float32), labels=np.full(ROWS, seed, np.int64))


def _write(store: Store, seed: int) -> None:
    store.write_outputs("m", "ds", _outputs(seed), provenance=PROV, item_hash=f"items-{seed}", overwrite=True)


@pytest.mark.parametrize("after", ["features", "labels", "index"])
@pytest.mark.parametrize("overwrites", [1, 2, 4])
def test_a_read_racing_an_overwrite_returns_one_writers_data(tmp_path, monkeypatch, after, overwrites):
    store = Store(tmp_path)
    _write(store, 1)
    original, done = Store._load, []

    def racing_load(self, model_id, dataset_id, name, meta, mmap):
        array = original(self, model_id, dataset_id, name, meta, mmap)
        if name == after and len(done) < overwrites:  # another process overwrites the entry right now
            done.append(True)
            _write(store, len(done) + 1)
        return array

    monkeypatch.setattr(Store, "_load", racing_load)
    back = store.read("m", "ds", mmap=False)
    seed = int(back.features[0, 0])
    assert (back.features == seed).all() and (back.labels == seed).all()
    assert back.provenance["item_hash"] == f"items-{seed}"
    assert seed == overwrites + 1  # the last writer's data, read once the entry stopped changing


def test_an_entry_that_never_stops_changing_is_one_line(tmp_path, monkeypatch):
    store = Store(tmp_path)
    _write(store, 1)
    original, count = Store._load, [1]

    def always_racing(self, model_id, dataset_id, name, meta, mmap):
        array = original(self, model_id, dataset_id, name, meta, mmap)
        count[0] += 1
        _write(store, count[0])
        return array

    monkeypatch.setattr(Store, "_load", always_racing)
    with pytest.raises(StoreError, match="changed while it was read") as info:
        store.read("m", "ds")
    assert "\n" not in str(info.value)
