"""configs/fi-imagenet-1k.toml validates offline (names resolve in timm/open_clip, no weights) and its dry run lists
every (model, dataset, detector) unit."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench import detectors
from oodbench.runner.config import load_config
from oodbench.runner.plan import build_plan

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
]


@pytest.fixture(scope="module")
def fi_config(tmp_path_factory: pytest.TempPathFactory):
    return load_config(FI, workdir=tmp_path_factory.mktemp("fi") / "run")


def test_fi_config_declares_the_seed_setup(fi_config) -> None:
    kinds = [m.kind for m in fi_config.models.values()]
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
    # The paper's 21, listed by name: the registry also holds the peer libraries' detectors, registered after them.
    assert list(fi_config.detectors) == detectors.available()[:21] and len(fi_config.detectors) == 21
    logit_scores = [s for s in fi_config.zeroshot.scores if s not in ("neglabel", "eoe")]
    assert len(logit_scores) == 7


def test_fi_plan_has_every_unit(fi_config) -> None:
    plan = build_plan(fi_config)
    classifiers = [m.id for m in fi_config.classifiers]
    tests = [fi_config.id_test, *OOD]
    assert {u.label for u in plan.stage("score") if not u.spec.get("zeroshot")} == {
        f"{m}/{d}/{t}" for m in classifiers for d in fi_config.detectors for t in tests
    }
    assert len(plan.stage("fit")) == 30 * 21
    # Every model needs every evaluated dataset (and ImageNet val, the parent of the two subsets) in the store.
    extracted = {u.label for u in plan.stage("extract")}
    for model in fi_config.models.values():
        for dataset in [*fi_config.datasets_of(model), "imagenet-val"]:
            assert f"{model.store_id}/{dataset}" in extracted
    assert all(u.status == "pending" for u in plan.units)
    # Nothing exists under the default data paths: every root is reported with its key, not raised.
    assert "datasets.ninco.root" in plan.problems and "datasets.fi-imagenet-1k.include[0]" in plan.problems


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
        for column in ("mcm", "glmcm", "neglabel@wordnet", "neglabel@siblings[k=5]", "neglabel@oracle", "eoe@eoe"):
            for dataset in tests:
                assert f"{model_id}/{column}/{dataset}" in listed
    assert "50,000 images" in result.output  # ImageNet val, from the dataset registry
    assert "datasets.imagenet-val.root:" in result.output
