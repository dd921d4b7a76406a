"""Messages that must say what happened: each case runs the console entry point on tiny real data and reads the
one line it prints (a problem blamed on the right thing, an interruption that kept nothing saying so)."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.cli.main import main
from oodbench.extract.backbones.timm_backbone import TimmBackbone

from ..extract.helpers import write_images

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """Toy entries with D=4 features: 20 fit rows of 3 classes, 10 ID and 10 OOD rows."""
    rng = np.random.default_rng(0)
    store = Store(tmp_path_factory.mktemp("messages") / "store")
    for name, n in (("fit", 20), ("id", 10), ("ood", 10)):
        z = rng.normal(size=(n, 4)).astype(np.float32)
        store.write_outputs("toy", name, Outputs(z, z[:, :3], rng.integers(0, 3, n)), provenance=PROV)
    return store


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _evaluate(store: Store, tmp_path, detectors: str) -> list[str]:
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    return [*args, "-d", detectors, "--out", str(tmp_path / "run"), "--no-progress"]


def test_a_parameter_wider_than_the_features_is_not_called_a_small_fit_set(store, tmp_path, capsys) -> None:
    # Before: "the fit set (20 rows) is too small for: neco: dim=100 exceeds the feature dimension D=4".
    err = _error(_evaluate(store, tmp_path, "neco"), capsys)
    assert err.startswith("error: the features (D=4) are too narrow for: neco: dim=100 exceeds the feature dimension")
    assert "too small" not in err
    err = _error(_evaluate(store, tmp_path, "neco,knn"), capsys)
    assert err.startswith("error: the fit set (20 rows) is too small for: knn: k=1000 exceeds the fit set's 20 rows")
    assert "; and the features (D=4) are too narrow for: neco: dim=100" in err
    assert "neco" not in err.split("; and ")[0]


@pytest.mark.parametrize("interrupt_at", [1, 3])
def test_ctrl_c_during_extract_says_kept_only_once_a_shard_is_whole(tmp_path, monkeypatch, capsys, interrupt_at):
    # Before: Ctrl-C on the first batch said "nothing finished; kept whole shards in store …" with none written.
    images = write_images(tmp_path / "images", {"cat": 5, "dog": 4})
    calls = []
    original = TimmBackbone.infer

    def infer(self, pixels, **kwargs):  # Ctrl-C when the `interrupt_at`-th batch reaches the model
        calls.append(len(pixels))
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return original(self, pixels, **kwargs)

    monkeypatch.setattr(TimmBackbone, "infer", infer)
    args = ["extract", "--model", "test_resnet", "--no-pretrained", "--image-size", "32"]
    args += ["--store", str(tmp_path / "store"), "--data", str(images), "--batch-size", "3", "--shard-size", "3"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--workers", "0", "--no-progress"])
    assert exit_info.value.code == 130
    # stderr also shows the preprocessing and probe lines printed before the first batch.
    (line,) = [text for text in capsys.readouterr().err.splitlines() if text.startswith("interrupted:")]
    if interrupt_at == 1:
        assert line.startswith("interrupted: nothing finished; nothing kept; to start again, run: oodbench extract")
    else:  # two batches of 3 are two whole shards
        assert line.startswith(
            f"interrupted: finished 6 of 9 images of images; kept whole shards in store {tmp_path / 'store'}; "
            "to resume, run: oodbench extract"
        )


def test_delong_on_two_perfect_detectors_prints_undefined(tmp_path, capsys) -> None:
    # Before: two AUROCs of 1.0 printed z = 0.00 and p = 1.000, as if the test had found no difference.
    rng = np.random.default_rng(1)
    store = Store(tmp_path / "store")
    for name, n, peak in (("fit", 30, 10.0), ("id", 20, 10.0), ("ood", 20, 0.0)):
        labels = rng.integers(0, 3, n)
        logits = rng.normal(0, 0.1, (n, 3)).astype(np.float32)
        logits[np.arange(n), labels] += peak  # ID images: one confident class; OOD: none
        store.write_outputs("toy", name, Outputs(logits.copy(), logits, labels), provenance=PROV)
    run = tmp_path / "run"
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "-d", "msp,maxlogit", "--out", str(run), "--no-progress"])
    assert exit_info.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "compare", str(run), "--a", "msp", "--b", "maxlogit"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("| ood ")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3:5] == ["100.00", "100.00"] and cells[-2:] == ["undefined", "undefined"], cells
    assert "neither AUROC varies over the images" in out


def test_openood_csv_names_are_sanitised_as_the_docs_say(store, tmp_path, capsys) -> None:
    # A name with characters outside letters, digits, '-', '_' and '.' is written with '-' in their place
    # (maha++ -> maha--.csv); the docs said nothing of it, so the user looked for maha++.csv.
    from pathlib import Path

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(_evaluate(store, tmp_path, "maha,maha++"))  # writes to tmp_path / "run"
    assert exit_info.value.code == 0
    out = tmp_path / "report"
    args = ["report", str(run), "--out", str(out), "--format", "md", "--convention", "openood", "--no-progress"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--draws", "20", "--curve-draws", "5", "--resamples", "20"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    written = sorted(p.name for p in (out / "openood" / "toy" / "ood").iterdir())
    assert written == ["maha--.csv", "maha.csv"]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "reports.md").read_text(encoding="utf-8")
    assert "`maha++` is written to `maha--.csv`" in docs
