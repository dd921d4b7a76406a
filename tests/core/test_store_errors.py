"""A malformed or unfinished store entry gets one line and exit status 2, saying what is there and what to do.

Malformed meta.json (not UTF-8, a JSON list, no arrays, empty features, an array name that leaves the entry),
and entries interrupted while writing shards or while finalizing: `evaluate`, `store ls` and `store verify`
name the entry and the problem; an unfinished entry says how far it got and the command that finishes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core import store as store_module
from oodbench.core.errors import StoreError

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
EVALUATE = ["evaluate", "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood", "--no-progress", "-d", "msp"]


def _toy_store(root: Path) -> Store:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, np.float32)
    store = Store(root)
    for name in ("fit", "id", "ood"):
        z = rng.normal(size=(20, 4)).astype(np.float32)
        store.write_outputs("toy", name, Outputs(z, z @ weight.T, rng.integers(0, 3, 20)), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error: ") for line in lines) == 1, err
    return lines[-1]


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def _empty_features(entry: Path) -> None:
    """The entry keeps its arrays' columns but no rows (as if every item had been skipped)."""
    meta = json.loads((entry / "meta.json").read_text())
    for name, spec in meta["arrays"].items():
        spec["shape"][0] = 0
        del spec["sha256"], spec["header_sha256"]
        np.save(entry / f"{name}.npy", np.zeros(spec["shape"], dtype=spec["dtype"]))
    meta["num_rows"], meta["checksum_rows"], meta["format"] = 0, [], 1
    (entry / "meta.json").write_text(json.dumps(meta))


MALFORMED = [
    ("non-utf8", lambda e: (e / "meta.json").write_bytes(b'{"format": 2, "model_id": "toy\xff\xfe"}'), "not UTF-8"),
    ("json-list", lambda e: (e / "meta.json").write_text("[1, 2, 3]"), "must hold a JSON object, not a list"),
    ("no-arrays", lambda e: _edit_meta(e / "meta.json", lambda m: m.pop("arrays")), "lists no arrays"),
    (
        "empty-features",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"].update(features={})),
        "array 'features' has an invalid shape None",
    ),
    (
        "features-of-no-columns",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"]["features"].update(shape=[20, 0])),
        "features must be 2-D (N, D) with D >= 1",
    ),
    (
        "no-features",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"].pop("features")),
        "no features array",
    ),
    (
        "escaping-array-name",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"].update({"../../../x": m["arrays"]["labels"]})),
        "invalid array name '../../../x'",
    ),
    (
        "bad-shape",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"]["logits"].update(shape=[20, -3])),
        "invalid shape",
    ),
    (
        "object-dtype",
        lambda e: _edit_meta(e / "meta.json", lambda m: m["arrays"]["logits"].update(dtype="O")),
        "invalid dtype",
    ),
    ("newer-format", lambda e: _edit_meta(e / "meta.json", lambda m: m.update(format=99)), "newer oodbench"),
]


@pytest.mark.parametrize(("damage", "message"), [pytest.param(d, m, id=n) for n, d, m in MALFORMED])
def test_malformed_meta_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, damage, message):
    monkeypatch.setenv("OODBENCH_LOG_DIR", str(tmp_path / "logs"))
    _toy_store(tmp_path / "s")
    damage(tmp_path / "s" / "toy" / "fit")
    code, _, err = _run([*EVALUATE, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and message in _error_line(err)
    assert not (tmp_path / "run" / "run.json").exists()  # refused before anything was written
    code, out, err = _run(["store", "ls", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "1 store entries are unreadable (listed above): toy/fit" in _error_line(err)
    assert "  fit: unreadable: " in out and message in out
    assert "  id: complete; " in out  # the other entries are still listed
    code, out, err = _run(["store", "verify", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "toy/fit" in _error_line(err)
    assert not (tmp_path / "logs").exists()  # nothing unexpected happened


@pytest.mark.parametrize("dataset", ["fit", "id"])
def test_an_entry_of_no_rows_is_listed_as_such_and_not_evaluated(tmp_path, capsys, dataset):
    """Every item of a set skipped as unreadable: a well-formed entry of no rows, which nothing can evaluate."""
    _toy_store(tmp_path / "s")
    _empty_features(tmp_path / "s" / "toy" / dataset)
    code, out, _ = _run(["store", "ls", "--store", str(tmp_path / "s")], capsys)
    assert code == 0 and f"  {dataset}: complete, but holds no rows\n" in out
    argv = [*EVALUATE[:-1], "knn", "-p", "knn.k=2", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run")]
    code, _, err = _run(argv, capsys)
    expected = "fit dataset 'fit' is empty" if dataset == "fit" else "ID test dataset 'id' is empty"
    assert code == 2 and _error_line(err) == f"error: {expected}"
    assert not (tmp_path / "run").exists()  # verified, then refused: nothing written, not even verified.json


def _start_entry(root: Path, monkeypatch) -> Store.writer:
    """An extraction of 20 items in shards of 8, as `oodbench extract` would record it."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/oodbench", "extract", "--model", "toy", "--dataset", "fit"])
    return Store(root).writer("toy", "fit", provenance=PROV, num_items=20, shard_size=8, item_hash="h")


def _shard(writer, k: int) -> None:
    rows = writer.shard_rows(k)
    n = rows.stop - rows.start
    writer.write_shard(k, {"features": np.ones((n, 4), np.float32), "index": np.arange(rows.start, rows.stop)})


def test_an_entry_killed_while_writing_shards_says_how_far_it_got(tmp_path, monkeypatch, capsys):
    _toy_store(tmp_path / "s")
    Store(tmp_path / "s").delete("toy", "fit")
    writer = _start_entry(tmp_path / "s", monkeypatch)
    _shard(writer, 0)
    _shard(writer, 2)
    writer.close()  # the process ended here
    expected = (
        "2 of 3 shards written (12 rows of 20 items); to finish it, rerun "
        "`oodbench extract --model toy --dataset fit` (only the missing shards are computed)"
    )
    assert Store(tmp_path / "s").describe_incomplete("toy", "fit") == expected
    code, out, _ = _run(["store", "ls", "--store", str(tmp_path / "s")], capsys)
    assert code == 0 and f"  fit: incomplete: {expected}\n" in out
    code, _, err = _run([*EVALUATE, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and _error_line(err) == f"error: store entry toy/fit is incomplete: {expected}"


class Killed(Exception):
    """A simulated kill between two durable steps of finalize."""


@pytest.mark.parametrize("kill_at", [0, 5, 15, 21])
def test_an_entry_killed_while_finalizing_is_not_called_empty(tmp_path, monkeypatch, capsys, kill_at):
    """The review saw "incomplete (0 of 40 shards written)" here: the shards were all written, and merged in part."""
    _toy_store(tmp_path / "s")
    Store(tmp_path / "s").delete("toy", "fit")
    writer = _start_entry(tmp_path / "s", monkeypatch)
    for k in writer.pending_shards():
        _shard(writer, k)
    steps = []

    def step(name: str) -> None:
        steps.append(name)
        if len(steps) > kill_at:
            raise Killed(name)

    monkeypatch.setattr(store_module, "_merge_step", step)
    with pytest.raises(Killed):
        writer.finalize(extra_meta={"dataset": {"format": "folder"}})
    writer.close()
    merged = {0: 0, 5: 0, 15: 1, 21: 2}[kill_at]  # planned; per array 3 shards x (copied, recorded, released), renamed
    code, out, _ = _run(["store", "ls", "--store", str(tmp_path / "s")], capsys)
    line = next(line for line in out.splitlines() if line.startswith("  fit: "))
    assert line == (
        f"  fit: incomplete: interrupted while finalizing: all 3 shards written, {merged} of 2 arrays merged into "
        "their final files; to finish it, rerun `oodbench extract --model toy --dataset fit` (nothing is recomputed)"
    )
    # Doing what it says finishes the entry, and keeps what the interrupted run meant to record.
    monkeypatch.setattr(store_module, "_merge_step", lambda name: None)
    again = Store(tmp_path / "s").writer("toy", "fit", provenance=PROV, num_items=20, shard_size=8, item_hash="h")
    assert again.pending_shards() == []
    again.finalize()
    meta = Store(tmp_path / "s").meta("toy", "fit")
    assert meta["complete"] and meta["dataset"] == {"format": "folder"}
    assert Store(tmp_path / "s").verify("toy", "fit").ok


def test_a_damaged_shard_marker_counts_as_not_written(tmp_path, monkeypatch):
    writer = _start_entry(tmp_path, monkeypatch)
    _shard(writer, 0)
    _shard(writer, 1)
    (tmp_path / "toy" / "fit" / "shards" / "00001.done.json").write_text('{"rows": 8, "arrays": {"../x": {}}}')
    assert writer.pending_shards() == [1, 2]


def test_a_head_meta_that_is_not_an_object_is_one_line(tmp_path):
    store = _toy_store(tmp_path)
    (tmp_path / "toy" / "head" / "meta.json").write_text('"weight"')
    with pytest.raises(StoreError, match="must hold a JSON object, not a str"):
        store.read_head("toy")


def test_a_folder_that_holds_no_store_entry_is_not_listed_or_verified_as_a_store(tmp_path, capsys):
    # An image tree (class folders of PNGs) passed as --store: listing its folders as models, or "all intact" after
    # checking nothing, would tell the user a wrong folder is a store.
    photos = tmp_path / "photos"
    for name in ("train/cat", "train/dog", "val/cat"):
        (photos / name).mkdir(parents=True)
        (photos / name / "1.png").write_bytes(b"\x89PNG")
    for command in ("ls", "verify"):
        code, out, err = _run(["store", command, "--store", str(photos)], capsys)
        assert code == 2 and "not a feature store" in err and len(err.strip().splitlines()) == 1, (out, err)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, _ = _run(["store", "ls", "--store", str(empty)], capsys)
    assert code == 0 and "no models in this store" in out
    code, _, err = _run(["store", "verify", "--store", str(empty)], capsys)
    assert code == 2 and "nothing to verify" in err
