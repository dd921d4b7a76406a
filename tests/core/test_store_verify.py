"""Checksums: a single flipped byte anywhere in any array of an entry or head is found, and never scored.

`store verify` hashes every byte; every read checks sizes, headers, shapes and dtypes; `evaluate` verifies
the entries it reads once per run directory. The damage the review made (one flipped exponent byte in the fit
features, one changed fit label) ends in one line and exit status 2 instead of moved scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core import store as store_module
from oodbench.core.errors import StoreError

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


def _toy_store(root: Path, *, head: bool = True) -> Store:
    """A 3-class toy model: fit, id and ood entries of 60/40/40 rows (several shards each), and its head."""
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 8)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    store = Store(root)
    for name, n, shift in (("fit", 60, 0.0), ("id", 40, 0.0), ("ood", 40, 3.0)):
        z = (rng.normal(size=(n, 8)) + shift).astype(np.float32)
        logits = (z.astype(np.float64) @ weight.T + bias).astype(np.float32)
        store.write_outputs(
            "toy",
            name,
            Outputs(z, logits, rng.integers(0, 3, n), {"aux": z[:, :2].copy()}),
            provenance=PROV,
            shard_size=16,
        )
    if head:
        store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error: ") for line in lines) == 1, err
    return lines[-1]


def test_an_intact_store_verifies(tmp_path, capsys):
    _toy_store(tmp_path / "s")
    code, out, _ = _run(["store", "verify", "--store", str(tmp_path / "s")], capsys)
    assert code == 0
    assert out.count(": ok (") == 4  # three entries and the head
    assert "checked 4 entries and heads" in out and out.rstrip().endswith("all intact")


def test_a_flipped_byte_anywhere_in_any_array_is_found(tmp_path, capsys):
    """Every array file of an entry and of the head; bytes in the header, the first, a middle and the last row."""
    clean = _toy_store(tmp_path / "clean")
    files = sorted((tmp_path / "clean" / "toy").rglob("*.npy"))
    assert {p.stem for p in files} >= {"features", "logits", "labels", "index", "extra.aux", "weight", "bias"}
    rng = np.random.default_rng(1)
    cases = 0
    for file in files:
        size, header = file.stat().st_size, len(_header_bytes(file))
        for offset in sorted({0, 9, header - 2, header, header + (size - header) // 2, size - 1}):
            store = Store(tmp_path / f"case{cases}")
            _copy(clean.root, store.root)
            target = store.root / file.relative_to(clean.root)
            _flip(target, offset, int(rng.integers(1, 256)))  # any change of one byte
            entry = target.parent.name
            result = store.verify_head("toy") if entry == "head" else store.verify("toy", entry)
            assert not result.ok, (file, offset)
            assert result.problems[0].startswith(f"{file.name}: "), result.problems
            if offset >= header:
                assert "rows" in result.problems[0] and "changed since they were written" in result.problems[0]
            if offset == size - 1:  # the command line, once per file
                code, out, err = _run(["store", "verify", "--store", str(store.root)], capsys)
                assert code == 2 and f"toy/{entry}: damaged: {file.name}" in out
                assert f"1 damaged (toy/{entry})" in _one_error_line(err)
            cases += 1
    assert cases >= 6 * len(files) - len(files)  # offsets may coincide for tiny files


def _header_bytes(path: Path) -> bytes:
    with open(path, "rb") as handle:
        np.lib.format.read_magic(handle)
        np.lib.format.read_array_header_1_0(handle)
        size = handle.tell()
    return path.read_bytes()[:size]


def _copy(source: Path, target: Path) -> None:
    import shutil

    shutil.copytree(source, target)


def test_the_damaged_rows_are_named(tmp_path):
    store = _toy_store(tmp_path)
    path = tmp_path / "toy" / "fit" / "features.npy"
    header = len(_header_bytes(path))
    _flip(path, header + 20 * 8 * 4 + 5)  # row 20: the second shard (rows 16-31)
    assert store.verify("toy", "fit").problems == ["features.npy: rows 16-31 changed since they were written"]
    with pytest.raises(StoreError, match=r"store entry toy/fit is damaged: features.npy: rows 16-31"):
        store.read("toy", "fit", verify=True)
    store.read("toy", "fit")  # the cheap checks cannot see a changed value: that is what verify is for


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-4]), "truncated or padded"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 4), "truncated or padded"),
        (lambda p: _flip(p, 60, 0x01), "header"),  # inside the header's dict: shape, order or padding
        (lambda p: p.write_bytes(b"not an npy file"), "no readable .npy header"),
        (lambda p: p.unlink(), "cannot open"),
    ],
)
def test_every_read_checks_size_and_header(tmp_path, damage, message):
    store = _toy_store(tmp_path)
    damage(tmp_path / "toy" / "id" / "logits.npy")
    with pytest.raises(StoreError, match=f"store entry toy/id is damaged: logits.npy: .*{message}"):
        store.read("toy", "id")


def test_a_shard_damaged_before_finalize_never_becomes_a_complete_entry(tmp_path):
    store = Store(tmp_path)
    data = Outputs(np.arange(40, dtype=np.float32).reshape(20, 2))
    writer = store.writer("m", "ds", provenance=PROV, num_items=20, shard_size=8)
    for shard in writer.pending_shards():
        writer.write_shard(shard, {"features": data.features[writer.shard_rows(shard)]})
    shard_file = tmp_path / "m" / "ds" / "shards" / "features.00001.npy"
    _flip(shard_file, shard_file.stat().st_size - 3)  # the same size: the resume check cannot see it
    with pytest.raises(StoreError, match="shard 1 of features changed on disk after it was written"):
        writer.finalize()
    assert not store.exists("m", "ds")


def test_old_entries_without_checksums_are_read_and_reported(tmp_path, capsys):
    store = _toy_store(tmp_path, head=False)
    meta_path = tmp_path / "toy" / "id" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["format"] = 1
    del meta["checksum_rows"]
    for spec in meta["arrays"].values():
        del spec["sha256"], spec["header_sha256"]
    meta_path.write_text(json.dumps(meta))
    assert store.read("toy", "id").features.shape == (40, 8)
    result = store.verify("toy", "id")
    assert result.ok and not result.checksums
    code, out, _ = _run(["store", "verify", "--store", str(tmp_path)], capsys)
    assert code == 0 and "toy/id: no checksums recorded" in out and "1 without checksums" in out


EVALUATE = ["evaluate", "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood", "--no-progress"]


def test_evaluate_verifies_once_per_run_directory_and_says_how_long(tmp_path, capsys):
    _toy_store(tmp_path / "s")
    argv = [*EVALUATE, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run"), "-d", "msp,maha"]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    assert "verified 4 store entries" in err and " s" in err  # fit, id, ood and the head, with the time taken
    assert set(json.loads((tmp_path / "run" / "verified.json").read_text())) == {
        "toy/fit",
        "toy/id",
        "toy/ood",
        "toy/head",
    }
    code, _, err = _run(argv, capsys)
    assert code == 0 and "already verified for this run directory" in err
    code, _, err = _run([*argv, "--verify"], capsys)
    assert code == 0 and "verified 4 store entries" in err
    # Another run directory verifies again, and finds what changed in between.
    path = tmp_path / "s" / "toy" / "fit" / "labels.npy"
    _flip(path, path.stat().st_size - 8)  # one fit label changed (maha's class means move with it)
    code, _, err = _run([*EVALUATE, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run2")], capsys)
    assert code == 2 and "toy/fit is damaged: labels.npy: rows" in _one_error_line(err)
    assert not (tmp_path / "run2" / "results.parquet").exists()


def test_a_flipped_exponent_byte_in_fit_features_without_a_head_is_refused(tmp_path, capsys):
    _toy_store(tmp_path / "s", head=False)
    path = tmp_path / "s" / "toy" / "fit" / "features.npy"
    header = len(_header_bytes(path))
    _flip(path, header + 3, 0x04)  # the top byte of the first float32: sign and exponent
    values = np.load(path)
    assert np.isfinite(values).all()  # a finite, silently wrong number: nothing but the checksum can tell
    argv = [*EVALUATE, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "run"), "-d", "knn", "-p", "knn.k=3"]
    code, _, err = _run(argv, capsys)
    assert code == 2 and "toy/fit is damaged: features.npy: rows 0-15" in _one_error_line(err)


def test_merge_records_checksums_of_what_the_writer_handed_in(tmp_path, monkeypatch):
    """The recorded digests are of the writer's input, computed before any byte reached the disk."""
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: None)
    store = Store(tmp_path)
    data = Outputs(np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32))
    store.write_outputs("m", "ds", data, provenance=PROV, shard_size=8)
    meta = store.meta("m", "ds")
    assert meta["format"] == 2 and meta["checksum_rows"] == [8, 8, 4]
    import hashlib

    expected = [hashlib.sha256(data.features[i : i + 8].tobytes()).hexdigest() for i in (0, 8, 16)]
    assert meta["arrays"]["features"]["sha256"] == expected
