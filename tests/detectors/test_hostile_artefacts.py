"""Hostile saved detectors (tests/detectors/hostile/cases.py): each is refused by `detectors.load` and by
`oodbench score` with one line and exit status 2, touches no file and imports no module.

The earlier format's loader fails this suite: the dotted-path case deletes the victim file, the module case
imports the probe, and the faiss blobs end in errors that are not one line with exit status 2.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.store import Store
from oodbench.detectors import load, save

from ..cli_once import invoke
from .hostile.cases import CASES, EVIL_MODULE, build, fit_data

pytestmark = pytest.mark.hostile

VICTIM_TEXT = "must survive\n"


@dataclass
class Hostile:
    root: Path
    victim: Path
    plugins: Path
    store: Path


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root with its size and modification time."""
    found = {}
    for directory, subdirs, names in os.walk(root):
        for name in subdirs + names:
            path = Path(directory) / name
            stat = path.lstat()
            found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def cli(*args: str):
    return invoke(args)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Hostile:
    root = tmp_path_factory.mktemp("hostile")
    victim, plugins = root / "victim.txt", root / "plugins"
    build(root / "cases", victim, plugins)
    victim.write_text(VICTIM_TEXT)
    fit, head = fit_data()
    store = Store(root / "store")
    provenance = {"model": "tiny-net", "checkpoint": "sha256:abc", "preprocessing": None}
    store.write_head("tiny", head, provenance=provenance)
    store.write_outputs("tiny", "new", fit.subset(slice(0, 50)), provenance=provenance, item_hash="items-new")
    sys.path.insert(0, str(plugins))  # the probe module is importable: only a loader that runs code would import it
    try:
        # Warm up: the modules a refusal legitimately uses (the CLI, safetensors, faiss) are imported here.
        for name in ("meta_not_json", "whitener_one_column_short", "faiss_vectors_wrong_width"):
            cli("score", "--detector", str(root / "cases" / name), "--store", str(store.root), "--dataset", "new")
        # Every object alive now (the test session's, the modules') is left out of the collections below, which
        # then take milliseconds instead of a pass over the whole heap: an object a case builds is younger than
        # the freeze and is still collected, its finaliser run, by each `gc.collect()`.
        gc.collect()
        gc.freeze()
        yield Hostile(root / "cases", victim, plugins, store.root)
    finally:
        gc.unfreeze()
        sys.path.remove(str(plugins))


def test_the_suite_is_large_and_covers_the_earlier_attacks():
    assert len(CASES) >= 60
    for name in ("legacy_object_deletes_a_file", "legacy_class_imports_a_module_on_the_path", "means_integer"):
        assert name in CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_detector_is_refused_in_one_line_touching_and_importing_nothing(hostile, name):
    path = hostile.root / name
    before = _files(hostile.root.parent)
    modules = set(sys.modules)
    with pytest.raises(DetectorError) as refused:
        load(path)
    gc.collect()  # an object built from the file would act now, in its finaliser
    message = str(refused.value)
    assert "\n" not in message and 0 < len(message) <= 500, message
    result = cli("score", "--detector", str(path), "--store", str(hostile.store), "--dataset", "new", "--model", "tiny")
    gc.collect()
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert hostile.victim.read_text() == VICTIM_TEXT
    assert _files(hostile.root.parent) == before
    assert not (hostile.plugins / f"{EVIL_MODULE}.imported").exists() and EVIL_MODULE not in sys.modules
    assert sorted(set(sys.modules) - modules) == []


def test_the_valid_sources_of_the_cases_load_and_score(tmp_path):
    """The cases are refused for what was changed: the saves they start from load and score."""
    from .hostile.cases import PROVENANCE, SOURCES

    fit, head = fit_data()
    from oodbench.detectors import create

    for source, (name, params) in SOURCES.items():
        detector = create(name, **params).fit(fit, head)
        save(detector, tmp_path / source, provenance=PROVENANCE)
        scores = load(tmp_path / source).score(fit)
        assert scores.tobytes() == detector.score(fit).tobytes(), source
        assert np.isfinite(scores).all()
