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


def test_peers_selects_the_detectors_whose_summary_names_a_peer() -> None:
    from oodbench.detectors import get_class, origin
    from oodbench.detectors.catalog import PEERS, also_in_items

    everything = available()
    # Each built-in's "also in" cell names only the peer libraries (remarks in parentheses aside): a misspelt
    # peer would silently leave a detector out of `peers`.
    for name in everything:
        summary = get_class(name).summary
        if origin(name).builtin and summary is not None:
            assert set(also_in_items(summary.also_in)) <= set(PEERS), (name, summary.also_in)
    peers = select_detectors("peers")
    declared = [n for n in everything if get_class(n).summary and get_class(n).summary.also_in]
    assert peers == declared
    # Known rows of the table: neco and the ++ variants have no peer; ash_s is pytorch-ood's only, residual
    # OpenOOD's only, mcm's entry carries a remark in parentheses.
    assert {"msp", "knn", "ash_s", "residual", "mcm", "ash_b"} <= set(peers)
    assert not {"neco", "maha++", "rmaha++", "cosine"} & set(peers)
    assert select_detectors("peers,-she,neco") == [n for n in peers if n != "she"] + ["neco"]
    assert select_detectors("all,-peers") == [n for n in everything if n not in peers]
    assert also_in_items("pytorch-ood, OpenOOD (its `ash` postprocessor, at p=90)") == ["pytorch-ood", "OpenOOD"]
