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
