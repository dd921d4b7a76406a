"""A model whose named weights are not what timm loads (BiT-s) is skipped until its checkpoint is given, never run
on other weights under the paper's name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.runner.config import load_config, parse_config

from .helpers import CONFIGS, FAST_DEMO

FI = CONFIGS / "fi-imagenet-1k.toml"
BIT_S = "models[23]"


def test_bit_s_is_skipped_without_a_checkpoint(tmp_path: Path) -> None:
    config = load_config(FI, workdir=tmp_path / "run")
    assert [(m.display_name, m.key_path) for m, _ in config.skipped_models] == [("BiT-s", BIT_S)]
    assert "BiT-s" not in config.models and "BiT-m" in config.models
    assert all(m.params["name"] != "resnetv2_101x1_bit" for m in config.models.values() if m.kind == "timm")
    ((_, reason),) = config.skipped_models
    assert "BiT-S" in reason and "BiT-m" in reason


def test_with_a_checkpoint_bit_s_runs_on_that_file(tmp_path: Path) -> None:
    weights = tmp_path / "bit_s.safetensors"
    weights.write_bytes(b"")
    config = load_config(FI, overrides=[f"{BIT_S}.checkpoint={weights}"], workdir=tmp_path / "run")
    assert config.skipped_models == ()
    bit_s = config.models["BiT-s"]
    assert bit_s.params["checkpoint"] == str(weights) and "needs_checkpoint" not in bit_s.params
    assert bit_s.kind_of.weights(bit_s) == f"timm resnetv2_101x1_bit + {weights}"
    assert len(config.classifiers) == 30


def test_dry_run_shows_bit_s_as_needing_a_checkpoint(tmp_path: Path) -> None:
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--summary", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("BiT-s ")]
    assert "timm resnetv2_101x1_bit: needs checkpoint = PATH (timm has no ImageNet-1k-only BiT-S" in line
    assert line.endswith(f"skipped until {BIT_S}.checkpoint is set")
    as_json = json.loads(
        CliRunner().invoke(app, ["run", str(FI), "--dry-run", "--json", "--out", str(tmp_path / "w")]).output
    )
    assert [m["display"] for m in as_json["skipped_models"]] == ["BiT-s"]
    assert "BiT-s" not in {m["display"] for m in as_json["models"]}
    assert not [u for u in as_json["units"] if u["model"] == "BiT-s"]


def test_every_model_skipped_is_an_error() -> None:
    data = tomllib.loads((CONFIGS / "demo.toml").read_text(encoding="utf-8"))
    data["models"] = [{"kind": "timm", "name": "resnet50.a1_in1k", "checkpoint_required": "a file is needed"}]
    try:
        parse_config(data)
    except Exception as exc:  # ConfigError, checked by message
        assert str(exc) == "models: every model is skipped (models[0]: a file is needed)"
    else:
        raise AssertionError("a config whose every model is skipped was accepted")


def test_run_says_in_one_line_that_it_skips_the_model(demo_copy: Path, tmp_path: Path) -> None:
    from oodbench.runner.cli import register

    text = (CONFIGS / "demo.toml").read_text(encoding="utf-8")
    text += '\n[[models]]\nid = "BiT-s"\nkind = "timm"\nname = "resnetv2_101x1_bit"\n'
    text += 'checkpoint_required = "timm ships no BiT-S weights"\n'
    experiment = tmp_path / "demo-plus.toml"
    experiment.write_text(text, encoding="utf-8")
    app = typer.Typer(cls=OodbenchGroup)
    register(app)
    app.command("noop")(lambda: None)
    sets = [arg for item in FAST_DEMO for arg in ("--set", item)]
    result = CliRunner().invoke(app, ["run", str(experiment), "--out", str(demo_copy), "--no-progress", *sets])
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if "BiT-s" in line]
    assert skipped == ["skipping BiT-s: needs checkpoint = PATH (models[1].checkpoint): timm ships no BiT-S weights"]
    assert "everything cached" in result.output
