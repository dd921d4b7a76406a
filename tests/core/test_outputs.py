"""Validation of the data model."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Head, Outputs
from oodbench.core.errors import DataError


def make(n=10, d=4, c=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(n, c)).astype(np.float32)


def test_valid_outputs_and_subset():
    features, logits = make()
    out = Outputs(features, logits, np.arange(10), {"aux": np.zeros((10, 2, 2), np.float16)})
    assert len(out) == 10 and out.num_features == 4 and out.num_classes == 3
    part = out.subset(slice(2, 5))
    assert len(part) == 3 and part.extras["aux"].shape == (3, 2, 2)
    assert np.array_equal(part.labels, [2, 3, 4])
    assert "C=3" in repr(out)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"features": np.ones(5)}, "features must be a 2-D"),
        ({"features": np.ones((5, 2), dtype=np.int64)}, "floating dtype"),
        ({"features": np.array([[1.0, np.nan]])}, "features contains NaN"),
        ({"features": np.ones((5, 2)), "logits": np.ones((4, 3))}, "logits has 4 rows"),
        ({"features": np.ones((5, 2)), "logits": np.array([[np.inf]] * 5)}, "logits contains NaN"),
        ({"features": np.ones((5, 2)), "labels": np.ones(5)}, "labels must be integers"),
        ({"features": np.ones((5, 2)), "labels": np.ones(4, int)}, "labels has 4 entries"),
        ({"features": np.ones((5, 2)), "extras": {"x": np.ones(3)}}, r"extras\['x'\]"),
    ],
)
def test_invalid_outputs_name_the_field(kwargs, message):
    with pytest.raises(DataError, match=message):
        Outputs(**kwargs)


def test_head_reproduces_logits_and_rejects_foreign_head():
    rng = np.random.default_rng(1)
    weight, bias = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    head = Head(weight, bias)
    features = rng.normal(size=(20, 4)).astype(np.float32)
    outputs = Outputs(features, (features @ weight.T + bias).astype(np.float32))
    head.check_outputs(outputs)
    with pytest.raises(DataError, match="not reproduced"):
        Head(weight + 1.0, bias).check_outputs(outputs)
    with pytest.raises(DataError, match="C=3 classes but the head has C=2"):
        Head(weight[:2], bias[:2]).check_outputs(outputs)
    with pytest.raises(DataError, match="bias must have shape"):
        Head(weight, bias[:2])
