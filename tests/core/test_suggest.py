"""Did-you-mean: the closest names (a case-only difference, then prefix relations, then difflib; ties in name order)."""

from __future__ import annotations

import pytest

from oodbench.core.names import closest, suggest
from oodbench.detectors import available


def test_a_family_prefix_suggests_its_first_members_in_order() -> None:
    # Before: difflib's ties came in reverse name order: lite4, lite3, lite2.
    family = [f"tf_efficientnet_lite{i}" for i in range(5)] + ["tf_efficientnet_b0", "efficientnet_lite0"]
    assert closest("tf_efficientnet_lite", family) == [f"tf_efficientnet_lite{i}" for i in range(3)]


def test_a_full_name_suggests_its_abbreviation() -> None:
    # Before: 'mahalanobis' is too far from 'maha' for difflib (ratio 8/15 < 0.6): no suggestion at all.
    assert closest("mahalanobis", available()) == ["maha"]
    assert suggest("Mahalanobis", available()) == "; did you mean 'maha'?"


def test_typos_still_get_difflib_suggestions_most_similar_first() -> None:
    assert closest("mps", available())[0] == "msp"
    assert closest("enrgy", available())[0] == "energy"
    assert closest("qqqq", available()) == [] and suggest("qqqq", available()) == ""


def test_short_names_are_not_prefix_matches() -> None:
    # 'ms' begins 'msp' but two letters say too little; difflib still judges it (ratio 0.8).
    assert closest("m", ["msp", "maha"]) == []
    assert closest("ms", ["msp", "maha"]) == ["msp"]


@pytest.mark.parametrize("given", ["tf_efficientnet_lite", "TF_EFFICIENTNET_LITE"])
def test_timm_family_prefix_against_timms_own_list(given: str) -> None:
    timm = pytest.importorskip("timm")
    assert closest(given, timm.list_models())[0] == "tf_efficientnet_lite0"


def test_a_name_in_another_case_suggests_itself_first() -> None:
    assert closest("kNN", available())[0] == "knn"
    assert closest("TF_EFFICIENTNET_LITE0", ["tf_efficientnet_lite0", "tf_efficientnet_lite1"])[0] == (
        "tf_efficientnet_lite0"
    )
