"""The package tree names the layers, and the paths users know keep working.

- `src/oodbench/` holds the layer packages and three modules (`__init__`, `__main__`, `_compat`);
- every dotted `oodbench.…` name the README and the docs mention resolves to a module or an attribute;
- every old module path (`oodbench.store`, …) still imports, warns, and is the very module at its new home.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import oodbench
from oodbench._compat import MOVED

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(oodbench.__file__).parent
LAYERS = {"util", "core", "text", "detectors", "zeroshot", "extract", "evaluation", "analysis", "audit", "annotate"}
LAYERS |= {"report", "demo", "runner", "cli"}
DOTTED = re.compile(r"\boodbench(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def test_the_top_level_holds_the_layer_packages_and_three_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert modules == ["__init__.py", "__main__.py", "_compat.py"]
    assert packages == LAYERS


def _resolve(name: str) -> object:
    """The object a dotted name denotes: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)  # a documented path must be a current one
                target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(name)


def _documented_names() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {m.group(0) for page in pages for m in DOTTED.finditer(page.read_text(encoding="utf-8"))}
    # `oodbench.report.figures.fig_*` names a family of functions, not one name; an old path (`_compat.MOVED`)
    # is named only to say it moved, and its own test below checks it.
    return sorted(name for name in found if not name.endswith("_") and name not in MOVED)


def test_docs_name_real_paths() -> None:
    names = _documented_names()
    assert len(names) > 50, "the docs name the public API; fewer names than this means the scan broke"
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError, DeprecationWarning) as exc:
            missing.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not missing, "\n".join(missing)


def test_public_names_of_the_package() -> None:
    import oodbench as ob

    assert ob.Store.__module__ == "oodbench.core.store" and ob.Outputs.__module__ == "oodbench.core.outputs"
    assert ob.metrics.__name__ == "oodbench.core.metrics" and ob.RunDir.__module__ == "oodbench.core.rundir"
    assert ob.detectors.__name__ == "oodbench.detectors" and callable(ob.evaluate_model)
    assert ob.Head.__module__ == "oodbench.core.outputs"


def test_every_old_path_is_the_new_module_and_warns() -> None:
    code = (
        "import importlib, json, sys, warnings\n"
        "warnings.simplefilter('always')\n"
        "moved = json.loads(sys.argv[1])\n"
        "for old, new in moved.items():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        module = importlib.import_module(old)\n"
        "    target = importlib.import_module(new)\n"
        "    assert module is target and sys.modules[old] is target, (old, module, target)\n"
        "    assert target.__spec__.name == new, (old, target.__spec__.name)\n"
        "    messages = [str(w.message) for w in seen if w.category is DeprecationWarning]\n"
        "    assert any(new in m for m in messages), (old, messages)\n"
    )
    # A fresh interpreter: in this one an old name may already be imported, and would not warn again.
    done = subprocess.run([sys.executable, "-c", code, json.dumps(MOVED)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_old_from_imports_keep_working() -> None:
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n"
        "    from oodbench.store import Store\n"
        "except DeprecationWarning as w:\n"
        "    assert 'oodbench.core.store' in str(w)\n"
        "else:\n"
        "    raise SystemExit('no warning')\n"
        "warnings.simplefilter('ignore')\n"
        "from oodbench.store import Store\n"
        "from oodbench.core.store import Store as New\n"
        "from oodbench import testing\n"
        "assert Store is New and testing.check_detector.__module__ == 'oodbench.detectors.testing'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "oodbench", "store", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "verify" in done.stdout, done.stderr


LIMIT = 80  # lines, def line to last line: a function a reader can hold whole
ORCHESTRATION = ("report/*.py", "runner/*.py", "annotate/web.py")


def long_functions(paths: list[Path], root: Path) -> list[str]:
    """`file:line name (n lines)` for each function or method in `paths` longer than `LIMIT` lines."""
    import ast

    long = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > LIMIT:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return long


def test_no_orchestration_function_exceeds_the_limit() -> None:
    paths = [path for pattern in ORCHESTRATION for path in sorted(PACKAGE.glob(pattern))]
    assert len(paths) > 30
    assert not long_functions(paths, PACKAGE)


def test_the_length_check_finds_a_long_method(tmp_path: Path) -> None:
    body = lambda n: "\n".join(f"        x{i} = {i}" for i in range(n - 1))  # noqa: E731
    source = f"class A:\n    def ok(self):\n{body(LIMIT)}\n\n    async def long(self):\n{body(LIMIT + 1)}\n"
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    assert long_functions([tmp_path / "m.py"], tmp_path) == [f"m.py:{LIMIT + 3} long ({LIMIT + 1} lines)"]
