"""Fit labels index the head's classes [0, C), and a supervised fit sees at least two classes.

The check lives in the data model (`outputs.check_class_labels`); every detector whose fit reads labels calls
it before any statistic is computed. Before it, a label of 99 with a 6-class head and a fit set of one class
were accepted and scored.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core.errors import DataError, DetectorError
from oodbench.core.outputs import _CHECK_CHUNK, check_class_labels
from oodbench.detectors import available, create

C = 6


def _fit_set(labels: np.ndarray, seed: int = 0) -> tuple[Outputs, Head]:
    """Features of class-dependent means, their logits under one fixed 6-class head, and the labels given."""
    head_rng, rng = np.random.default_rng(100), np.random.default_rng(seed)
    weight, bias = head_rng.normal(size=(C, 5)), head_rng.normal(size=C)
    features = rng.normal(size=(labels.shape[0], 5)) + labels[:, None] % C
    return Outputs(features, features @ weight.T + bias, labels), Head(weight, bias)


def _supervised() -> list[str]:
    """The registered detectors whose fit reads labels and that this fit set (features, logits, head) can run."""
    outputs, _ = _fit_set(np.arange(60) % C)
    names = []
    for name in available():
        detector = create(name)
        if "labels" in detector.requirements().fit and not detector.unmet(outputs, has_head=True):
            names.append(name)
    return names


def test_there_are_supervised_detectors_to_check():
    assert {"maha", "maha++"} <= set(_supervised())


@pytest.mark.parametrize("name", _supervised())
def test_a_label_outside_the_head_is_refused(name):
    labels = np.arange(60) % C
    labels[17] = 99
    fit_set, head = _fit_set(labels)
    with pytest.raises(
        DetectorError, match=re.escape(name) + r": fit set: label 99 at row 17; .* in \[0, 6\), the classes"
    ):
        create(name).fit(fit_set, head)


@pytest.mark.parametrize("name", _supervised())
def test_a_fit_set_of_one_class_is_refused(name):
    fit_set, head = _fit_set(np.full(60, 3))
    with pytest.raises(DetectorError, match=re.escape(name) + ": fit set: every label is 3; .* at least two classes"):
        create(name).fit(fit_set, head)


def test_unsupervised_detectors_do_not_look_at_labels():
    labels = np.full(60, 99)
    fit_set, head = _fit_set(labels)
    create("msp").fit(fit_set, head)  # labels are not its business


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(st.integers(-3, 9), min_size=1, max_size=40),
    classes=st.one_of(st.none(), st.integers(1, 8)),
)
def test_the_check_agrees_with_its_definition(labels, classes):
    array = np.array(labels)
    inside = all(0 <= v and (classes is None or v < classes) for v in labels)
    valid = inside and len(set(labels)) >= 2
    if valid:
        check_class_labels(array, classes)
        return
    with pytest.raises(DataError) as info:
        check_class_labels(array, classes)
    if not inside:
        first = next(i for i, v in enumerate(labels) if v < 0 or (classes is not None and v >= classes))
        assert f"label {labels[first]} at row {first};" in str(info.value)
    else:
        assert f"every label is {labels[0]}" in str(info.value)


def test_long_memory_mapped_labels_are_scanned_in_chunks(tmp_path):
    n = 2 * _CHECK_CHUNK + 5
    labels = np.zeros(n, dtype=np.int64)
    labels[-1] = 1
    np.save(tmp_path / "labels.npy", labels)
    mapped = np.load(tmp_path / "labels.npy", mmap_mode="r")
    check_class_labels(mapped, 2)  # the second class only in the last chunk: still two classes
    labels[-2] = 2
    np.save(tmp_path / "labels.npy", labels)
    with pytest.raises(DataError, match=f"label 2 at row {n - 2};"):
        check_class_labels(np.load(tmp_path / "labels.npy", mmap_mode="r"), 2)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.r_[np.arange(59) % C, 99], "maha: fit set: label 99 at row 59"),
        (np.zeros(60, dtype=np.int64), "every label is 0"),
    ],
)
def test_evaluate_refuses_them_in_one_line(tmp_path, capsys, labels, message):
    store = Store(tmp_path / "s")
    fit_set, head = _fit_set(labels)
    prov = {"model": "toy", "checkpoint": "c", "preprocessing": {}}
    store.write_outputs("toy", "fit", fit_set, provenance=prov)
    for name, seed in (("id", 1), ("ood", 2)):
        store.write_outputs("toy", name, _fit_set(np.arange(30) % C, seed)[0], provenance=prov)
    store.write_head("toy", head, provenance=prov)
    argv = ["evaluate", "--store", str(tmp_path / "s"), "--model", "toy", "--fit", "fit", "--id", "id"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--ood", "ood", "-d", "maha", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert message in [line for line in err.splitlines() if line.strip()][-1]
