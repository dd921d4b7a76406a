"""Network-time detector settings of a timm model enter its extraction key: each setting is its own cached extraction."""

from __future__ import annotations

from pathlib import Path

import pytest

from oodbench.core.errors import ConfigError
from oodbench.runner.config import parse_config
from oodbench.runner.plan import build_plan

from .test_config import _set, mutate, timm_experiment


def _extract_keys(data: dict) -> dict[str, str]:
    return {u.label: u.key for u in build_plan(parse_config(data)).units if u.stage == "extract"}


def test_each_setting_has_its_own_extraction_key(tmp_path: Path) -> None:
    base = timm_experiment(tmp_path)
    plain = _extract_keys(base)
    sweep = mutate(
        base,
        lambda data: data["models"].extend(
            [
                {"kind": "timm", "name": "resnet50.tv_in1k", "id": "r50-odin-e0014", "network": ["odin"]},
                {
                    "kind": "timm",
                    "name": "resnet50.tv_in1k",
                    "id": "r50-odin-e0028",
                    "network": ["odin:epsilon=0.0028"],
                },
            ]
        ),
    )
    keys = _extract_keys(sweep)
    for dataset in ("fit", "val", "ninco", "noise"):
        settings = {
            keys[f"resnet50.tv_in1k/{dataset}"],
            keys[f"r50-odin-e0014/{dataset}"],
            keys[f"r50-odin-e0028/{dataset}"],
        }
        assert len(settings) == 3  # plain, ε = 0.0014, ε = 0.0028: three extractions, each cached on its own
        assert keys[f"resnet50.tv_in1k/{dataset}"] == plain[f"resnet50.tv_in1k/{dataset}"]  # the others unchanged


@pytest.mark.parametrize(
    "network,message",
    [
        (["odin:epsilon=-1"], "epsilon must be a number >= 0"),
        (["rankfeat:layers="], "bad network detector spec"),
        (["odin", "odin:temperature=10"], "two network detector settings store extra.odin"),
        (["gradnorm"], "unknown network detector 'gradnorm'"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, network: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(mutate(timm_experiment(tmp_path), _set("models.0.network", network)))
    assert str(info.value).startswith("models[0].network:")


def test_skipped_network_time_scores_are_one_line_naming_the_network_list() -> None:
    """`oodbench run`'s skipped score units: one line for the network-time detectors whose arrays are not extracted
    (with the model table's `network` list that extracts them), one for the other reasons."""
    from oodbench.runner.cli import _skipped_lines

    skipped = {
        f"score:r50/{detector}/{dataset}": f"its arrays are not extracted (--net {setting})"
        for detector, setting in (("odin", "odin"), ("gram", "gram:layers=layer3+layer4"))
        for dataset in ("val", "ninco")
    }
    skipped["score:r50/maha/val"] = skipped["score:r50/maha/ninco"] = "fit set lacks labels"
    assert _skipped_lines(skipped) == [
        "skipped 2 network-time detectors (odin, gram): their arrays are not extracted; "
        'add network = ["odin", "gram:layers=layer3+layer4"] to the model\'s table to extract them',
        "2 score units skipped (requirements not met): fit set lacks labels",
    ]
