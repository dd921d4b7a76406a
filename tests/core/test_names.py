"""The one name rule (oodbench.core.names): what may become a folder name, checked the same way everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oodbench.core.errors import ConfigError, StoreError
from oodbench.core.names import check_name, is_name


@pytest.mark.parametrize("name", ["resnet50.tv_in1k", "ViT-B-16@openai", "a", "x+probe", "k=5,m=3", "ninco_v2"])
def test_valid_names(name: str) -> None:
    assert is_name(name) and check_name(name, "id") == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a\\b", "..", "a..b", "a b", "é", None, 3])
def test_invalid_names(name: object) -> None:
    assert not is_name(name)
    with pytest.raises(ConfigError, match=r"^models\[0\]\.id: .* is not a valid name"):
        check_name(name, "models[0].id", error=ConfigError)


def test_vocabulary_names_leave_out_the_version_marker() -> None:
    assert is_name("wn@v2") and not is_name("wn@v2", allow_at=False)


@given(st.text(max_size=12))
def test_a_valid_name_is_one_safe_path_component(name: str) -> None:
    if is_name(name):
        assert "/" not in name and "\\" not in name and ".." not in name and name[0].isalnum() and name.isascii()


def test_the_store_uses_the_rule(tmp_path) -> None:
    from oodbench import Outputs, Store

    with pytest.raises(StoreError, match="invalid model id"):
        Store(tmp_path).write_outputs("a/b", "d", Outputs(__import__("numpy").ones((2, 3), "float32")), provenance={})


TRAILING = ["evil\n", "maha\n", "a\n", "resnet50\n", "wn@v2\n", "x\r\n"]


@pytest.mark.hostile
@pytest.mark.parametrize("name", TRAILING)
def test_a_name_ending_in_a_newline_is_refused(name: str) -> None:
    """`$` matches before a final newline: the rule must match the whole name."""
    assert not is_name(name) and not is_name(name, allow_at=False)


@pytest.mark.hostile
@pytest.mark.parametrize("name", TRAILING[:3])
def test_the_store_and_the_registry_refuse_a_name_ending_in_a_newline(tmp_path, name: str) -> None:
    import numpy as np

    from oodbench import Outputs, Store
    from oodbench.core.errors import DetectorError
    from oodbench.detectors.base import Detector
    from oodbench.detectors.registry import register

    with pytest.raises(StoreError, match="not a valid name"):
        Store(tmp_path).write_outputs(name, "d", Outputs(np.ones((2, 3), "float32")), provenance={})
    with pytest.raises(StoreError, match="not a valid name"):
        Store(tmp_path).write_outputs("m", name, Outputs(np.ones((2, 3), "float32")), provenance={})
    assert not (tmp_path / name).exists() and not (tmp_path / "m" / name).exists()
    with pytest.raises(DetectorError, match="not a valid name"):
        register(name)(type("Evil", (Detector,), {}))


@pytest.mark.hostile
@pytest.mark.parametrize(
    "module, pattern, valid",
    [
        ("oodbench.detectors.scaffold", "_NAME", "my_detector"),
        ("oodbench.extract.hf_clip", "_HUB_ID", "openai/clip-vit-base-patch16"),
        ("oodbench.extract.datasets", "_SYNSET", "n01440764"),
        ("oodbench.text.classes", "_WNID", "n01440764"),
        ("oodbench.audit.wordnet", "WNID", "n01440764"),
        ("oodbench.zeroshot.vocab.artefact", "_FILE", "v001-0123456789ab.json"),
        ("oodbench.analysis.published", "GENERATION", "wordnet.g2"),
    ],
)
def test_every_name_pattern_matches_whole_names_only(module: str, pattern: str, valid: str) -> None:
    import importlib

    compiled = getattr(importlib.import_module(module), pattern)
    assert compiled.match(valid) and not compiled.match(valid + "\n")
