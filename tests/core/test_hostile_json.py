"""Damaged JSON files that a store reads back (shards/merge.json, shard done markers): checked before use.

A damaged merge record (``{"plan":{},"arrays":[]}``, ``"copied":"1"``) crashed the resumed finalize with exit 1;
each case here must end in one `StoreError` line, and `describe_incomplete` must still describe the entry.
A damaged done marker counts as absent: its shard is written again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oodbench import Store
from oodbench.core import store as store_module
from oodbench.core.errors import StoreError

pytestmark = pytest.mark.hostile

PROV = {"model": "m", "checkpoint": "abc", "preprocessing": {}}
ROWS, SHARD = 6, 2  # three shards


class Interrupted(Exception):
    """A simulated kill right after the merge's plan was recorded."""


def _set(path: list, value):
    def edit(state: dict) -> dict:
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return state

    return edit


def _drop(path: list):
    def edit(state: dict) -> dict:
        target = state
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return state

    return edit


MERGE_DAMAGE = {
    "empty plan, arrays a list": lambda s: {"plan": {}, "arrays": []},
    "copied a string": _set(["arrays", "features", "copied"], "1"),
    "copied negative": _set(["arrays", "features", "copied"], -1),
    "copied beyond the shards": _set(["arrays", "features", "copied"], 99),
    "copied a bool": _set(["arrays", "features", "copied"], True),
    "copied a float": _set(["arrays", "features", "copied"], 1.0),
    "copied null": _set(["arrays", "features", "copied"], None),
    "not an object": lambda s: [s],
    "plan a list": _set(["plan"], []),
    "plan missing": _drop(["plan"]),
    "arrays missing": _drop(["arrays"]),
    "unknown top field": _set(["evil"], 1),
    "a shard missing from the plan": _drop(["plan", "1"]),
    "an extra shard in the plan": lambda s: _set(["plan", "7"], s["plan"]["0"])(s),
    "a shard key not a number": lambda s: _set(["plan", "../0"], s["plan"]["0"])(s),
    "rows a string": _set(["plan", "0", "rows"], "2"),
    "rows negative": _set(["plan", "0", "rows"], -2),
    "rows huge": _set(["plan", "0", "rows"], 10**30),
    "rows not summing to the shape": _set(["plan", "0", "rows"], 1),
    "shape a string": _set(["arrays", "features", "shape"], "6,4"),
    "shape empty": _set(["arrays", "features", "shape"], []),
    "shape negative": _set(["arrays", "features", "shape"], [6, -4]),
    "shape huge": _set(["arrays", "features", "shape"], [6, 10**30]),
    "dtype object": _set(["arrays", "features", "dtype"], "O"),
    "dtype nonsense": _set(["arrays", "features", "dtype"], "not a dtype"),
    "dtype a number": _set(["arrays", "features", "dtype"], 4),
    "dtype differs from the shards": _set(["arrays", "features", "dtype"], "float64"),
    "array name with a path": lambda s: _set(["arrays", "../../evil"], s["arrays"]["features"])(s),
    "array name with a newline": lambda s: _set(["arrays", "extra.x\n"], s["arrays"]["features"])(s),
    "an array the shards lack": lambda s: _set(["arrays", "extra.ghost"], s["arrays"]["features"])(s),
    "shard arrays a list": _set(["plan", "0", "arrays"], []),
    "shard nbytes a string": _set(["plan", "0", "arrays", "features", "nbytes"], "100"),
    "shard sha256 not hex": _set(["plan", "0", "arrays", "features", "sha256"], "z" * 64),
    "shard sha256 a number": _set(["plan", "0", "arrays", "features", "sha256"], 5),
    "shard record unknown field": _set(["plan", "0", "evil"], 1),
    "extra_meta a list": _set(["extra_meta"], [1]),
    "nested deeply": _set(["extra_meta"], json.loads("[" * 50 + "]" * 50)),
}


def _interrupted_entry(root: Path, monkeypatch) -> Path:
    writer = Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    for shard in range(3):
        writer.write_shard(shard, {"features": np.full((2, 4), shard, np.float32)})

    def kill(step: str) -> None:
        if step == "planned":
            raise Interrupted(step)

    monkeypatch.setattr(store_module, "_merge_step", kill)
    with pytest.raises(Interrupted):
        writer.finalize()
    writer.close()
    monkeypatch.undo()
    return root / "m" / "ds" / "shards" / "merge.json"


@pytest.mark.parametrize("damage", sorted(MERGE_DAMAGE))
def test_a_damaged_merge_record_is_one_line_on_resume(tmp_path, monkeypatch, damage):
    merge = _interrupted_entry(tmp_path, monkeypatch)
    state = json.loads(merge.read_text())
    merge.write_text(json.dumps(MERGE_DAMAGE[damage](state)))
    store = Store(tmp_path)
    described = store.describe_incomplete("m", "ds")
    assert "\n" not in described and "finaliz" in described
    writer = store.writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    with pytest.raises(StoreError) as info:
        writer.finalize()
    writer.close()
    assert "\n" not in str(info.value) and "merge.json" in str(info.value)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "m" / "evil").exists()


def test_an_undamaged_merge_record_resumes(tmp_path, monkeypatch):
    _interrupted_entry(tmp_path, monkeypatch)
    store = Store(tmp_path)
    writer = store.writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    writer.finalize()
    assert store.read("m", "ds").features[:, 0].tolist() == [0, 0, 1, 1, 2, 2]


MARKER_DAMAGE = {
    "rows a string": _set(["rows"], "2"),
    "rows a bool": _set(["rows"], True),
    "rows huge": _set(["rows"], 10**30),
    "arrays a list": _set(["arrays"], []),
    "shape a string": _set(["arrays", "features", "shape"], "2,4"),
    "nbytes a float": _set(["arrays", "features", "nbytes"], 1.5),
    "sha256 a number": _set(["arrays", "features", "sha256"], 1),
    "not an object": lambda s: [s],
    "unknown field": _set(["evil"], 1),
}


@pytest.mark.parametrize("damage", sorted(MARKER_DAMAGE))
def test_a_damaged_done_marker_counts_as_not_written(tmp_path, damage):
    store = Store(tmp_path)
    writer = store.writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    for shard in range(3):
        writer.write_shard(shard, {"features": np.full((2, 4), shard, np.float32)})
    marker = tmp_path / "m" / "ds" / "shards" / "00001.done.json"
    marker.write_text(json.dumps(MARKER_DAMAGE[damage](json.loads(marker.read_text()))))
    assert writer.pending_shards() == [1]
    writer.write_shard(1, {"features": np.full((2, 4), 1, np.float32)})
    writer.finalize()
    assert store.read("m", "ds").features[:, 0].tolist() == [0, 0, 1, 1, 2, 2]


RUN_INFO_DAMAGE = {
    "kind unknown": {"kind": "evil"},
    "kind a number": {"kind": 1},
    "complete a string": {"complete": "yes"},
    "score_keys a list": {"score_keys": ["msp"]},
    "a score key a number": {"score_keys": {"msp": 1}},
    "ood_datasets a string": {"ood_datasets": "ninco"},
    "an ood dataset a number": {"ood_datasets": [1]},
    "detectors a list": {"detectors": ["msp"]},
    "a detector's parameters a string": {"detectors": {"msp": "T=1"}},
    "entries a list": {"entries": []},
    "head a string": {"head": "w"},
    "model a number": {"model": 5},
    "store a list": {"store": ["/"]},
}


@pytest.mark.parametrize("damage", sorted(RUN_INFO_DAMAGE))
def test_a_damaged_run_description_is_one_line(tmp_path, damage):
    from oodbench.core.errors import RunDirError
    from oodbench.core.rundir import RunDir

    run = RunDir(tmp_path)
    run.info_path.write_text(json.dumps({"model": "m", "complete": True, **RUN_INFO_DAMAGE[damage]}))
    with pytest.raises(RunDirError) as info:
        run.read_info()
    assert "\n" not in str(info.value) and "run.json" in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_run_description_that_is_a_fifo_or_a_link_is_refused(tmp_path, kind):
    import os

    from oodbench.core.errors import RunDirError
    from oodbench.core.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"model": "m"}))
    if kind == "fifo":
        os.mkfifo(run.info_path)
    else:
        run.info_path.symlink_to(outside)
    with pytest.raises(RunDirError, match="run.json"):
        run.read_info()


def test_the_run_descriptions_oodbench_writes_are_valid(tmp_path):
    """A zero-shot run has no fit set or head (null): the schema takes what the writers write."""
    from oodbench.core.rundir import RunDir

    run = RunDir(tmp_path)
    for info in (
        {
            "kind": "zeroshot",
            "model": "clip",
            "fit_dataset": None,
            "id_dataset": "in1k",
            "head": None,
            "complete": True,
        },
        {"model": "m", "fit_dataset": "fit", "id_dataset": "id", "ood_datasets": ["o"], "score_keys": {"msp": "k"}},
    ):
        run.info_path.write_text(json.dumps(info))
        assert run.read_info() == info
