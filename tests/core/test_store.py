"""Feature store: round trip, atomic shards, resume after a killed writer, provenance checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.core.errors import StoreError

PROV = {"model": "m", "checkpoint": "abc", "preprocessing": {"size": 8}}


def random_outputs(n=50, d=6, c=4, seed=0):
    rng = np.random.default_rng(seed)
    return Outputs(
        rng.normal(size=(n, d)).astype(np.float32),
        rng.normal(size=(n, c)).astype(np.float32),
        rng.integers(0, c, n),
        {"aux": rng.normal(size=(n, 3)).astype(np.float16)},
    )


def test_round_trip_is_memory_mapped(tmp_path):
    store = Store(tmp_path)
    out = random_outputs()
    store.write_outputs("m", "ds", out, provenance=PROV, shard_size=7)
    back = store.read("m", "ds")
    assert isinstance(back.features, np.memmap)
    for name in ("features", "logits", "labels"):
        assert np.array_equal(getattr(back, name), getattr(out, name))
    assert np.array_equal(back.extras["aux"], out.extras["aux"])
    assert np.array_equal(store.read_array("m", "ds", "index"), np.arange(50))
    meta = store.meta("m", "ds")
    assert meta["complete"] and meta["num_shards"] == 8 and meta["provenance"] == PROV
    assert "numpy" in meta["versions"]
    assert not (tmp_path / "m" / "ds" / "shards").exists()
    assert store.models() == ["m"] and store.datasets("m") == ["ds"]


def test_writing_empty_outputs_fails_and_leaves_no_entry(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StoreError, match="m/empty: the outputs have no rows"):
        store.write_outputs("m", "empty", Outputs(np.zeros((0, 6), np.float32)), provenance=PROV)
    assert not store.exists("m", "empty") and not (tmp_path / "m" / "empty").exists()


def test_head_round_trip(tmp_path):
    store = Store(tmp_path)
    head = Head(np.ones((3, 2), np.float32), np.zeros(3, np.float32))
    store.write_head("m", head, provenance=PROV)
    back = store.read_head("m")
    assert np.array_equal(back.weight, head.weight) and store.has_head("m")


def test_incomplete_entry_is_refused_and_resumes(tmp_path):
    store = Store(tmp_path)
    out = random_outputs(20)
    writer = store.writer("m", "ds", provenance=PROV, num_items=20, shard_size=5)
    writer.write_shard(0, {"features": out.features[:5]})
    with pytest.raises(StoreError, match="incomplete"):
        store.read("m", "ds")
    again = store.writer("m", "ds", provenance=PROV, num_items=20, shard_size=5)
    assert again.pending_shards() == [1, 2, 3]
    for k in again.pending_shards():
        again.write_shard(k, {"features": out.features[again.shard_rows(k)]})
    again.finalize()
    assert np.array_equal(store.read("m", "ds").features, out.features)


def test_resume_with_other_provenance_is_refused(tmp_path):
    store = Store(tmp_path)
    store.writer("m", "ds", provenance=PROV, num_items=10, shard_size=5)
    with pytest.raises(StoreError, match="different provenance"):
        store.writer("m", "ds", provenance={**PROV, "checkpoint": "other"}, num_items=10, shard_size=5)


def test_truncated_shard_file_is_not_accepted(tmp_path):
    store = Store(tmp_path)
    writer = store.writer("m", "ds", provenance=PROV, num_items=10, shard_size=5)
    writer.write_shard(0, {"features": np.ones((5, 3), np.float32)})
    shard_file = tmp_path / "m" / "ds" / "shards" / "features.00000.npy"
    shard_file.write_bytes(shard_file.read_bytes()[:-4])
    assert store.writer("m", "ds", provenance=PROV, num_items=10, shard_size=5).pending_shards() == [0, 1]


def test_mismatched_provenance_and_foreign_directory(tmp_path):
    store = Store(tmp_path)
    out = random_outputs(10)
    store.write_outputs("m", "a", out, provenance=PROV)
    store.write_outputs("m", "b", out, provenance={**PROV, "checkpoint": "zzz"})
    store.write_outputs("m", "c", out, provenance={**PROV, "preprocessing": {"size": 9}})
    with pytest.raises(StoreError, match="mismatched model provenance.*checkpoint"):
        store.check_compatible(("m", "a"), ("m", "b"))
    with pytest.raises(StoreError, match="preprocessing"):
        store.check_compatible(("m", "a"), ("m", "c"))
    # A directory copied from another model is refused, not silently read.
    os.makedirs(tmp_path / "other")
    os.rename(tmp_path / "m" / "a", tmp_path / "other" / "a")
    with pytest.raises(StoreError, match="copied or renamed from another model"):
        store.read("other", "a")


def test_invalid_ids(tmp_path):
    with pytest.raises(StoreError, match="invalid model id"):
        Store(tmp_path).entry_path("../x", "d")
    with pytest.raises(StoreError, match="no store entry"):
        Store(tmp_path).read("m", "missing")


WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import oodbench.core.store as store_module
    from oodbench.core.store import Store
    root, signal_file, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 100_000)).astype(np.float32)
    if mode == "marker":
        real = store_module.atomic_write_json
        def slow(path, payload):
            # Block forever just before shard 2's completion marker: the parent kills us here.
            if str(path).endswith("00002.done.json"):
                open(signal_file, "w").close()
                time.sleep(600)
            real(path, payload)
        store_module.atomic_write_json = slow
    writer = Store(root).writer("m", "ds", provenance={"model": "m"}, num_items=40, shard_size=10)
    for k in writer.pending_shards():
        writer.write_shard(k, {"features": features[writer.shard_rows(k)]})
        if mode == "random":
            open(signal_file, "w").close()
    writer.finalize()
""")


def _finish(root: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 100_000)).astype(np.float32)
    writer = Store(root).writer("m", "ds", provenance={"model": "m"}, num_items=40, shard_size=10)
    for k in writer.pending_shards():
        writer.write_shard(k, {"features": features[writer.shard_rows(k)]})
    writer.finalize()
    return features


@pytest.mark.parametrize("mode", ["marker", "random"])
def test_killed_writer_leaves_no_accepted_partial_shard(tmp_path, mode):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    signal_file = tmp_path / "signal"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(signal_file), mode])
    deadline = time.time() + 120
    while not signal_file.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = Store(tmp_path / "store")
    writer = store.writer("m", "ds", provenance={"model": "m"}, num_items=40, shard_size=10)
    done = writer.completed_shards()
    if mode == "marker":
        assert done == {0, 1}
        # shard 2's array file is complete on disk, but without its marker nobody accepts it.
        assert (tmp_path / "store" / "m" / "ds" / "shards" / "features.00002.npy").exists()
    assert done == set(range(len(done)))  # complete shards are exactly those written before the kill
    if not writer.complete:
        with pytest.raises(StoreError, match="incomplete"):
            store.read("m", "ds")
    expected = _finish(tmp_path / "store")
    back = store.read("m", "ds")
    assert back.features.tobytes() == expected.tobytes()
    assert json.loads((tmp_path / "store" / "m" / "ds" / "meta.json").read_text())["complete"]
