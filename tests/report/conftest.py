from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from oodbench.core.results import ResultRow

from .helpers import metric_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _load_make_run():
    # The run factory lives with the analysis tests; load it by path so both folders share one definition.
    path = Path(__file__).parents[1] / "analysis" / "helpers.py"
    spec = importlib.util.spec_from_file_location("oodbench_tests_synthetic_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.make_run


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Evaluation runs of two models with the same ID and OOD sets."""
    make_run = _load_make_run()
    root = tmp_path_factory.mktemp("report-runs")
    return [make_run(root, "toy-a", seed=0), make_run(root, "toy-b", seed=1)]


@pytest.fixture()
def supervised_rows() -> list[ResultRow]:
    """Two models, two OOD sets, three detectors; a tie on FPR (resnet50/ninco) and a missing cell (vit/openimage-o knn)."""
    return (
        metric_rows("resnet50", "ninco", 5879, {"msp": (0.80, 0.78), "energy": (0.62, 0.85), "knn": (0.62, 0.88)})
        + metric_rows(
            "resnet50", "openimage-o", 17632, {"msp": (0.65, 0.84), "energy": (0.55, 0.90), "knn": (0.40, 0.91)}
        )
        + metric_rows("vit-b16", "ninco", 5879, {"msp": (0.50, 0.90), "energy": (0.58, 0.87), "knn": (0.45, 0.93)})
        + metric_rows("vit-b16", "openimage-o", 17632, {"msp": (0.30, 0.94), "energy": (0.35, 0.92)})
    )


@pytest.fixture()
def zeroshot_rows() -> list[ResultRow]:
    """CLIP models with logit-space scores, vocabulary scores (score@vocabulary) and WordNet M-sweep points.

    The sweep points of clip-b16 beat every vocabulary at its own size: Table 2 must not pick them.
    """
    ninco = {
        "mcm": (0.70, 0.80),
        "energy": (0.75, 0.78),
        "neglabel@wordnet": (0.60, 0.84),
        "neglabel@llm-siblings": (0.48, 0.88),
        "eoe@llm-siblings": (0.52, 0.87),
        "neglabel@oracle": (0.20, 0.97),
        "neglabel@wordnet[m=1000]": (0.45, 0.89),
        "neglabel@wordnet[m=10000]": (0.25, 0.95),
    }
    openimage = {
        "mcm": (0.50, 0.88),
        "energy": (0.55, 0.86),
        "neglabel@wordnet": (0.40, 0.91),
        "neglabel@llm-siblings": (0.36, 0.92),
        "eoe@llm-siblings": (0.30, 0.93),
        "neglabel@oracle": (0.10, 0.99),
        "neglabel@wordnet[m=1000]": (0.35, 0.93),
        "neglabel@wordnet[m=10000]": (0.15, 0.97),
    }
    second = {"mcm": (0.66, 0.82), "neglabel@wordnet": (0.50, 0.86), "neglabel@llm-siblings": (0.50, 0.87)}
    return (
        metric_rows("clip-b16", "ninco", 5879, ninco)
        + metric_rows("clip-b16", "openimage-o", 17632, openimage)
        + metric_rows("clip-l14", "ninco", 5879, second)
        + metric_rows("clip-l14", "openimage-o", 17632, second)
    )


@pytest.fixture(scope="session")
def paper_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Runs named like a reproduction of the Fi-ImageNet-1k paper (checkpoint tags, its dataset names), with
    accuracy.json files: ResNet50 and EVA02-L-448 on Fi-ImageNet-1k, NINCO and Textures."""
    from .helpers import write_accuracy

    make_run = _load_make_run()
    root = tmp_path_factory.mktemp("paper-runs")
    names = {"near": "fi-imagenet-1k", "far": "ninco", "noise": "textures"}
    runs = []
    for index, (model, top1) in enumerate(
        (("resnet50.a1_in1k", (0.801, 0.849)), ("eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", (0.899, 0.915)))
    ):
        run = make_run(root, model, seed=index, names=names)
        write_accuracy(run, model, {"original": (top1[0], 400), "real": (top1[1], 380)})
        runs.append(run)
    return runs


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real evaluation run directory (5 logit detectors, 3 OOD sets of 300/260/220 images), for `analyze`."""
    return _load_make_run()(tmp_path_factory.mktemp("analyze-run"))
