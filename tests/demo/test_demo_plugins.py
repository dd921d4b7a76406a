"""`oodbench demo` with a plugin installed: the table stays the built-in set, and a line under it names the plugin
with the command that evaluates it on the demo's store (before: the plugin silently joined the table)."""

from __future__ import annotations

import shlex

import numpy as np

from oodbench import Outputs, Store
from oodbench.cli.main import main
from oodbench.core.results import read_rows
from oodbench.demo import DEMO_EXCLUDED, FIT, ID_TEST, MODEL_ID, OOD_SETS, DemoSetup, demo_detector_params
from oodbench.demo.run import plugin_note
from oodbench.detectors import available, registry

from ..detectors.test_plugins import DETECTOR_SOURCE, clean_registry, install_fake, site  # noqa: F401 - fixtures

BUILTINS = [name for name in registry._REGISTRY if name not in DEMO_EXCLUDED]


def test_an_installed_plugin_is_named_under_the_demo_table_not_in_it(site, tmp_path, capsys):  # noqa: F811
    assert plugin_note(DemoSetup(root=tmp_path, store=Store(tmp_path / "store"))) is None
    install_fake(
        site,
        "oodbench-norm",
        "1.2.3",
        "normplug",
        {"__init__.py": "", "detector.py": DETECTOR_SOURCE.format(cls="Norm")},
        "[oodbench.detectors]\nneg_norm = normplug.detector:Norm\n",
    )
    registry._entry_points_state = "not loaded"  # installed after the first look: read the entry points again
    assert "neg_norm" in available()
    assert list(demo_detector_params(650, 64, 6)) == BUILTINS  # the README's table, whatever is installed

    # The line's command evaluates the plugin on a store laid out as the demo's (tiny real arrays).
    rng = np.random.default_rng(0)
    store = Store(tmp_path / "demo" / "store")
    for name in (FIT, ID_TEST, *OOD_SETS):
        z = rng.normal(size=(12, 4)).astype(np.float32)
        store.write_outputs(MODEL_ID, name, Outputs(z, z[:, :3], rng.integers(0, 3, 12)), provenance={"model": "m"})
    note = plugin_note(DemoSetup(root=tmp_path / "demo", store=store))
    assert note.startswith("not in this table (the built-in set): installed plugin detector neg_norm; ")
    command = shlex.split(note.split("evaluate on the demo's store: ", 1)[1])
    assert command[0] == "oodbench"
    try:
        main([*command[1:], "--no-progress"])
    except SystemExit as exit_info:
        assert exit_info.code == 0, capsys.readouterr().err
    rows = read_rows(tmp_path / "demo" / "plugins" / "results.parquet")
    assert {r.detector for r in rows} == {"neg_norm"} and {r.ood_dataset for r in rows} == set(OOD_SETS)
