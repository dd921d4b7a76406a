"""Store.finalize: shards are released as they are merged (disk ≤ entry + one shard), and every step resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.core import store as store_module

PROV = {"model": "m", "checkpoint": "abc", "preprocessing": {"size": 8}}
ROWS, SHARD = 20, 8  # three shards, the last one short


class Interrupted(Exception):
    """A simulated kill between two steps of the merge."""


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """Simulated kills do not lose the page cache: skip the (slow) fsyncs."""
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: None)


class KillAt:
    """A `_merge_step` hook that raises at its `at`-th call (counting from 0)."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, step: str) -> None:
        self.calls += 1
        if self.calls - 1 == self.at:
            raise Interrupted(step)


def _outputs() -> Outputs:
    rng = np.random.default_rng(0)
    return Outputs(
        rng.normal(size=(ROWS, 600)).astype(np.float32),  # wide rows: data, not .npy headers, dominate the bytes
        labels=rng.integers(0, 4, ROWS),
        extras={"aux": rng.normal(size=(ROWS, 3)).astype(np.float16)},
    )


def _writer(root: Path):
    return Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)


def _write_shards(root: Path, outputs: Outputs):
    writer = _writer(root)
    for shard in writer.pending_shards():
        rows = writer.shard_rows(shard)
        writer.write_shard(
            shard,
            {
                "features": outputs.features[rows],
                "labels": outputs.labels[rows],
                "index": np.arange(rows.start, rows.stop),
                "extra.aux": outputs.extras["aux"][rows],
            },
        )
    return writer


def _data_bytes(root: Path) -> int:
    """Bytes of array data on disk (shards, partial and final files; not the small JSON records)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.name.endswith(".json"))


def _assert_complete(root: Path, outputs: Outputs) -> None:
    back = Store(root).read("m", "ds")
    for name in ("features", "labels"):
        np.testing.assert_array_equal(getattr(back, name), getattr(outputs, name))
    np.testing.assert_array_equal(back.extras["aux"], outputs.extras["aux"])
    np.testing.assert_array_equal(Store(root).read_array("m", "ds", "index"), np.arange(ROWS))
    assert not (root / "m" / "ds" / "shards").exists()
    assert not list((root / "m" / "ds").glob(".*partial"))


def _steps(tmp_path: Path, monkeypatch) -> list[str]:
    """The merge's steps in an uninterrupted run, with the disk it held at each."""
    seen: list[str] = []
    monkeypatch.setattr(store_module, "_merge_step", seen.append)
    _write_shards(tmp_path / "clean", _outputs()).finalize()
    return seen


def test_finalize_needs_at_most_the_entry_plus_one_shard(tmp_path, monkeypatch):
    root = tmp_path / "s"
    writer = _write_shards(root, _outputs())
    shard_sizes = [p.stat().st_size for p in (root / "m" / "ds" / "shards").glob("*.npy")]
    before = _data_bytes(root)
    peaks = []
    monkeypatch.setattr(store_module, "_merge_step", lambda step: peaks.append(_data_bytes(root)))
    writer.finalize()
    final = _data_bytes(root)
    # The shards themselves, plus at most one shard copied but not yet released (and the partial file's header).
    assert max(peaks) <= before + max(shard_sizes) + 128
    assert before <= final + len(shard_sizes) * 128  # the shards are the entry, plus one .npy header each
    # The old merge kept every shard until the end: the entry twice over. This one releases them as it goes.
    assert max(peaks) < 1.5 * final


def test_killed_at_every_step_resumes_to_identical_arrays(tmp_path, monkeypatch):
    outputs = _outputs()
    steps = _steps(tmp_path, monkeypatch)
    assert len(steps) == 3 + 4 * (3 * 3 + 1)  # planned/merged/completed; per array: 3 shards x 3 steps, rename
    for kill_at, step in enumerate(steps):
        root = tmp_path / f"kill{kill_at}"
        writer = _write_shards(root, outputs)
        monkeypatch.setattr(store_module, "_merge_step", KillAt(kill_at))
        with pytest.raises(Interrupted, match=step):
            writer.finalize()
        monkeypatch.setattr(store_module, "_merge_step", lambda name: None)
        resumed = _writer(root)
        assert resumed.pending_shards() == []  # released shards still count as written: no re-extraction
        resumed.finalize()
        _assert_complete(root, outputs)


def test_repeatedly_killed_finalize_completes(tmp_path, monkeypatch):
    """Each run is killed at its third step: after the plan, one copy and its record, so each run progresses."""
    outputs = _outputs()
    root = tmp_path / "s"
    _write_shards(root, outputs)
    runs = 0
    while not Store(root).exists("m", "ds"):
        monkeypatch.setattr(store_module, "_merge_step", KillAt(2))
        runs += 1
        try:
            _writer(root).finalize()
        except Interrupted:
            pass
        assert runs < 100
    monkeypatch.setattr(store_module, "_merge_step", lambda name: None)
    _writer(root).finalize()
    _assert_complete(root, outputs)
    assert runs > 10  # it really was interrupted all along the way


def _raise(name: str) -> None:
    raise Interrupted(name)


def test_writing_a_shard_while_finalizing_is_refused(tmp_path, monkeypatch):
    outputs = _outputs()
    writer = _write_shards(tmp_path, outputs)
    monkeypatch.setattr(store_module, "_merge_step", _raise)
    with pytest.raises(Interrupted):
        writer.finalize()
    with pytest.raises(store_module.StoreError, match="finaliz"):
        _writer(tmp_path).write_shard(0, {"features": outputs.features[:SHARD]})


def test_lost_partial_file_is_reported(tmp_path, monkeypatch):
    writer = _write_shards(tmp_path, _outputs())
    monkeypatch.setattr(store_module, "_merge_step", KillAt(3))
    with pytest.raises(Interrupted):
        writer.finalize()  # killed once the first shard of the first array is released
    for partial in (tmp_path / "m" / "ds").glob(".*partial"):
        partial.unlink()
    monkeypatch.setattr(store_module, "_merge_step", lambda name: None)
    with pytest.raises(store_module.StoreError, match="extract it again"):
        _writer(tmp_path).finalize()


def test_empty_entry_finalizes(tmp_path):
    writer = Store(tmp_path).writer("m", "empty", provenance=PROV, num_items=0, shard_size=4)
    meta = writer.finalize()
    assert meta["complete"] and meta["arrays"] == {} and meta["num_rows"] == 0
