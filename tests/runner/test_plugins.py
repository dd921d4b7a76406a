"""`plugins = [...]` in the experiment file: the runner imports them before checking detector names, and the fit
units' cache keys carry the plugin's version and source (a changed plugin recomputes its scores)."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from oodbench.core.errors import ConfigError
from oodbench.core.store import Store
from oodbench.detectors import registry
from oodbench.runner.config import load_config
from oodbench.runner.plan import build_plan

from .helpers import CONFIGS, FAST_DEMO

PLUGIN = """
import numpy as np
from oodbench.detectors import Detector, Paper, Requirements, register


@register("neg_norm")
class NegNorm(Detector):
    requires = Requirements.of(score=("features",))
    paper = Paper("Someone, A norm", "Nowhere 2026", "https://example.org/norm")

    def _score_chunk(self, chunk):
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64), axis=1){suffix}
"""


@pytest.fixture
def experiment(tmp_path):
    """The demo experiment with a detector plugin file next to it, named relative to the file."""
    saved, modules = registry._snapshot(), set(sys.modules)
    (tmp_path / "norm_plugin.py").write_text(PLUGIN.format(suffix=""))
    text = (CONFIGS / "demo.toml").read_text(encoding="utf-8")
    (tmp_path / "exp.toml").write_text('plugins = ["norm_plugin.py"]\n' + text)
    yield tmp_path
    registry._restore(saved)
    # Forget the plugin modules only (those loaded from this test's folder): a second copy of any other module (e.g.
    # report.table_model) would make its classes fail isinstance checks against the first, and numpy refuses one.
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def load(path, *extra):
    return load_config(path / "exp.toml", overrides=(*FAST_DEMO, *extra), workdir=path / "w")


def test_the_file_names_its_plugins_and_their_detectors_are_usable(experiment):
    config = load(experiment)
    assert config.plugins == (str((experiment / "norm_plugin.py").resolve()),)
    # include = "all" takes the plugin's detector too, after the built-ins.
    assert list(config.detectors)[-1] == "neg_norm" and "msp" in config.detectors


def test_a_plugin_that_fails_is_an_error_naming_the_key(experiment):
    (experiment / "norm_plugin.py").write_text("raise ImportError('needs torch 9')\n")
    with pytest.raises(ConfigError, match=r"plugins\[0\]: plugin .*norm_plugin.py failed to import: ImportError"):
        load(experiment)


def test_fit_keys_of_a_plugin_follow_its_source_and_builtin_keys_do_not(experiment):
    def fit_keys():
        config = load(experiment)
        return {u.detector: u.key for u in build_plan(config).units if u.stage == "fit"}

    before = fit_keys()
    # A new version of the plugin's code (same name, same parameters), as a fresh process would see it.
    (experiment / "norm_plugin.py").write_text(PLUGIN.format(suffix=" * 2.0"))
    registry._ORIGINS.pop("neg_norm", None)
    after = fit_keys()
    assert after["msp"] == before["msp"]
    assert after["neg_norm"] != before["neg_norm"]


@pytest.mark.slow
def test_detectors_save_keeps_the_fitted_detectors_and_a_rerun_adds_missing_ones(experiment):
    from oodbench.detectors import load as load_detector
    from oodbench.detectors import read_meta
    from oodbench.runner.executor import run_experiment

    fast = ('detectors.include=["energy","neg_norm"]', "detectors.params={}", "detectors.save=true")
    config = load(experiment, *fast)
    run_experiment(config, progress=False)
    kept = experiment / "w" / "detectors" / "digits-cnn"
    meta = read_meta(kept / "neg_norm")
    assert meta["provenance"]["fit_dataset"] == "digits-fit" and meta["provenance"]["model_id"] == "digits-cnn"
    assert meta["origin"]["path"] == str((experiment / "norm_plugin.py").resolve())
    scores = np.load(experiment / "w" / "units" / "scores" / "digits-cnn" / "energy" / "noise.npy")
    store = Store(experiment / "w" / "store")
    assert load_detector(kept / "energy").score(store.read("digits-cnn", "noise")).tobytes() == scores.tobytes()
    # Scores cached but a kept detector deleted: the plan refits that detector only.
    shutil.rmtree(kept / "energy")
    stale = {u.label for u in build_plan(load(experiment, *fast)).units if u.status == "stale"}
    assert stale and all(label.startswith("digits-cnn/energy/") for label in stale)
