"""Mutants as a gate: each plausible bug of the evaluation engine is planted and must be caught.

The catalogue (`MUTANTS`) plants, by monkeypatching, the bugs an evaluation can have without crashing: a sign flip
of the scores or of the metric, ID and OOD swapped, a detector fitted on a test set (the engine's fit, the shared
fit statistics, the runner's fit units with and without shared statistics), a cache key that ignores parameters or
defaults, a rerun that keeps stale scores, a dropped OOD set, a wrong convention. Each mutant names the checks
(`CHECKS`) that must fail under it; every check passes on the real code. The checks compare numbers with
independent closed-form references on a toy store, so the whole catalogue runs in seconds.

The slow test at the end plants the constant-score mutant (`tests/fakes/constant_scores.py`: every detector scores
every row 0.0) under the end-to-end tests: an end-to-end test that still passed under it could not catch a
detector, a metric or a table that reports wrong numbers.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import oodbench as ob
from oodbench import Head, Outputs, Store
from oodbench.core.results import read_rows
from oodbench.core.scores import load_scores
from oodbench.evaluation import engine
from oodbench.evaluation import evaluate as evaluate_module
from oodbench.evaluation.evaluate import evaluate_store
from oodbench.evaluation.spec import EvaluationSpec

from . import reference

ROOT = Path(__file__).resolve().parents[1]
PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}
# Dataset names of the toy store: those of the demo experiment, so that the runner's units read it as they are.
FIT, ID, OODS = "digits-fit", "digits-id-test", ("digits-6to9", "lfw-faces", "noise")
MODEL = "digits-cnn"
# Independent float64 references against oodbench's float64 paths: relative error of a few hundred roundings of a
# well-conditioned 5 x 5 problem (condition number below 100 here) is below 1e-11; 1e-9 leaves room.
RTOL = 1e-9
# knn searches with faiss in float32 on unit vectors: cos within D * 2^-24 (D = 5), so the distance
# sqrt(2 - 2 cos) within 1e-6 / d; the toy's nearest fit rows are at d > 0.01 (checked below), hence 1e-4.
KNN_ATOL = 1e-4


# ----------------------------------------------------------------------------------------------- the toy store
def toy_store(root: Path, seed: int = 0) -> Store:
    """Fit and ID test sets from one distribution (3 classes, D = 5), three OOD sets shifted away, and a head."""
    rng = np.random.default_rng(seed)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    centres = rng.normal(scale=3.0, size=(3, 5))
    store = Store(root)

    def outputs(n: int, shift: float) -> Outputs:
        labels = rng.integers(0, 3, n)
        z = (centres[labels] + rng.normal(size=(n, 5)) + shift).astype(np.float32)
        return Outputs(z, (z @ weight.T + bias).astype(np.float32), labels)

    sizes = [(FIT, 240, 0.0), (ID, 120, 0.0), (OODS[0], 90, 2.5), (OODS[1], 70, -3.0), (OODS[2], 60, 5.0)]
    for name, n, shift in sizes:
        store.write_outputs(MODEL, name, outputs(n, shift), provenance=PROV)
    store.write_head(MODEL, Head(weight, bias), provenance=PROV)
    return store


def knn1(fit: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Negative distance to the nearest l2-normalised fit row (knn with k = 1), in float64."""
    a = fit / np.linalg.norm(fit, axis=1, keepdims=True)
    b = test / np.linalg.norm(test, axis=1, keepdims=True)
    distances = np.sqrt(np.maximum(((b[:, None, :] - a[None, :, :]) ** 2).sum(-1), 0.0))
    assert distances.min() > 0.01  # the bound of KNN_ATOL holds on this data
    return -distances.min(axis=1)


def maha(fit: Outputs, test: np.ndarray) -> np.ndarray:
    """Negative squared Mahalanobis distance to the closest class mean, shared (maximum-likelihood) covariance."""
    z, y = np.asarray(fit.features, np.float64), np.asarray(fit.labels)
    classes = np.unique(y)
    means = np.stack([z[y == c].mean(0) for c in classes])
    centred = z - means[np.searchsorted(classes, y)]
    precision = np.linalg.inv(centred.T @ centred / len(z))
    diff = np.asarray(test, np.float64)[:, None, :] - means[None]
    return -np.einsum("ncd,de,nce->nc", diff, precision, diff).min(axis=1)


def energy(logits: np.ndarray, temperature: float) -> np.ndarray:
    """T * logsumexp(logits / T), in float64."""
    x = np.asarray(logits, np.float64) / temperature
    top = x.max(axis=1, keepdims=True)
    return temperature * (top[:, 0] + np.log(np.exp(x - top).sum(axis=1)))


def openood_fpr95(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    """OpenOOD's FPR@95: OOD positive (higher score = more ID), the share of ID flagged when 95 % of OOD are."""
    flagged = np.sort(-ood_scores)[::-1]
    threshold = flagged[math.ceil(0.95 * len(flagged)) - 1]
    return float(np.mean(-id_scores >= threshold))


# ----------------------------------------------------------------------------------------------- the checks
def check_engine_numbers(tmp: Path) -> None:
    """evaluate_store's scores are the detectors' definitions fitted on the fit set; its rows are the metrics of
    those scores for every OOD set; its table has every OOD set."""
    store = toy_store(tmp / "store")
    out = tmp / "run"
    plan = {"msp": {}, "energy": {}, "knn": {"k": 1}, "maha": {}}
    result = evaluate_store(store, MODEL, FIT, ID, list(OODS), plan, out_dir=out, progress=False)
    assert result.failed == {} and result.skipped == {}
    fit = store.read(MODEL, FIT)
    for dataset in (ID, *OODS):
        saved, outputs = load_scores(out, MODEL, dataset), store.read(MODEL, dataset)
        np.testing.assert_allclose(saved["msp"], reference.msp(outputs.logits), rtol=reference.SCORE_RTOL)
        np.testing.assert_allclose(saved["energy"], reference.energy(outputs.logits), rtol=reference.SCORE_RTOL)
        np.testing.assert_allclose(saved["knn"], knn1(fit.features, outputs.features), atol=KNN_ATOL, rtol=0)
        np.testing.assert_allclose(saved["maha"], maha(fit, outputs.features), rtol=RTOL)
    rows = read_rows(out / "results.parquet")
    id_scores = load_scores(out, MODEL, ID)
    assert {(r.detector, r.ood_dataset) for r in rows} == {(d, o) for d in plan for o in OODS}
    for row in rows:
        if row.metric == "auroc":
            ood = load_scores(out, MODEL, row.ood_dataset)[row.detector]
            assert row.value == pytest.approx(reference.auroc(id_scores[row.detector], ood), abs=reference.AUROC_ABS)
    header = (out / "table.md").read_text().splitlines()[0]
    assert all(name in header for name in OODS)


def check_openood_convention(tmp: Path) -> None:
    """With convention openood the rows hold OpenOOD's FPR@95 (OOD positive) and the table says so."""
    store = toy_store(tmp / "store", seed=1)
    out = tmp / "run"
    evaluate_store(
        store, MODEL, FIT, ID, list(OODS), {"knn": {"k": 1}}, out_dir=out, progress=False, convention="openood"
    )
    rows = {(r.ood_dataset, r.metric): r.value for r in read_rows(out / "results.parquet")}
    id_scores = load_scores(out, MODEL, ID)["knn"]
    for name in OODS:
        expected = openood_fpr95(id_scores, load_scores(out, MODEL, name)["knn"])
        assert rows[(name, "openood.fpr95")] == pytest.approx(expected, abs=1e-12)
    assert "openood" in (out / "table.md").read_text()
    assert json.loads((out / "run.json").read_text())["convention"] == "openood"


def _set_default(monkeypatch: pytest.MonkeyPatch, name: str, param: str, value: object) -> None:
    """Change a detector's default as an edit of its class would (the constructor's signature)."""
    init = ob.detectors.get_class(name).__init__
    if init.__kwdefaults__ and param in init.__kwdefaults__:
        monkeypatch.setitem(init.__kwdefaults__, param, value)
        return
    names = init.__code__.co_varnames[1 : init.__code__.co_argcount]
    defaults = list(init.__defaults__)
    defaults[names.index(param) - (len(names) - len(defaults))] = value
    monkeypatch.setattr(init, "__defaults__", tuple(defaults))


def check_stale_default(tmp: Path) -> None:
    """A rerun into the same run directory after a detector's default changed recomputes, and run.json records
    the resolved parameters."""
    store = toy_store(tmp / "store")
    out = tmp / "run"
    evaluate_store(store, MODEL, FIT, ID, list(OODS), ["energy"], out_dir=out, progress=False)
    with pytest.MonkeyPatch.context() as patch:
        _set_default(patch, "energy", "temperature", 3.0)
        assert ob.detectors.create("energy").get_params()["temperature"] == 3.0
        evaluate_store(store, MODEL, FIT, ID, list(OODS), ["energy"], out_dir=out, progress=False)
    saved = load_scores(out, MODEL, ID)["energy"]
    np.testing.assert_allclose(saved, energy(store.read(MODEL, ID).logits, 3.0), rtol=reference.SCORE_RTOL)
    assert json.loads((out / "run.json").read_text())["detectors"]["energy"]["temperature"] == 3.0


def check_key_follows_parameters(tmp: Path) -> None:
    """A rerun with other parameters into the same run directory recomputes with them."""
    store = toy_store(tmp / "store")
    out = tmp / "run"
    evaluate_store(store, MODEL, FIT, ID, list(OODS), {"energy": {"temperature": 1.0}}, out_dir=out, progress=False)
    evaluate_store(store, MODEL, FIT, ID, list(OODS), {"energy": {"temperature": 2.0}}, out_dir=out, progress=False)
    saved = load_scores(out, MODEL, ID)["energy"]
    np.testing.assert_allclose(saved, energy(store.read(MODEL, ID).logits, 2.0), rtol=reference.SCORE_RTOL)


def check_runner_fit_units(tmp: Path) -> None:
    """The runner's fit units (alone, and sharing the fit statistics) fit on the fit set: the references' scores."""
    from oodbench.runner.stages import Context, run_fit_score

    sys.path.insert(0, str(ROOT / "tests" / "runner"))
    from tests.runner.helpers import demo_config

    config = demo_config(
        tmp / "work", "detectors.include=['knn','maha']", "detectors.exclude=[]", "detectors.params={knn={k=1}}"
    )
    store = toy_store(config.store)
    fit = store.read(MODEL, FIT)
    todo = [{"label": f"{MODEL}/{{d}}/{n}", "key": "k", "dataset": n} for n in (ID, *OODS)]
    for share in ([], [("knn", config.detectors["knn"]), ("maha", config.detectors["maha"])]):
        ctx = Context(config, progress=False)
        for detector, expected in (("knn", knn1), ("maha", maha)):
            items = [{**item, "label": item["label"].format(d=detector)} for item in todo]
            run_fit_score(ctx, MODEL, detector, config.detectors[detector], items, share_with=share)
            for name in (ID, *OODS):
                saved = np.load(ctx.layout.score_file(MODEL, detector, name))
                test = store.read(MODEL, name).features
                want = expected(fit.features, test) if detector == "knn" else expected(fit, test)
                tolerance = {"atol": KNN_ATOL, "rtol": 0} if detector == "knn" else {"rtol": RTOL}
                np.testing.assert_allclose(saved, want, **tolerance)


CHECKS: dict[str, Callable[[Path], None]] = {
    "engine-numbers": check_engine_numbers,
    "openood-convention": check_openood_convention,
    "stale-default": check_stale_default,
    "key-follows-parameters": check_key_follows_parameters,
    "runner-fit-units": check_runner_fit_units,
}


# ----------------------------------------------------------------------------------------------- the mutants
def _wrap(patch: pytest.MonkeyPatch, module: object, name: str, make: Callable[[Callable], Callable]) -> None:
    patch.setattr(module, name, make(getattr(module, name)))


def _score_sign_flip(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        return lambda *a, **k: {ds: -s for ds, s in original(*a, **k).items()}

    _wrap(patch, engine, "fit_and_score", make)


def _metric_sign_flip(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        def flipped(model, id_dataset, oods, detectors, scores, *rest):
            negated = {ds: {d: -v for d, v in per.items()} for ds, per in scores.items()}
            return original(model, id_dataset, oods, detectors, negated, *rest)

        return flipped

    _wrap(patch, engine, "metric_rows", make)


def _id_ood_swap(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        def swapped(model, id_dataset, oods, detectors, scores, *rest):
            rows = []
            for ood in oods:
                pair = {id_dataset: scores[ood], ood: scores[id_dataset]}
                rows += original(model, id_dataset, [ood], detectors, pair, *rest)
            return rows

        return swapped

    _wrap(patch, engine, "metric_rows", make)


def _fit_on_test(patch: pytest.MonkeyPatch) -> None:
    def mutant(detector, inputs, fit, datasets, *, stats=None, on_fitted=None):
        fitted = detector.fit(inputs.outputs(datasets[0]), inputs.head, stats=stats)
        return {ds: fitted.score(inputs.outputs(ds)) for ds in datasets}

    patch.setattr(engine, "fit_and_score", mutant)


def _statistics_on_test(patch: pytest.MonkeyPatch) -> None:
    original = engine.ModelInputs.fit_statistics

    def mutant(self, fit, detectors, gram_dtype="float64"):
        return original(self, ID, detectors, gram_dtype)  # the shared statistics of the ID test set

    patch.setattr(engine.ModelInputs, "fit_statistics", mutant)


def _runner_fit_on_test(patch: pytest.MonkeyPatch) -> None:
    from oodbench.runner.stages import Context

    original = Context.inputs

    def mutant(self, model_id):
        inputs = original(self, model_id)
        spec, real = self.config.evaluation, inputs.outputs
        inputs.outputs = lambda name: real(spec.id if name == spec.fit else name)
        return inputs

    patch.setattr(Context, "inputs", mutant)


def _key_ignores_parameters(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        return lambda inputs, datasets, name, resolved, *rest: original(inputs, datasets, name, {}, *rest)

    _wrap(patch, evaluate_module, "score_key", make)


def _key_ignores_defaults(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        def as_given(inputs, datasets, name, resolved, *rest):
            # read the constructor as it stands now: default_params() caches per constructor, and the check edits
            # a default in-process (a real edit changes the code between processes)
            init = ob.detectors.get_class(name).__init__
            defaults = {k: p.default for k, p in inspect.signature(init).parameters.items() if k != "self"}
            given = {k: v for k, v in resolved.items() if defaults.get(k) != v}  # the parameters as written
            return original(inputs, datasets, name, given, *rest)

        return as_given

    _wrap(patch, evaluate_module, "score_key", make)


def _stale_rerun(patch: pytest.MonkeyPatch) -> None:
    from oodbench.core.rundir import RunDir

    original = RunDir.resume

    def keep_everything(self, model, datasets, keys):
        recorded = self.read_info().get("score_keys", {})
        return original(self, model, datasets, {d: recorded.get(d, k) for d, k in keys.items()})

    patch.setattr(RunDir, "resume", keep_everything)


def _dropped_ood(patch: pytest.MonkeyPatch) -> None:
    def make(original: Callable) -> Callable:
        return lambda model, spec, ran, scores: original(model, replace(spec, ood=spec.ood[:-1]), ran, scores)

    _wrap(patch, engine, "result_tables", make)
    _wrap(patch, evaluate_module, "result_tables", make)


def _wrong_convention(patch: pytest.MonkeyPatch) -> None:
    # The table's convention is recorded but the rows are computed in oodbench's and renamed.
    def make(original: Callable) -> Callable:
        def renamed(model, id_dataset, oods, detectors, scores, tpr, conventions=("oodbench",)):
            rows = original(model, id_dataset, oods, detectors, scores, tpr, ["oodbench"])
            extra = [c for c in conventions if c != "oodbench"]
            return rows + [replace(r, metric=f"{c}.{r.metric}") for c in extra for r in rows]

        return renamed

    _wrap(patch, engine, "metric_rows", make)


def _convention_ignored(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(EvaluationSpec, "conventions", property(lambda self: ["oodbench"]))


# mutant -> (how it is planted, the checks that must fail under it)
MUTANTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], tuple[str, ...]]] = {
    "score-sign-flip": (_score_sign_flip, ("engine-numbers", "runner-fit-units")),
    "metric-sign-flip": (_metric_sign_flip, ("engine-numbers",)),
    "id-ood-swap": (_id_ood_swap, ("engine-numbers",)),
    "fit-on-test-set": (_fit_on_test, ("engine-numbers", "runner-fit-units")),
    "shared-statistics-of-test-set": (_statistics_on_test, ("engine-numbers", "runner-fit-units")),
    "runner-fit-on-test-set": (_runner_fit_on_test, ("runner-fit-units",)),
    "key-ignores-parameters": (_key_ignores_parameters, ("key-follows-parameters", "stale-default")),
    "key-ignores-defaults": (_key_ignores_defaults, ("stale-default",)),
    "stale-scores-kept-on-rerun": (_stale_rerun, ("stale-default", "key-follows-parameters")),
    "dropped-ood-set": (_dropped_ood, ("engine-numbers",)),
    "wrong-convention": (_wrong_convention, ("openood-convention",)),
    "convention-ignored": (_convention_ignored, ("openood-convention",)),
}


@contextlib.contextmanager
def planted(mutant: str) -> Iterator[None]:
    """The code with `mutant` planted (undone on the way out)."""
    with pytest.MonkeyPatch.context() as patch:
        MUTANTS[mutant][0](patch)
        yield


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_every_check_passes_on_the_real_code(check: str, tmp_path: Path) -> None:
    CHECKS[check](tmp_path)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_mutant_is_killed(mutant: str, tmp_path: Path) -> None:
    for number, check in enumerate(MUTANTS[mutant][1]):
        with planted(mutant), pytest.raises(Exception) as caught:  # noqa: PT011 - a wrong number or a refusal
            CHECKS[check](tmp_path / str(number))
        assert not isinstance(caught.value, (ImportError, NameError, TypeError)), caught.value  # not a broken plant


# The small end-to-end runs: extraction into a store then the detectors, the `evaluate` CLI on extracted entries,
# `oodbench.evaluate_model` (first and cached call), the `evaluate-model` CLI, `evaluate_store` with its run directory
# and the `evaluate` CLI on a toy store (both conventions), and `oodbench run` on the demo experiment.
END_TO_END = [
    "tests/extract/test_pipeline.py::test_entries_feed_detectors_and_metrics",
    "tests/extract/test_pipeline.py::test_oodbench_evaluate_consumes_extracted_entries",
    "tests/runner/test_quick.py::test_first_call_extracts_second_call_is_cached",
    "tests/runner/test_quick.py::test_temporary_store_and_module_on_torch_datasets",
    "tests/runner/test_quick.py::test_cli_evaluate_model",
    "tests/evaluation/test_evaluation.py::test_evaluate_store_writes_run_directory_and_resumes",
    "tests/evaluation/test_evaluation.py::test_cli_evaluate",
    "tests/evaluation/test_conventions.py::test_evaluate_and_report_in_the_openood_convention",
    "tests/runner/test_run_demo.py::test_first_run_does_every_stage",
]


@pytest.mark.slow
def test_every_end_to_end_test_fails_under_the_constant_score_mutant(tmp_path):
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fakes.constant_scores"]
        + [f"--junitxml={junit}", *END_TO_END],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert junit.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('file') or case.get('classname').replace('.', '/') + '.py'}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[test_id] = kinds[0] if kinds else "passed"
    # A failure (an assertion about the numbers), never an error in setup or a skip: the mutant is what they catch.
    assert outcomes == {test_id: "failure" for test_id in END_TO_END}, done.stdout[-3000:]
