"""Did-you-mean on the command line: a full name suggests its abbreviation, a model family's first member first.

Each case runs the console entry point on a tiny real store or real image folders and checks that the command
stops before any work with one ``error:`` line, exit status 2.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from oodbench import Outputs, Store
from oodbench.cli.main import main

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    """A store with toy fit/id/ood entries, and image folders (two classes, one OOD folder)."""
    root = tmp_path_factory.mktemp("names")
    rng = np.random.default_rng(0)
    store = Store(root / "store")
    for name, n in (("fit", 20), ("id", 10), ("ood", 10)):
        z = rng.normal(size=(n, 4)).astype(np.float32)
        store.write_outputs("toy", name, Outputs(z, z[:, :2], rng.integers(0, 2, n)), provenance=PROV)
    for folder in ("images/a", "images/b", "ood"):
        (root / folder).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / folder / f"{i}.png")
    return root


def _fails_in_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_evaluate_model_suggests_the_abbreviation_of_a_full_detector_name(data, tmp_path, capsys) -> None:
    # Before: "unknown detector 'mahalanobis'" with no suggestion ('maha' is too far for difflib alone).
    args = ["evaluate-model", "test_resnet", "--no-pretrained", "--fit", str(data / "images")]
    args += ["--id", str(data / "images"), "--ood", f"x={data / 'ood'}", "--store", str(tmp_path / "s")]
    err = _fails_in_one_line([*args, "--no-progress", "-d", "mahalanobis,msp"], capsys)
    assert "unknown detector 'mahalanobis'; did you mean 'maha'" in err
    assert not (tmp_path / "s").exists()


def test_evaluate_suggests_the_abbreviation_of_a_full_detector_name(data, tmp_path, capsys) -> None:
    args = ["evaluate", "--store", str(data / "store"), "--model", "toy", "--fit", "fit", "--id", "id"]
    err = _fails_in_one_line([*args, "--ood", "ood", "-d", "Mahalanobis", "--out", str(tmp_path / "run")], capsys)
    assert "unknown detector 'Mahalanobis'; did you mean 'maha'" in err
    assert not (tmp_path / "run").exists()


def test_a_model_family_prefix_suggests_its_first_member(data, tmp_path, capsys) -> None:
    # Before: "did you mean 'tf_efficientnet_lite4', 'tf_efficientnet_lite3', 'tf_efficientnet_lite2'?"
    args = ["evaluate-model", "tf_efficientnet_lite", "--fit", str(data / "images"), "--id", str(data / "images")]
    args += ["--ood", f"x={data / 'ood'}", "--store", str(tmp_path / "s"), "--no-progress", "-d", "msp"]
    err = _fails_in_one_line(args, capsys)
    assert "did you mean 'tf_efficientnet_lite0', 'tf_efficientnet_lite1', 'tf_efficientnet_lite2'?" in err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())
