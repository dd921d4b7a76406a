"""A saved detector whose files are links, FIFOs, devices, directories or link loops: refused in one line, at once.

A tar archive keeps links and FIFOs, so a received detector can hold them: `state.safetensors` as a FIFO or a
link to /dev/zero hung `oodbench score` for ever, and a link to a valid file outside the folder was followed
and loaded. Loading reads regular files inside the folder only, their size checked before reading.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.store import Store
from oodbench.detectors import artefact, create, load, save

from ..cli_once import invoke
from .hostile.cases import PROVENANCE, fit_data

pytestmark = pytest.mark.hostile

KINDS = ("link-to-copy", "link-to-dev-zero", "fifo", "directory", "link-loop")
FILES = (artefact.META_FILE, artefact.ARRAYS_FILE)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("saved")
    fit, head = fit_data()
    save(create("maha").fit(fit, head), root / "maha", provenance=PROVENANCE)
    store = Store(root / "store")
    store.write_head("tiny", head, provenance=dict(PROVENANCE))
    store.write_outputs("tiny", "new", fit.subset(slice(0, 50)), provenance=dict(PROVENANCE), item_hash="items-new")
    return root


def _plant(folder: Path, name: str, kind: str) -> Path:
    path = folder / name
    outside = folder.parent / f"outside-{folder.name}"
    outside.mkdir()
    shutil.copyfile(path, outside / name)
    path.unlink()
    if kind == "link-to-copy":
        path.symlink_to(outside / name)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(f"{name}.loop")
        (folder / f"{name}.loop").symlink_to(name)
    return path


def _bounded(action, fifo: Path | None):
    """The exception `action` raised (None when it returned); a read blocked on `fifo` is released and fails."""
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(60)  # a hang detector only: a refused file is refused at once
    if thread.is_alive():
        if fifo is not None:
            with open(fifo, "wb"):
                pass
        pytest.fail(f"loading blocked on {fifo}")
    return outcome[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_a_saved_detector_file_that_is_not_a_regular_file_inside_the_folder_is_refused(saved, tmp_path, name, kind):
    folder = tmp_path / "det"
    shutil.copytree(saved / "maha", folder)
    path = _plant(folder, name, kind)
    result = _bounded(lambda: load(folder), path if kind == "fifo" else None)
    assert isinstance(result, DetectorError), result
    assert "\n" not in str(result) and name in str(result)


@pytest.mark.parametrize("kind", ("fifo", "link-to-dev-zero"))
def test_score_refuses_a_state_that_is_a_fifo_or_a_device_with_exit_2(saved, tmp_path, kind):
    folder = tmp_path / "det"
    shutil.copytree(saved / "maha", folder)
    path = _plant(folder, artefact.ARRAYS_FILE, kind)
    args = ["score", "--detector", str(folder), "--store", str(saved / "store"), "--dataset", "new", "--model", "tiny"]
    result = _bounded(lambda: invoke(args), path if kind == "fifo" else None)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output


def test_the_size_of_the_state_is_checked_before_reading(saved, tmp_path, monkeypatch):
    folder = tmp_path / "det"
    shutil.copytree(saved / "maha", folder)
    size = (folder / artefact.ARRAYS_FILE).stat().st_size
    monkeypatch.setattr(artefact, "ARRAYS_LIMIT_BYTES", size - 1)
    monkeypatch.setattr(artefact, "_sha256_fd", lambda *a: pytest.fail("read despite its size"))
    with pytest.raises(DetectorError, match="more than the"):
        load(folder)
    monkeypatch.undo()
    assert load(folder).fit_info_ is not None  # the untouched copy loads
