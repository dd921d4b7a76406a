"""Experiment files: invalid ones are rejected with the offending key named; overrides and path variables work."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oodbench.core.errors import ConfigError
from oodbench.runner.config import apply_overrides, load_config, missing_roots, parse_config

from .helpers import CONFIGS

DEMO = tomllib.loads((CONFIGS / "demo.toml").read_text(encoding="utf-8"))


def timm_experiment(tmp_path: Path) -> dict[str, Any]:
    """A small real-kind experiment: one timm model on an image folder, a subset, two OOD sets."""
    return {
        "experiment": {"name": "t", "workdir": str(tmp_path / "w")},
        "paths": {"data": str(tmp_path / "data")},
        "models": [
            {"kind": "timm", "name": "resnet50.tv_in1k"},
            {"kind": "open_clip", "name": "ViT-B-16", "pretrained": "openai"},
        ],
        "datasets": {
            "fit": {"kind": "folder", "root": "${data}/fit", "labels": True},
            "val": {"kind": "folder", "root": "${data}/val", "labels": True},
            "val-clean": {"kind": "subset", "of": "val", "exclude": ["${data}/bad.txt"]},
            "ninco": {"kind": "registry", "root": "${data}/ood"},
            "noise": {"kind": "folder", "root": "${data}/noise"},
        },
        "id": {"fit": "fit", "test": "val-clean"},
        "ood": {"datasets": ["ninco", "noise"]},
        "detectors": {"include": ["msp", "knn"], "params": {"knn": {"k": 5}}},
        "zeroshot": {"scores": ["mcm", "neglabel"], "vocabularies": {"wn": {"build": "wordnet", "m": 100}}},
    }


def mutate(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    change(data)
    return data


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node: Any = data
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value

    return change


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node: Any = data
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[parts[-1]]

    return change


def test_shipped_demo_config_is_valid() -> None:
    config = parse_config(DEMO)
    assert [m.id for m in config.models.values()] == ["digits-cnn"]
    assert config.ood == ("digits-6to9", "lfw-faces", "noise")
    assert config.detectors["knn"]["k"] == 10
    # Detectors not mentioned get their documented defaults resolved (hashed into unit keys).
    from oodbench import detectors

    assert config.detectors["msp"] == detectors.get_class("msp").default_params()


@pytest.mark.parametrize(
    "change, key",
    [
        (_set("experimnt", {}), "experimnt"),
        (_set("experiment.seed", "zero"), "experiment.seed"),
        (_set("experiment.tpr", 1.5), "experiment.tpr"),
        (_set("models.0.kind", "keras"), "models[0].kind"),
        (_set("models.0.epochs", 0), "models[0].epochs"),
        (_set("models.0.colour", "red"), "models[0].colour"),
        (_set("datasets.noise.kind", "mnist"), "datasets.noise.kind"),
        (_set("datasets.fancy", {"kind": "demo"}), "datasets.fancy"),
        (_set("id.test", "digits-test"), "id.test"),
        (_del("id.fit"), "id.fit"),
        (_set("ood.datasets", []), "ood.datasets"),
        (_set("ood.datasets", ["noise", "noise"]), "ood.datasets"),
        (_set("detectors.include", ["msp", "mahalanobis"]), "detectors.include[1]"),
        (_set("detectors.exclude", ["knnn"]), "detectors.exclude[0]"),
        (_set("detectors.params.knn.kk", 3), "detectors.params.knn.kk"),
        (_set("detectors.params.knn.k", 0), "detectors.params.knn"),
        (_set("detectors.params.sobel", {}), "detectors.params.sobel"),
        (_set("analysis.subsample.n", "half"), "analysis.subsample.n"),
        (_set("analysis.subsample.draws", 0), "analysis.subsample.draws"),
        (_set("analysis.bootstrap", {}), "analysis.bootstrap"),
        (_set("analysis.intervals.methods", ["wald"]), "analysis.intervals.methods[0]"),
        (_set("report.formats", ["pdf"]), "report.formats[0]"),
        (_set("experiment.store", "/tmp/elsewhere/features"), "experiment.store"),
    ],
)
def test_invalid_demo_configs_name_the_key(change: Callable[[dict[str, Any]], None], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(mutate(DEMO, change))
    assert str(info.value).startswith(f"{key}:"), str(info.value)


def test_valid_real_kind_experiment(tmp_path: Path) -> None:
    config = parse_config(timm_experiment(tmp_path))
    assert list(config.models) == ["resnet50.tv_in1k", "ViT-B-16@openai"]
    assert config.datasets["fit"].params["root"] == str(tmp_path / "data" / "fit")  # ${data} expanded
    assert config.datasets["val-clean"].params["exclude"] == [str(tmp_path / "data" / "bad.txt")]
    assert [m.id for m in config.vlms] == ["ViT-B-16@openai"]
    assert config.datasets_of(config.models["ViT-B-16@openai"]) == ["val-clean", "ninco", "noise"]


@pytest.mark.parametrize(
    "change, key",
    [
        (_set("models.0.name", "resnet5000"), "models[0].name"),
        (_set("models.0.name", "resnet50.no_such_tag"), "models[0].name"),
        (_set("models.1.name", "ViT-B-17"), "models[1].name"),
        (_set("models.1.pretrained", "laion9b"), "models[1].pretrained"),
        (_del("models.1.pretrained"), "models[1].pretrained"),
        (_set("models.0.id", "a/b"), "models[0].id"),
        (_set("models.1.id", "resnet50.tv_in1k"), "models[1].id"),
        (_set("datasets.ninco.name", "ninko"), "datasets.ninco.name"),
        (_del("datasets.fit.root"), "datasets.fit.root"),
        (_set("datasets.fit.root", "${nowhere}/fit"), "datasets.fit.root"),
        (_set("datasets.val-clean.of", "vall"), "datasets.val-clean.of"),
        (_del("datasets.val-clean.exclude"), "datasets.val-clean"),
        (_set("zeroshot.scores", ["mcm", "negative-label"]), "zeroshot.scores[1]"),
        (_set("zeroshot.params", {"mcm": {"temperature": 1}}), "zeroshot.params.mcm.temperature"),
        (_set("zeroshot.vocabularies.wn", {"build": "llm"}), "zeroshot.vocabularies.wn.build"),
        (_set("zeroshot.models", ["resnet50.tv_in1k"]), "zeroshot.models[0]"),
        (_del("zeroshot"), "models[1]"),
    ],
)
def test_invalid_real_kind_configs_name_the_key(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(mutate(timm_experiment(tmp_path), change))
    assert str(info.value).startswith(f"{key}:"), str(info.value)


def test_unknown_names_come_with_suggestions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'resnet50'"):
        parse_config(mutate(timm_experiment(tmp_path), _set("models.0.name", "resnet500")))
    with pytest.raises(ConfigError, match="did you mean 'knn'"):
        parse_config(mutate(DEMO, _set("detectors.include", ["kNN"])))


def test_missing_roots_are_reported_with_their_keys(tmp_path: Path) -> None:
    config = parse_config(timm_experiment(tmp_path))
    (tmp_path / "data" / "fit").mkdir(parents=True)
    problems = missing_roots(config)
    assert set(problems) == {
        "datasets.val.root",
        "datasets.ninco.root",
        "datasets.noise.root",
        "datasets.val-clean.exclude[0]",
    }
    assert "does not exist" in problems["datasets.val.root"]


def test_toml_syntax_errors_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment\nname = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such experiment file"):
        load_config(tmp_path / "absent.toml")


def test_a_5000_deep_toml_array_is_one_line_with_exit_status_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oodbench.cli.main import app

    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(deep)
    result = CliRunner().invoke(app, ["run", str(deep), "--dry-run"])
    assert result.exit_code == 2 and "nested too deeply" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    with pytest.raises(ConfigError, match="nested too deeply"):
        apply_overrides(DEMO, ["experiment.name=" + "[" * 5000 + "]" * 5000])


def test_overrides() -> None:
    data = apply_overrides(
        DEMO, ["models[0].epochs=7", "detectors.params.knn.k=3", "paths.data=/mnt/x", "experiment.name=hello world"]
    )
    assert data["models"][0]["epochs"] == 7
    assert data["detectors"]["params"]["knn"]["k"] == 3
    assert data["paths"]["data"] == "/mnt/x"
    assert data["experiment"]["name"] == "hello world"  # not TOML: kept as a string
    assert DEMO["models"][0]["epochs"] == 40  # the input is not modified
    with pytest.raises(ConfigError, match="models.5"):
        apply_overrides(DEMO, ["models[5].epochs=1"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides(DEMO, ["models"])


def test_environment_path_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = timm_experiment(tmp_path)
    data["paths"] = {"base": "${env:OODB_TEST_ROOT}", "data": "${base}/data"}
    monkeypatch.setenv("OODB_TEST_ROOT", str(tmp_path / "env"))
    config = parse_config(data)
    assert config.datasets["noise"].params["root"] == str(tmp_path / "env" / "data" / "noise")
    monkeypatch.delenv("OODB_TEST_ROOT")
    with pytest.raises(ConfigError, match=r"^paths\.base: environment variable 'OODB_TEST_ROOT'"):
        parse_config(data)


def test_a_float32_gram_changes_the_fit_keys_of_the_gram_detectors_only(tmp_path: Path) -> None:
    from oodbench.runner.plan import build_plan

    data = copy.deepcopy(DEMO)
    data["experiment"]["workdir"] = str(tmp_path)
    plans = {}
    for gram_dtype in ("float64", "float32"):
        data["detectors"]["gram_dtype"] = gram_dtype
        config = parse_config(data)
        assert config.gram_dtype == gram_dtype
        plans[gram_dtype] = {u.label: u.key for u in build_plan(config).units if u.stage == "fit"}
    changed = {label.split("/")[1] for label in plans["float64"] if plans["float64"][label] != plans["float32"][label]}
    assert changed == {"maha", "rmaha", "maha++", "rmaha++", "neco", "vim", "residual"}
    with pytest.raises(ConfigError, match="detectors.gram_dtype"):
        parse_config(mutate(DEMO, _set("detectors.gram_dtype", "half")))
