"""configs/fi-imagenet-1k.toml validates offline (names resolve in timm/open_clip, no weights) and its dry run lists
every (model, dataset, detector) unit."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench import detectors
from oodbench.analysis.published import POST_HOC_POOL
from oodbench.runner.config import load_config
from oodbench.runner.plan import build_plan
from oodbench.runner.units import ZeroShotUnit

from .helpers import CONFIGS

FI = CONFIGS / "fi-imagenet-1k.toml"
OOD = [
    "inat-ood-plants",
    "openimage-o",
    "360openset",
    "cood",
    "imagenet-o",
    "textures",
    "places",
    "ssb-easy",
    "ssb-hard",
    "species",
    "in1k-ood",
    "ninco",
    "clean-ood",
    "imagenet-ood",
    "fi-imagenet-1k",
    # NINCO's 11 cleaned sub-samples (Table A3)
    "inat-ood-plants-clean",
    "openimage-o-clean",
    "360openset-clean",
    "cood-clean",
    "imagenet-o-clean",
    "textures-clean",
    "places-clean",
    "ssb-easy-clean",
    "ssb-hard-clean",
    "species-clean",
    "in1k-ood-clean",
]


@pytest.fixture(scope="module")
def fi_config(tmp_path_factory: pytest.TempPathFactory):
    return load_config(FI, workdir=tmp_path_factory.mktemp("fi") / "run")


def test_fi_config_declares_the_seed_setup(fi_config) -> None:
    kinds = [m.kind for m in [*fi_config.models.values(), *(m for m, _ in fi_config.skipped_models)]]
    assert [m.display_name for m, _ in fi_config.skipped_models] == ["BiT-s"]  # until its checkpoint is given
    assert kinds.count("timm") == 28 and kinds.count("probe") == 2 and kinds.count("open_clip") == 7
    assert kinds.count("hf_clip") == 1
    assert {
        m.params["backbone"].split("_")[-1].split(".")[0] for m in fi_config.models.values() if m.kind == "probe"
    } == {"dinov2", "dinov3"}
    assert list(fi_config.ood) == OOD
    assert fi_config.id_test == "imagenet-val-fi-id" and fi_config.fit == "imagenet-train"
    id_set = fi_config.datasets["imagenet-val-fi-id"]
    assert id_set.kind == "subset" and id_set.params["of"] == "imagenet-val" and id_set.params["count"] == 48_365
    assert fi_config.datasets["fi-imagenet-1k"].params["count"] == 655
    # The paper's 21 (Sec. 4.1, "OOD Detectors"), listed by name: the registry holds more, none of them run here.
    assert set(fi_config.detectors) == POST_HOC_POOL and len(fi_config.detectors) == 21
    assert set(fi_config.detectors) < set(detectors.available())
    logit_scores = [s for s in fi_config.zeroshot.scores if s not in ("neglabel", "eoe")]
    assert len(logit_scores) == 7


def test_fi_plan_has_every_unit(fi_config) -> None:
    plan = build_plan(fi_config)
    classifiers = [m.id for m in fi_config.classifiers]
    tests = [fi_config.id_test, *OOD]
    assert {u.label for u in plan.stage("score") if not isinstance(u, ZeroShotUnit)} == {
        f"{m}/{d}/{t}" for m in classifiers for d in fi_config.detectors for t in tests
    }
    assert len(plan.stage("fit")) == 29 * 21  # BiT-s is skipped without its checkpoint
    # Every model needs every evaluated dataset (and ImageNet val, the parent of the two subsets) in the store.
    extracted = {u.label for u in plan.stage("extract")}
    for model in fi_config.models.values():
        for dataset in [*fi_config.datasets_of(model), "imagenet-val"]:
            assert f"{model.store_id}/{dataset}" in extracted
    assert all(u.status == "pending" for u in plan.units)
    # Nothing exists under the default data paths: every root is reported with its key, not raised.
    assert "datasets.ninco.root" in plan.problems and "datasets.fi-imagenet-1k.include[0]" in plan.problems
    assert "datasets.imagenet-ood.list" in plan.problems  # the authors' list: the user gives it


def test_fi_dry_run_prints_every_model_dataset_detector_unit(fi_config, tmp_path: Path) -> None:
    from oodbench.runner.cli import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    listed = {token for line in result.output.splitlines() for token in line.split() if "/" in token}
    tests = [fi_config.id_test, *OOD]
    for model in fi_config.classifiers:
        for detector in fi_config.detectors:
            for dataset in tests:
                assert f"{model.id}/{detector}/{dataset}" in listed
    for model_id in fi_config.zeroshot.models:
        eoe = ("eoe@eoe", "eoe@eoe-far", "eoe@eoe-near")  # fine-grained (Table 2), far, near (Table A4)
        for column in ("mcm", "glmcm", "neglabel@wordnet", "neglabel@siblings[k=5]", "neglabel@oracle", *eoe):
            for dataset in tests:
                assert f"{model_id}/{column}/{dataset}" in listed
    assert "50,000 images" in result.output  # ImageNet val, from the dataset registry
    assert "datasets.imagenet-val.root:" in result.output


def test_fi_dry_run_lists_per_vlm_glmcm_and_the_three_eoe_styles(fi_config, tmp_path: Path) -> None:
    """Each of the eight VLMs produces GL-MCM (with its tower's patch route) and EOE in its three prompt styles."""
    from oodbench.runner.cli import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index("zero-shot scores per VLM (each on the ID test set and every OOD set):")
    routes = {
        "MetaCLIP2-H/14": "open_clip-vit",
        "OpenCLIP-H/14": "open_clip-vit",
        "SigLIP-SO400M": "timm-attention-pool",
        "SigLIP2-g": "timm-attention-pool",
        "CLIP-B/16": "open_clip-vit",
        "CLIP-L/14": "open_clip-vit",
        "PE-Core-L/14": "timm-attention-pool",
        "AIMv2-L": "aimv2",
    }
    for offset, (display, route) in enumerate(routes.items()):
        scores, vocab, patches = lines[start + 1 + 3 * offset : start + 4 + 3 * offset]
        assert scores.split() == [display, "mcm", "maxlogit", "energy", "gen", "entropy", "margin", "glmcm"]
        assert {"eoe@eoe", "eoe@eoe-far", "eoe@eoe-near"} <= set(vocab.split())
        assert patches.strip() == f"GL-MCM patches ({route})"
    assert any(line.startswith("  GL-MCM patches (timm-attention-pool): ") for line in lines)


def test_fi_dry_run_shows_each_dataset_with_its_published_size_and_list(tmp_path: Path) -> None:
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--summary", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.split()}
    assert rows["imagenet-ood"].split()[1:3] == ["registry", "31,802"] and "imagenetood.txt" in rows["imagenet-ood"]
    assert (
        rows["ninco"].split()[2] == "5,879"
        and "Table 3; official list missing (not in data/imagelists)" in rows["ninco"]
    )
    assert rows["places-clean"].split()[2] == "153" and "Table A3" in rows["places-clean"]
    assert rows["fi-imagenet-1k"].split()[1:] == ["subset", "655", "rows", "of", "imagenet-val"]
    assert "datasets.ninco.lists: lists folder data/imagelists does not exist" in result.output


def test_fi_dry_run_reads_the_official_lists_from_the_lists_path(tmp_path: Path, monkeypatch) -> None:
    import hashlib
    from dataclasses import replace

    from oodbench.cli.main import app
    from oodbench.extract import imagelists

    lists = tmp_path / "lists"
    lists.mkdir()
    data = b"image_location,class\r\nNINCO_OOD_classes/a/a_000.jpg,a\r\n"  # a synthetic NINCO_OOD_classes.csv
    (lists / "NINCO_OOD_classes.csv").write_bytes(data)
    pinned = replace(imagelists.LIST_SOURCES["NINCO_OOD_classes.csv"], sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(imagelists.LIST_SOURCES, "NINCO_OOD_classes.csv", pinned)
    args = ["run", str(FI), "--dry-run", "--summary", "--out", str(tmp_path / "w"), "--set", f"paths.lists={lists}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.split()}
    assert "image list: official (NINCO, MIT): NINCO_OOD_classes.csv" in rows["ninco"]
    assert f"official list missing (not in {lists})" in rows["clean-ood"]
    assert "datasets.ninco.lists" not in result.output


def test_a_modified_official_list_stops_the_run_before_any_work(tmp_path: Path) -> None:
    """A lists-folder file whose SHA-256 is not the pinned one is an input problem of the plan (the dry run names it
    and `oodbench run` refuses before extracting anything), not an error hours later when its set is read."""
    from oodbench.cli.main import app

    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "NINCO_OOD_classes.csv").write_bytes(b"image_location,class\r\nNINCO_OOD_classes/a/a_000.jpg,a\r\n")
    args = ["run", str(FI), "--dry-run", "--summary", "--out", str(tmp_path / "w"), "--set", f"paths.lists={lists}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    problem = [line for line in result.output.splitlines() if "datasets.ninco.lists:" in line]
    assert len(problem) == 1 and "is not github.com/j-cb/NINCO" in problem[0] and "SHA-256" in problem[0]
    assert not any("datasets.clean-ood.lists:" in line for line in result.output.splitlines())  # its file is absent
    run = CliRunner().invoke(app, args[:2] + args[4:] + ["--only", "extract"])
    assert run.exit_code == 2 and "datasets.ninco.lists:" in run.output
    assert not (tmp_path / "w" / "store").exists()
