"""The resolve-once evaluation specification and the detector selection syntax."""

from __future__ import annotations

import pytest

from oodbench.core.errors import DetectorError, OodbenchError
from oodbench.core.papers import POST_HOC_POOL
from oodbench.detectors import available, create
from oodbench.evaluation.spec import EvaluationSpec, select_detectors


def test_selection_syntax() -> None:
    everything = available()
    assert select_detectors(None) == everything and select_detectors("all") == everything
    assert select_detectors("all,-she,-openmax") == [n for n in everything if n not in ("she", "openmax")]
    assert select_detectors("-she") == [n for n in everything if n != "she"]  # leaving out starts from all
    paper = select_detectors("paper")
    assert len(paper) == 21 and set(paper) == POST_HOC_POOL and paper == [n for n in everything if n in paper]
    assert select_detectors("paper,-knn,odin") == [n for n in paper if n != "knn"] + ["odin"]
    assert select_detectors(" msp , energy ,msp") == ["msp", "energy"]
    with pytest.raises(DetectorError) as caught:
        select_detectors("msp,mps,enrgy,-knnn")
    message = str(caught.value)  # every unknown name in one line, each with its suggestion
    assert "'mps'" in message and "'enrgy'" in message and "'knnn'" in message and "did you mean 'energy'" in message
    with pytest.raises(DetectorError, match="leaves no detector"):
        select_detectors("msp,-msp")


def test_spec_resolves_parameters_and_validates_once() -> None:
    spec = EvaluationSpec.build("knn,msp", params={"knn": {"k": 5}}, ood=["a", "b"], convention="openood")
    assert spec.detectors == {"knn": {"k": 5}, "msp": {}}
    assert spec.resolved["knn"] == create("knn", k=5).get_params() and spec.resolved["knn"]["index"] == "flat"
    assert spec.groups is not None and spec.conventions == ["oodbench", "openood"]  # openood's default groups
    assert spec.scored == ["id", "a", "b"] and spec.datasets == ["fit", "id", "a", "b"]
    assert EvaluationSpec.build(["msp"], ood=["a"], convention="openood", default_groups=False).groups is None
    for kwargs, message in (
        ({"ood": []}, "no OOD datasets"),
        ({"ood": ["id"]}, "distinct"),
        ({"ood": ["a"], "tpr": float("nan")}, "tpr"),
        ({"ood": ["a"], "tpr": 1.5}, "tpr"),
        ({"ood": ["a"], "convention": "both"}, "convention"),
        ({"ood": ["a"], "small_fit_set": "shrink"}, "small_fit_set"),
        ({"ood": ["a"], "gram_dtype": "half"}, "half"),
        ({"ood": ["a"], "params": {"knn": {"kk": 1}}}, "kk"),
        ({"ood": ["a"], "params": {"energy": {"temperature": 1}}}, "not evaluated"),
    ):
        with pytest.raises(OodbenchError, match=message):
            EvaluationSpec.build(["knn"], **kwargs)
