"""A pack is a file a user is sent: links, pipes, paths outside the pack, oversized or lying headers and manifests
are refused in one line (exit status 2 from the CLI) before anything is read from them or written anywhere."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core.errors import StoreError
from oodbench.core.pack import export_pack

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {"size": 8}}
ARRAYS = "toy/fit/arrays.safetensors"


@pytest.fixture(scope="module")
def good_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    store = Store(root / "store")
    for name in ("fit", "test"):
        z = rng.normal(size=(40, 8)).astype(np.float32)
        store.write_outputs(
            "toy", name, Outputs(z, z[:, :3].copy(), rng.integers(0, 3, 40)), provenance=PROV, shard_size=16
        )
    store.write_head("toy", Head(rng.normal(size=(3, 8)).astype(np.float32), np.zeros(3, np.float32)), provenance=PROV)
    export_pack(store, root / "pack", [("toy", "fit"), ("toy", "test")])
    return root / "pack"


def _manifest(pack: Path, change: Callable[[dict], None]) -> None:
    manifest = json.loads((pack / "manifest.json").read_text())
    change(manifest)
    (pack / "manifest.json").write_text(json.dumps(manifest))


def _symlink_file(pack: Path) -> None:
    target = pack.parent / "elsewhere.safetensors"
    shutil.copy(pack / ARRAYS, target)
    (pack / ARRAYS).unlink()
    (pack / ARRAYS).symlink_to(target)


def _symlink_dir(pack: Path) -> None:
    shutil.move(pack / "toy", pack.parent / "toy-elsewhere")
    (pack / "toy").symlink_to(pack.parent / "toy-elsewhere")


def _fifo(pack: Path) -> None:
    (pack / ARRAYS).unlink()
    os.mkfifo(pack / ARRAYS)


def _huge_manifest(pack: Path) -> None:
    with open(pack / "manifest.json", "r+b") as handle:
        handle.truncate(65 * 2**20)  # sparse: the size is refused before a byte is read


def _header_claims(pack: Path, length: int) -> None:
    data = bytearray((pack / ARRAYS).read_bytes())
    data[:8] = struct.pack("<Q", length)
    (pack / ARRAYS).write_bytes(bytes(data))


def _header_lies_about_shape(pack: Path) -> None:
    data = (pack / ARRAYS).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + length].replace(b'"shape":[40,8]', b'"shape":[80,8]', 1)
    (pack / ARRAYS).write_bytes(data[:8] + header + data[8 + length :])


def _truncated(pack: Path) -> None:
    with open(pack / ARRAYS, "r+b") as handle:
        handle.truncate(os.path.getsize(pack / ARRAYS) - 4)


CASES: dict[str, Callable[[Path], None]] = {
    "arrays file is a symbolic link": _symlink_file,
    "model folder is a symbolic link": _symlink_dir,
    "arrays file is a named pipe": _fifo,
    "manifest above 64 MiB": _huge_manifest,
    "safetensors header claims 2^40 bytes": lambda p: _header_claims(p, 2**40),
    "safetensors header shape disagrees": _header_lies_about_shape,
    "arrays file truncated": _truncated,
    "dataset id climbs out": lambda p: _manifest(
        p, lambda m: m["models"]["toy"]["datasets"].__setitem__("../../etc", m["models"]["toy"]["datasets"]["fit"])
    ),
    "file outside the entries": lambda p: _manifest(
        p, lambda m: m["files"].__setitem__("../x", {"sha256": "0" * 64, "size": 1})
    ),
    "manifest of a newer format": lambda p: _manifest(p, lambda m: m.__setitem__("format_version", 99)),
    "manifest not JSON": lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe not json"),
    "manifest with NaN": lambda p: (p / "manifest.json").write_text('{"format": NaN}'),
    "pickle dtype": lambda p: _manifest(
        p, lambda m: m["models"]["toy"]["datasets"]["fit"]["arrays"]["features"].__setitem__("stored", "object")
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_pack_is_refused_in_one_line_and_writes_nothing(case, good_pack, tmp_path, capsys):
    pack = tmp_path / "pack"
    shutil.copytree(good_pack, pack)
    CASES[case](pack)
    before = {str(p): p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(StoreError) as info:
        Store(pack).read("toy", "fit")
    assert "\n" not in str(info.value)
    for argv in (
        ["pack", "verify", str(pack), "--no-progress"],
        ["pack", "import", str(pack), "--store", str(tmp_path / "store"), "--no-progress"],
        ["evaluate", "--store", str(pack), "--model", "toy", "--fit", "fit", "--id", "test", "--ood", "test"]
        + ["-d", "msp", "--out", str(tmp_path / "run"), "--no-progress"],
    ):
        with pytest.raises(SystemExit) as code:
            main(argv)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code.value.code == 2, (argv[:2], err)
        assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert not (tmp_path / "store").exists() and not (tmp_path / "run").exists()
    after = {str(p): p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert after == before  # nothing written, nothing changed


@pytest.mark.parametrize("existing", [False, True], ids=["new folder", "empty folder"])
def test_an_export_that_meets_a_damaged_entry_writes_nothing(existing, good_pack, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(good_pack.parent / "store", store)
    victim = store / "toy" / "test" / "features.npy"  # exported after toy/fit, which is intact
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    dest = tmp_path / "out" / "pack"
    if existing:
        dest.mkdir(parents=True)
    with pytest.raises(SystemExit) as code:
        main(["pack", "export", "--store", str(store), "--to", str(dest), "--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code.value.code == 2 and len(lines) == 1 and "nothing exported" in lines[0], err
    assert "toy/test" in lines[0] and "Traceback" not in err
    if existing:
        assert dest.is_dir() and not any(dest.iterdir())  # the folder named stays, empty
        assert sorted(p.name for p in dest.parent.iterdir()) == ["pack"]  # no hidden partial folder beside it
    else:
        assert not (tmp_path / "out").exists()  # not even the folders it would have created
