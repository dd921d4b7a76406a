"""Plugins: entry points and --plugin modules register detectors beside the built-ins, with their origin;
broken or clashing plugins are reported by name and leave the built-ins working."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from oodbench.core.errors import DetectorError
from oodbench.detectors import (
    available,
    create,
    detector_fingerprint,
    get_class,
    load_plugins,
    origin,
    plugin_failures,
    plugin_versions,
    registry,
    save,
)

BUILTINS = list(registry._REGISTRY)

DETECTOR_SOURCE = '''
import numpy as np
from oodbench.detectors import Detector, Paper, Requirements


class {cls}(Detector):
    """Minus the feature norm."""

    requires = Requirements.of(score=("features",))
    paper = Paper("Someone, A norm", "Nowhere 2026", "https://example.org/norm")

    def __init__(self, power: float = 1.0) -> None:
        self.power = power

    def _validate_params(self) -> None:
        self._check_positive(power=self.power)

    def _score_chunk(self, chunk):
        return -np.linalg.norm(np.asarray(chunk.features, dtype=np.float64), axis=1) ** self.power
'''


@pytest.fixture
def clean_registry():
    """Restore the registry, its plugin bookkeeping, sys.path and the plugin modules after the test."""
    saved = registry._snapshot()
    path, modules = list(sys.path), set(sys.modules)
    registry._entry_points_state = "not loaded"
    registry._package_distributions.cache_clear()
    yield
    registry._restore(saved)
    sys.path[:] = path
    # Only the test's own plugin modules: dropping a C extension imported meanwhile (faiss) would crash its reimport.
    plugin_roots = ("normplug", "brokenplug", "clashplug", "otherplug", "exitplug", "oodbench_plugin_")
    for name in set(sys.modules) - modules:
        if name.startswith(plugin_roots):
            del sys.modules[name]
    importlib.invalidate_caches()


def install_fake(site: Path, dist: str, version: str, package: str, files: dict[str, str], entry_points: str) -> None:
    """A distribution as pip leaves it: the package's files plus a .dist-info with METADATA and entry points."""
    for relative, text in files.items():
        target = site / package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    (info / "top_level.txt").write_text(package + "\n")


@pytest.fixture
def site(tmp_path, clean_registry):
    site = tmp_path / "site"
    site.mkdir()
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return site


def test_an_entry_point_plugin_appears_after_the_builtins_with_its_origin(site, problem):
    install_fake(
        site,
        "oodbench-norm",
        "1.2.3",
        "normplug",
        {"__init__.py": "", "detector.py": DETECTOR_SOURCE.format(cls="Norm")},
        "[oodbench.detectors]\nneg_norm = normplug.detector:Norm\n",
    )
    assert available() == [*BUILTINS, "neg_norm"]
    assert origin("neg_norm").describe() == "oodbench-norm 1.2.3" and not origin("neg_norm").builtin
    assert origin("msp").describe() == "built-in"
    assert plugin_versions() == {"neg_norm": "oodbench-norm 1.2.3"}
    # Cache keys of plugins carry the distribution, its version and the module's source hash; built-ins none.
    fingerprint = detector_fingerprint("neg_norm")
    assert fingerprint.startswith("oodbench-norm==1.2.3+") and len(fingerprint.split("+")[1]) == 12
    assert detector_fingerprint("msp") is None
    detector = create("neg_norm", power=2.0).fit(problem.fit)
    expected = -(np.linalg.norm(np.asarray(problem.test.features, dtype=np.float64), axis=1) ** 2)
    np.testing.assert_allclose(detector.score(problem.test), expected, rtol=1e-12)
    assert plugin_failures() == {}


def test_a_plugin_that_fails_to_import_is_reported_and_the_builtins_still_work(site):
    install_fake(
        site,
        "oodbench-broken",
        "0.1",
        "brokenplug",
        {"__init__.py": "raise ImportError('brokenplug needs torch 9')\n"},
        "[oodbench.detectors]\nbroken = brokenplug:Broken\n",
    )
    assert available() == BUILTINS
    assert plugin_failures() == {"broken = brokenplug:Broken": "ImportError: brokenplug needs torch 9"}
    with pytest.raises(DetectorError, match="plugin broken = brokenplug:Broken failed to load: ImportError"):
        get_class("broken")
    assert create("energy").name == "energy"


def test_a_plugin_that_exits_or_is_interrupted_while_importing_is_a_failed_plugin(site):
    install_fake(
        site,
        "oodbench-exit",
        "0.1",
        "exitplug",
        {"__init__.py": "", "quits.py": "import sys\nsys.exit(0)\n", "stops.py": "raise KeyboardInterrupt\n"},
        "[oodbench.detectors]\nquits = exitplug.quits:Q\nstops = exitplug.stops:S\n",
    )
    assert available() == BUILTINS  # the command goes on: no exit, no interrupt
    failures = plugin_failures()
    assert failures["quits = exitplug.quits:Q"] == "SystemExit: it called sys.exit(0) while being imported"
    assert failures["stops = exitplug.stops:S"].startswith("KeyboardInterrupt")


def test_a_plugin_file_calling_sys_exit_fails_evaluate_with_one_line(tmp_path, clean_registry):
    from oodbench.cli.main import app

    plugin = tmp_path / "exits.py"
    plugin.write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(DetectorError, match=r"plugin .*exits.py failed to import: SystemExit: it called sys.exit\(0\)"):
        load_plugins([str(plugin)])
    store = tmp_path / "store"
    store.mkdir()
    args = ["evaluate", "--store", str(store), "--model", "m", "--fit", "f", "--id", "i", "--ood", "o"]
    result = CliRunner().invoke(app, [*args, "--plugin", str(plugin), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "SystemExit" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_saved_plugin_detector_loads_only_when_its_plugin_is_installed_or_named(tmp_path, clean_registry, problem):
    from oodbench.detectors import load

    source = (
        DETECTOR_SOURCE.format(cls="SavedNorm")
        + '\nfrom oodbench.detectors import register\nregister("saved_norm")(SavedNorm)\n'
    )
    plugin = tmp_path / "saved_norm.py"
    plugin.write_text(source)
    before = registry._snapshot()
    load_plugins([str(plugin)])
    saved = save(create("saved_norm", power=2.0).fit(problem.fit), tmp_path / "kept")
    expected = create("saved_norm", power=2.0).fit(problem.fit).score(problem.test)
    registry._restore(before)  # as a fresh process would start: the plugin is neither installed nor named
    for module in [m for m in sys.modules if m.startswith("oodbench_plugin_") and m.endswith("_saved_norm")]:
        del sys.modules[module]
    with pytest.raises(DetectorError, match="detector 'saved_norm' .*is not registered .*name it with --plugin"):
        load(saved)
    assert load(saved, plugins=[str(plugin)]).score(problem.test).tobytes() == expected.tobytes()


def test_two_detectors_under_one_name_is_an_error_naming_both_origins(site):
    install_fake(
        site,
        "oodbench-clash",
        "0.5",
        "clashplug",
        {"__init__.py": "", "detector.py": DETECTOR_SOURCE.format(cls="Energy")},
        "[oodbench.detectors]\nenergy = clashplug.detector:Energy\n",
    )
    install_fake(
        site,
        "oodbench-norm",
        "1.0",
        "normplug",
        {"__init__.py": "", "detector.py": DETECTOR_SOURCE.format(cls="Norm")},
        "[oodbench.detectors]\nzz_norm = normplug.detector:Norm\n",
    )
    install_fake(
        site,
        "oodbench-other",
        "2.0",
        "otherplug",
        {"__init__.py": "", "detector.py": DETECTOR_SOURCE.format(cls="OtherNorm")},
        "[oodbench.detectors]\nzz_norm = otherplug.detector:OtherNorm\n",
    )
    failures = plugin_failures()
    clash = failures["energy = clashplug.detector:Energy"]
    assert (
        "oodbench.detectors.logit.Energy (built-in)" in clash
        and "clashplug.detector.Energy (oodbench-clash 0.5)" in clash
    )
    other = failures["zz_norm = otherplug.detector:OtherNorm"]
    assert (
        "normplug.detector.Norm (oodbench-norm 1.0)" in other
        and "otherplug.detector.OtherNorm (oodbench-other 2.0)" in other
    )
    assert get_class("energy").__module__ == "oodbench.detectors.logit"
    assert get_class("zz_norm").__module__ == "normplug.detector"


def test_plugin_modules_and_files_by_name(tmp_path, clean_registry):
    source = (
        DETECTOR_SOURCE.format(cls="FileNorm")
        + '\nfrom oodbench.detectors import register\nregister("file_norm")(FileNorm)\n'
    )
    (tmp_path / "my_norm.py").write_text(source)
    assert load_plugins([str(tmp_path / "my_norm.py")]) == {str(tmp_path / "my_norm.py"): ["file_norm"]}
    assert origin("file_norm").describe() == f"file {tmp_path / 'my_norm.py'} (not installed)"
    assert load_plugins([str(tmp_path / "my_norm.py")]) == {str(tmp_path / "my_norm.py"): ["file_norm"]}  # once
    with pytest.raises(DetectorError, match="plugin no_such_plugin_module failed to import: ModuleNotFoundError"):
        load_plugins(["no_such_plugin_module"])
    with pytest.raises(DetectorError, match="plugin file .*missing.py does not exist"):
        load_plugins([str(tmp_path / "missing.py")])
    # A module that registers one detector, then fails, registers nothing.
    half = DETECTOR_SOURCE.format(cls="Half") + '\nfrom oodbench.detectors import register\nregister("half")(Half)\n'
    (tmp_path / "half.py").write_text(half + "raise RuntimeError('second detector is broken')\n")
    with pytest.raises(DetectorError, match="RuntimeError: second detector is broken"):
        load_plugins([str(tmp_path / "half.py")])
    assert "half" not in available()


def test_register_refuses_non_detectors_and_bad_names(clean_registry):
    with pytest.raises(DetectorError, match="not a subclass"):
        registry.register("x")(int)
    for bad in (" x", "a/b", "..", ""):
        with pytest.raises(DetectorError, match="detector name: .* is not a valid name"):
            registry.register(bad)(get_class("msp"))


def test_the_detectors_command_lists_plugins_and_failures(site, tmp_path):
    install_fake(
        site,
        "oodbench-broken",
        "0.1",
        "brokenplug",
        {"__init__.py": "raise ImportError('brokenplug needs torch 9')\n"},
        "[oodbench.detectors]\nbroken = brokenplug:Broken\n",
    )
    (tmp_path / "cli_norm.py").write_text(
        DETECTOR_SOURCE.format(cls="CliNorm")
        + '\nfrom oodbench.detectors import register\nregister("cli_norm")(CliNorm)\n'
    )
    from oodbench.cli.main import app

    result = CliRunner().invoke(app, ["detectors", "--plugin", str(tmp_path / "cli_norm.py")])
    assert result.exit_code == 0, result.output
    assert "cli_norm" in result.output and "msp" in result.output
    assert origin("cli_norm").describe() == f"file {tmp_path / 'cli_norm.py'} (not installed)"
    assert "broken = brokenplug:Broken: ImportError: brokenplug needs torch 9" in result.output.replace("\n", " ")
    failed = CliRunner().invoke(app, ["detectors", "--plugin", "no_such_plugin_module"])
    assert failed.exit_code == 2 and "plugin no_such_plugin_module failed to import" in failed.output
