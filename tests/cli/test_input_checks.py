"""Bad command-line input is refused in one line (exit 2) before any work is done or anything is written.

Each case gives a command an option it cannot use (an --image-size no network takes, a file where a directory is
meant, a figure format nothing draws, a detector name that is taken) and checks the one line, the exit status and
that nothing was created; the rest check what the commands print once they ran: the files `oodbench score` wrote
(or that it wrote none) and the rows `oodbench evaluate-model` stored beside the images it could not read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core.errors import OodbenchError
from oodbench.evaluation.spec import EvaluationSpec

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
SIZE = 32  # the smallest --image-size taken (extract.cli.MIN_IMAGE_SIZE)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy store: fit, id and ood entries of model 'toy' with a head (provenance recorded)."""
    root = tmp_path_factory.mktemp("input-checks") / "store"
    rng = np.random.default_rng(0)
    opened = Store(root)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), np.zeros(3, np.float32)
    for name, n in (("fit", 40), ("id", 30), ("ood", 30)):
        z = rng.normal(size=(n, 5)).astype(np.float32)
        opened.write_outputs("toy", name, Outputs(z, z @ weight.T, rng.integers(0, 3, n)), provenance=PROV)
    opened.write_head("toy", Head(weight, bias), provenance=PROV)
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Image folders for evaluate-model: train and val with two class folders, ood with one unreadable file."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for split, per_class in (("train", 4), ("val", 3)):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    (root / "ood").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(root / "ood" / f"{i}.png")
    (root / "ood" / "broken.png").write_bytes(b"not a png")
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of one command line run through the console entry point."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """Run a command that must be refused: exit 2, one 'error: …' line on stderr holding every needle."""
    code, _, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def evaluate(store: Path, out: Path, *extra: object) -> list[object]:
    """`oodbench evaluate` on the toy store."""
    args = ["evaluate", "--store", store, "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    return [*args, "-d", "msp", "--out", out, "--no-progress", *extra]


def evaluate_model(images: Path, store: Path | None, *extra: object) -> list[object]:
    """`oodbench evaluate-model` on the image folders with a tiny random timm model (no store: a temporary one)."""
    args = ["evaluate-model", "test_resnet", "--no-pretrained", "--fit", f"train={images / 'train'}"]
    args += ["--id", f"val={images / 'val'}", "--ood", f"noise={images / 'ood'}"]
    args += [] if store is None else ["--store", store]
    return [*args, "-d", "msp", "--workers", "0", "--no-progress", *extra]


@pytest.fixture(scope="module")
def run_dir(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An evaluation run of the toy store, for `analyze`."""
    out = tmp_path_factory.mktemp("run") / "run"
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in evaluate(store, out)])
    assert info.value.code == 0
    return out


# ------------------------------------------------------------------------------------------- --image-size
@pytest.mark.parametrize("size", ["0", "-5", "16"])
def test_evaluate_model_refuses_an_image_size_no_network_takes_before_the_store_is_made(
    size: str, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(evaluate_model(images, tmp_path / "feats", f"--image-size={size}"), capsys, "--image-size", "32")
    assert not (tmp_path / "feats").exists()


@pytest.mark.parametrize("size", ["0", "-5", "31"])
def test_extract_refuses_an_image_size_no_network_takes_before_the_store_is_made(
    size: str, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["extract", "--model", "test_resnet", "--no-pretrained", "--data", images / "val"]
    args += ["--store", tmp_path / "feats", f"--image-size={size}", "--no-progress"]
    refused(args, capsys, "--image-size: must be at least 32 pixels", f"got {size}")
    assert not (tmp_path / "feats").exists()


# ------------------------------------------------------------------------------------------ --save-detectors
def test_evaluate_refuses_a_file_as_save_detectors_before_fitting(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    refused(evaluate(store, tmp_path / "run", "--save-detectors", afile), capsys, "--save-detectors", "not a directory")
    assert not (tmp_path / "run").exists()  # nothing fitted, nothing written


def test_evaluate_model_refuses_a_file_as_save_detectors_or_out_before_extracting(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for option in ("--save-detectors", "--out"):
        argv = evaluate_model(images, tmp_path / "feats", "--image-size", SIZE, option, afile)
        refused(argv, capsys, f"{option}: ", "not a directory")
        assert not (tmp_path / "feats").exists()  # no image was extracted


# ------------------------------------------------------------------------------ options named as typed
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--gram-dtype", "float16", "--gram-dtype: must be one of float64, float32; got 'float16'"),
        ("--small-fit-set", "maybe", "--small-fit-set: must be one of fail, adapt; got 'maybe'"),
        ("--tpr", "1.5", "--tpr: must lie in (0, 1]"),
    ],
)
def test_evaluation_options_are_named_as_the_user_typed_them(
    option: str, value: str, message: str, store: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(evaluate(store, tmp_path / "run", option, value), capsys, message)
    assert "gram_dtype" not in line and "small_fit_set" not in line
    refused(evaluate_model(images, tmp_path / "feats", option, value), capsys, message)


def test_the_python_spec_names_its_fields() -> None:
    """The spec (Python callers and the experiment file) names its field; only the command line names options."""
    with pytest.raises(OodbenchError, match=r"^small_fit_set: must be one of fail, adapt"):
        EvaluationSpec.build(["msp"], ood=["ood"], small_fit_set="maybe")
    with pytest.raises(OodbenchError, match=r"^gram_dtype must be one of"):
        EvaluationSpec.build(["msp"], ood=["ood"], gram_dtype="float16")


# ------------------------------------------------------------------------------------------- oodbench score
def test_score_names_the_files_it_wrote_or_says_it_wrote_none(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "kept"
    code, _, err = run(evaluate(store, tmp_path / "run", "--save-detectors", kept), capsys)
    assert code == 0, err
    scores = tmp_path / "scores"
    code, out, err = run(
        ["score", "--detector", kept / "msp", "--store", store, "--dataset", "ood", "--out", scores], capsys
    )
    assert code == 0, err
    assert "<dataset>" not in out
    line = f"scores: {scores / 'ood.npy'} (float64, row order) and {scores / 'ood.csv'} (item_index, score)"
    assert line in out.splitlines(), out
    assert (scores / "ood.npy").is_file() and (scores / "ood.csv").is_file()
    code, out, err = run(["score", "--detector", kept / "msp", "--store", store, "--dataset", "id"], capsys)
    assert code == 0, err
    assert out.startswith("id: 30 rows scored by msp") and "scores:" not in out
    assert err.strip() == "nothing written: pass --out DIR to keep the scores"


# -------------------------------------------------------------------------------------- detectors new NAME
def test_detectors_new_refuses_a_built_in_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["detectors", "new", "energy", "--out", tmp_path / "plugin"], capsys, "'energy' is already registered")
    assert not (tmp_path / "plugin").exists()


def test_detectors_new_refuses_a_plugin_detector_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oodbench.detectors import Detector, Requirements, register, registry

    saved = registry._snapshot()
    try:

        @register("taken_by_plugin")
        class Taken(Detector):
            requires = Requirements.of(score=("logits",))

        refused(["detectors", "new", "taken_by_plugin", "--out", tmp_path / "p"], capsys, "already registered")
        assert not (tmp_path / "p").exists()
    finally:
        registry._restore(saved)
    code, out, err = run(["detectors", "new", "taken_by_plugin", "--out", tmp_path / "p"], capsys)
    assert code == 0 and (tmp_path / "p" / "pyproject.toml").is_file(), err


# ------------------------------------------------------------------------------- analyze subsample --figure
def test_subsample_refuses_a_figure_format_before_the_study(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["analyze", "subsample", run_dir, "--n", "5", "--draws", "10", "--quiet"]
    refused([*argv, "--figure", tmp_path / "figx.txt"], capsys, "--figure", "'txt'", ".png, .pdf or .svg")
    assert not (run_dir / "analysis" / "subsample.json").exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    refused([*argv, "--figure", afile / "fig.png"], capsys, "--figure", "not a directory")
    assert not (run_dir / "analysis" / "subsample.json").exists()
    # No suffix: a PNG, and the line names the file written.
    code, _, err = run([*argv, "--figure", tmp_path / "figx"], capsys)
    assert code == 0, err
    assert (tmp_path / "figx.png").is_file() and f"wrote {tmp_path / 'figx.png'}" in err


# -------------------------------------------------------------------------------- evaluate-model's report
def test_evaluate_model_counts_the_rows_stored_and_the_unreadable_images_and_names_the_table(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for store in (tmp_path / "feats", None):  # a kept store, and the temporary one
        out = tmp_path / ("run" if store else "run-temporary")
        code, stdout, err = run(evaluate_model(images, store, "--image-size", SIZE, "--out", out), capsys)
        assert code == 0, err
        # 8 fit + 6 ID + 4 OOD images stored; the fifth OOD file is not an image.
        assert "read 19 images: extracted 18, 1 unreadable (no row in the store)" in stdout
        assert f"results: {out / 'results.parquet'}  table: {out / 'table.md'}" in stdout
        assert (out / "table.md").is_file()
    kept = Store(tmp_path / "feats")
    (model,) = kept.models()
    assert len(kept.read(model, "noise").features) == 4


# -------------------------------------------------------------------------------- -d repeated
def test_repeated_detector_options_are_joined_not_overridden(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `-d msp -d energy` must select both (a single-valued option would keep the last and drop msp silently).
    out = tmp_path / "both"
    code, _, err = run([*evaluate(store, out), "-d", "energy"], capsys)
    assert code == 0, err
    table = (out / "table.md").read_text(encoding="utf-8")
    assert "msp" in table and "energy" in table


# -------------------------------------------------------------------------------- accuracy's ReaL default
def test_accuracy_scores_top1_and_says_why_real_is_skipped_on_an_entry_without_its_images(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The entry records no item list, so ReaL's per-image labels cannot be matched: by default that is said and the
    # original labels' Top-1 still printed; asked for with --real, it is one error line.
    argv = ["accuracy", "--store", store, "--model-id", "toy", "--dataset", "id"]
    code, out, err = run(argv, capsys)
    assert code == 0 and "ReaL labels not scored" in err and "top1=" in out, (out, err)
    refused([*argv, "--real"], capsys, "records no item list")
