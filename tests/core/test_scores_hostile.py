"""Hostile score files and folders in a run directory: `scores/<model>/<dataset>.npz` is data, read safely.

A score file whose members declare 2^40 scores in a 3 kB file ended `analyze ci` and a resumed `evaluate` in an
"unexpected MemoryError" (exit status 1); a score file linked outside the run was read; and a `scores/` folder
linked outside made `evaluate --out` write the scores there. Each is now one RunDirError line (exit status 2).
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from oodbench import Head, Outputs, Store
from oodbench.cli.main import app
from oodbench.core.errors import RunDirError
from oodbench.core.rundir import RunDir
from oodbench.core.scores import load_scores, save_scores, score_path

from ..hostile import bounded

pytestmark = pytest.mark.hostile

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
DETECTORS = ("msp", "energy")


def _header(shape, descr="<f8") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _zip(path, members, compression=zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _valid(n=4) -> bytes:
    return _header((n,)) + np.arange(n, dtype="<f8").tobytes()


# Each writes a hostile score file at the path given.
HOSTILE_FILES = {
    "declares 2^40 scores": lambda p: _zip(p, {f"{d}.npy": _header((2**40,)) + b"\0" * 800 for d in DETECTORS}),
    "declares 2^40 scores, deflated": lambda p: _zip(
        p, {"msp.npy": _header((2**40,)) + b"\0" * 800}, zipfile.ZIP_DEFLATED
    ),
    "deflated member": lambda p: _zip(p, {"msp.npy": _valid()}, zipfile.ZIP_DEFLATED),
    "two dimensions": lambda p: _zip(p, {"msp.npy": _header((2, 2)) + b"\0" * 32}),
    "object dtype": lambda p: _zip(p, {"msp.npy": _header((2,), "|O") + b"\0" * 16}),
    "structured dtype": lambda p: _zip(p, {"msp.npy": _header((2,), [("a", "<f8")]) + b"\0" * 16}),
    "more bytes than declared": lambda p: _zip(p, {"msp.npy": _valid() + b"\0" * 8}),
    "fewer bytes than declared": lambda p: _zip(p, {"msp.npy": _valid()[:-8]}),
    "not an array": lambda p: _zip(p, {"msp.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': nope}  \n"}),
    "a member that is not .npy": lambda p: _zip(p, {"msp.npy": _valid(), "notes.txt": b"hello"}),
    "lengths differ": lambda p: _zip(p, {"msp.npy": _valid(4), "energy.npy": _valid(5)}),
    "not a zip": lambda p: p.write_bytes(b"PK\x03\x04 not really"),
    "truncated": lambda p: (_zip(p, {"msp.npy": _valid(1000)}), p.write_bytes(p.read_bytes()[:3000])),
}


def _one_line_refusal(exc) -> str:
    assert isinstance(exc, RunDirError), repr(exc)
    assert "\n" not in str(exc)
    return str(exc)


def test_scores_round_trip_and_merge(tmp_path):
    run = tmp_path / "run"
    save_scores(run, "m", "d", {"msp": np.arange(3.0)})
    save_scores(run, "m", "d", {"energy": np.ones(3, np.float32)})
    loaded = load_scores(run, "m", "d")
    assert set(loaded) == {"msp", "energy"} and loaded["energy"].dtype == np.float64
    np.testing.assert_array_equal(loaded["msp"], np.arange(3.0))
    assert sorted(os.listdir(run / "scores" / "m")) == ["d.npz"]  # no temporary left behind
    with pytest.raises(RunDirError, match="disagree in length"):
        save_scores(run, "m", "d", {"knn": np.ones(4)})
    assert set(save_scores(run, "m", "d", {"knn": np.ones(2)}, replace=True) and load_scores(run, "m", "d")) == {"knn"}
    with pytest.raises(RunDirError, match="no scores for m/other"):
        load_scores(run, "m", "other")


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_a_hostile_score_file_is_one_line(tmp_path, case):
    path = score_path(tmp_path / "run", "m", "d")
    path.parent.mkdir(parents=True)
    HOSTILE_FILES[case](path)
    refused = bounded(lambda: load_scores(tmp_path / "run", "m", "d"))
    assert str(path) in _one_line_refusal(refused)
    # Saving more scores into it (a resumed run merges them) is refused the same way, and leaves the file alone.
    before = path.read_bytes()
    refused = bounded(lambda: save_scores(tmp_path / "run", "m", "d", {"knn": np.ones(4)}))
    assert str(path) in _one_line_refusal(refused) and path.read_bytes() == before


@pytest.mark.parametrize("kind", ["link-to-valid-copy", "link-to-dev-zero", "fifo", "directory", "link-loop"])
def test_a_planted_score_file_is_refused(tmp_path, kind):
    run = tmp_path / "run"
    save_scores(tmp_path / "elsewhere", "m", "d", {"msp": np.arange(3.0)})
    path = score_path(run, "m", "d")
    path.parent.mkdir(parents=True)
    if kind == "link-to-valid-copy":
        path.symlink_to(score_path(tmp_path / "elsewhere", "m", "d"))
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(path)
    assert RunDir(run).has_scores("m", "d")  # listed, so that loading refuses it rather than skipping it
    refused = bounded(lambda: load_scores(run, "m", "d"), path if kind == "fifo" else None)
    assert str(path) in _one_line_refusal(refused)


@pytest.mark.parametrize("folder", ["scores", "scores/m"])
@pytest.mark.parametrize("kind", ["link-to-folder", "file"])
def test_a_planted_score_folder_is_refused_before_writing(tmp_path, folder, kind):
    run = tmp_path / "run"
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = run / folder
    planted.parent.mkdir(parents=True)
    if kind == "link-to-folder":
        planted.symlink_to(outside)
    else:
        planted.write_text("not a folder")
    refused = bounded(lambda: save_scores(run, "m", "d", {"msp": np.arange(3.0)}))
    assert str(planted) in _one_line_refusal(refused)
    assert list(outside.rglob("*")) == []  # nothing was written through the link
    if kind == "link-to-folder":  # a copy of valid scores there is not read either
        save_scores(tmp_path / "copy", "m", "d", {"msp": np.arange(3.0)})
        source = tmp_path / "copy" / folder
        for item in source.rglob("*"):
            target = outside / item.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if item.is_file():
                target.write_bytes(item.read_bytes())
        assert str(planted) in _one_line_refusal(bounded(lambda: load_scores(run, "m", "d")))


def test_a_run_directory_given_as_a_link_is_used(tmp_path):
    """The folder the user names may itself be a link: only what is inside it is judged."""
    (tmp_path / "real").mkdir()
    (tmp_path / "named").symlink_to(tmp_path / "real")
    save_scores(tmp_path / "named", "m", "d", {"msp": np.arange(3.0)})
    assert set(load_scores(tmp_path / "named", "m", "d")) == {"msp"}
    assert (tmp_path / "real" / "scores" / "m" / "d.npz").is_file()


# -- end to end: `oodbench analyze ci` and a resumed `oodbench evaluate` ---------------------------------------------
def _store(tmp_path) -> Store:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    store = Store(tmp_path / "store")
    for name, n, shift in [("fit", 120, 2.0), ("id", 60, 2.0), ("ood", 50, 0.0)]:
        z = (rng.normal(size=(n, 5)) + shift).astype(np.float32)
        store.write_outputs("toy", name, Outputs(z, z @ weight.T + bias, rng.integers(0, 3, n)), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def _evaluate(tmp_path, out):
    args = ["evaluate", "--store", str(tmp_path / "store"), "--model", "toy", "--fit", "fit", "--id", "id"]
    return CliRunner().invoke(
        app, [*args, "--ood", "ood", "-d", ",".join(DETECTORS), "--out", str(out), "--no-progress"]
    )


def test_the_cli_refuses_a_score_bomb_in_one_line(tmp_path):
    _store(tmp_path)
    run = tmp_path / "run"
    assert _evaluate(tmp_path, run).exit_code == 0
    HOSTILE_FILES["declares 2^40 scores"](score_path(run, "toy", "ood"))
    for result in (CliRunner().invoke(app, ["analyze", "ci", str(run)]), _evaluate(tmp_path, run)):
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert "declares 1,099,511,627,776 scores" in lines[0] and "unexpected" not in lines[0]


def test_the_cli_writes_nothing_through_a_linked_scores_folder(tmp_path):
    _store(tmp_path)
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "scores").symlink_to(outside)
    result = _evaluate(tmp_path, run)
    assert result.exit_code == 2 and "must be real directories" in result.output, result.output
    assert list(outside.rglob("*")) == []
