"""`oodbench detectors new NAME` scaffolds a plugin that works after `pip install -e` with no edit: listed with
its distribution and version, passing its own check_detector test, evaluated and reported beside the built-ins."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import oodbench
from oodbench.core.errors import DetectorError
from oodbench.core.store import Store
from oodbench.detectors.scaffold import identifiers, scaffold


def test_identifiers_follow_the_detector_name():
    assert identifiers("knn_plus") == {
        "name": "knn_plus",
        "distribution": "oodbench-knn-plus",
        "package": "oodbench_knn_plus",
        "ident": "knn_plus",
        "cls": "KnnPlus",
    }
    assert identifiers("maha++")["cls"] == "Maha" and identifiers("maha++")["package"] == "oodbench_maha"
    with pytest.raises(DetectorError, match="invalid detector name '2fast'"):
        identifiers("2fast")


def test_scaffold_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(DetectorError, match="exists and is not empty"):
        scaffold("x", tmp_path / "taken")
    assert (scaffold("x", tmp_path / "taken", force=True) / "pyproject.toml").is_file()


def test_the_scaffolded_detector_passes_check_detector_in_process(tmp_path):
    root = scaffold("inproc_demo", tmp_path / "pkg")
    sys.path.insert(0, str(root / "src"))
    try:
        from oodbench_inproc_demo.detector import InprocDemo

        from oodbench.detectors.testing import check_detector

        check_detector(InprocDemo).raise_if_failed()
    finally:
        sys.path.remove(str(root / "src"))
        for name in [m for m in sys.modules if m.startswith("oodbench_inproc_demo")]:
            del sys.modules[name]


def run(*args: str | Path, cwd: Path | None = None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)  # the venv's .pth decides which oodbench it sees
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_scaffold_install_list_test_evaluate_report(tmp_path, make, build_outputs):
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["detectors", "new", "my_det", "--out", str(tmp_path / "oodbench-my-det")])
    assert result.exit_code == 0, result.output
    package = tmp_path / "oodbench-my-det"

    # A fresh venv that sees this oodbench (first) and the shared venv's packages, without copying them.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    source = Path(oodbench.__file__).resolve().parents[1]
    (purelib / "_oodbench_test_parent.pth").write_text(f"{source}\n{sysconfig.get_paths()['purelib']}\n")
    # Offline: no index, no build isolation (setuptools comes from the shared venv), no dependencies to fetch.
    run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index", "--no-deps",
        "--no-build-isolation", "-e", package,
    )  # fmt: skip

    listing = run(python, "-m", "oodbench.cli", "detectors")
    assert "my_det" in listing and "oodbench-my-det 0.1.0" in listing and "msp" in listing

    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", package / "tests", cwd=package)

    problem = make(seed=5)
    store = Store(tmp_path / "store")
    provenance = {"model": "tiny-net", "checkpoint": "sha256:abc", "preprocessing": "none"}
    store.write_head("tiny", problem.head, provenance=provenance)
    n = problem.n_id
    for name, outputs in {
        "fit": problem.fit,
        "id": problem.test.subset(slice(0, n)),
        "ood": problem.test.subset(slice(n, None)),
    }.items():
        store.write_outputs("tiny", name, outputs, provenance=provenance)
    table = run(
        python, "-m", "oodbench.cli", "evaluate", "--store", tmp_path / "store", "--model", "tiny", "--fit", "fit",
        "--id", "id", "--ood", "ood", "-d", "my_det,energy", "--out", tmp_path / "run", "--no-progress",
        "--save-detectors", tmp_path / "kept",
    )  # fmt: skip
    rows = [line for line in table.splitlines() if line.startswith("| my_det")]
    assert rows, table
    report = run(
        python, "-m", "oodbench.cli", "report", tmp_path / "run", "--out", tmp_path / "report", "--format", "md",
        "--figure-format", "png", "--no-score-figures", "--draws", "20", "--curve-draws", "5", "--resamples", "50",
        "--quiet",
    )  # fmt: skip
    assert "table files" in report
    assert "my_det" in "".join(p.read_text() for p in (tmp_path / "report").rglob("*.md"))
    # The plugin's fitted state is an artefact like a built-in's, with the plugin's version recorded.
    meta = (tmp_path / "kept" / "my_det" / "detector.json").read_text()
    assert '"distribution": "oodbench-my-det"' in meta and '"version": "0.1.0"' in meta
    scores = run(python, "-m", "oodbench.cli", "score", "--detector", tmp_path / "kept" / "my_det", "--store",
                 tmp_path / "store", "--dataset", "ood", "--out", tmp_path / "scored")  # fmt: skip
    assert "ood: 150 rows scored by my_det" in scores
    assert np.isfinite(np.load(tmp_path / "scored" / "ood.npy")).all()
