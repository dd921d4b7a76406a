"""The detector tables are one source: generated from the classes into the README and docs/detectors.md, every row
with the header's cell count; built-in detector modules are found without an import line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oodbench import detectors
from oodbench.detectors import Detector, Requirements, available, catalog, get_class
from oodbench.detectors.catalog import BEGIN, COLUMNS, END, markdown_table, replace_table, row, split_cells

ROOT = Path(__file__).resolve().parents[2]
FILES = (ROOT / "README.md", ROOT / "docs" / "detectors.md")


def _tables(text: str) -> list[list[str]]:
    """Every Markdown table of a text, as its lines (header, separator, rows)."""
    tables, current = [], []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return [*tables, current] if current else tables


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_files_hold_the_generated_table(path):
    """Run `python tools/detector_tables.py` after changing a detector: the files' tables are generated."""
    text = path.read_text(encoding="utf-8")
    assert replace_table(text, markdown_table(), str(path)) == text, f"{path.name}: the detector table is stale"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_row_of_every_table_has_the_headers_cell_count(path):
    for table in _tables(path.read_text(encoding="utf-8")):
        width = len(split_cells(table[0]))
        for line in table[1:]:
            assert len(split_cells(line)) == width, f"{path.name}: {line[:80]!r} has not {width} cells"


def test_the_cell_count_check_catches_a_shifted_row():
    """The row that broke the table: an empty cell inserted before "also in"."""
    good = markdown_table(["knn"]).splitlines()
    cells = split_cells(good[2])
    broken = "| " + " | ".join([*cells[:5], "", *cells[5:]]) + " |"
    assert len(split_cells(good[0])) == len(COLUMNS) == len(cells) != len(split_cells(broken))
    assert split_cells(r"| `fdbd` | a \|b\| c | x |") == ["`fdbd`", r"a \|b\| c", "x"]


def test_rows_come_from_the_class_declarations():
    knn = dict(zip(COLUMNS, row("knn"), strict=True))
    assert knn["defaults (source)"].startswith('k=1000, index="flat", nlist=None, nprobe=32, seed=0, exact=True — ')
    assert knn["defaults (source)"].count("nlist") == 2  # the value, and where its default comes from: one place
    assert knn["needs"] == "fit: features; score: features" and knn["also in"] == "pytorch-ood, OpenOOD"
    assert get_class("knn").paper.url in knn["paper"]
    # OpenOOD's ash is ASH-B at percentile 90: the table ties it to ash_b, not ash_s.
    assert "OpenOOD" not in dict(zip(COLUMNS, row("ash_s"), strict=True))["also in"]
    assert "percentile=90" in dict(zip(COLUMNS, row("ash_b"), strict=True))["measured agreement"]
    assert "(C − 1)" in dict(zip(COLUMNS, row("fdbd"), strict=True))["measured agreement"]
    for name in available():
        if get_class(name).__module__.startswith("oodbench."):
            assert get_class(name).summary is not None, f"{name} has no summary for the tables"


def test_a_class_without_a_summary_gets_its_docstring(monkeypatch):
    class Plain(Detector):
        """Minus the feature norm."""

        requires = Requirements.of(score=("features",))

    monkeypatch.setattr(catalog, "get_class", lambda name: Plain)
    cells = row("plain")
    assert cells[:2] == ("`plain`", "Minus the feature norm.") and cells[2] == "—" and cells[3] == "score: features"


def test_replace_table_needs_one_pair_of_markers():
    assert replace_table(f"a\n{BEGIN}\nold\n{END}\nb", "T\n") == f"a\n{BEGIN}\n\nT\n\n{END}\nb"
    with pytest.raises(ValueError, match="once"):
        replace_table("no markers", "T\n")


def test_built_in_detector_modules_are_discovered_by_their_register_line(tmp_path):
    """A new module that registers a detector is found in the package folder, after the documented ones."""
    for name, text in {
        "logit": '@register("msp")\n',
        "zeta": 'import x\n\n@register("zeta")\nclass Z: ...\n',
        "alpha": '@register("alpha")\n',
        "helpers": "def register(name): ...\n",  # defines register, registers nothing
        "_private": '@register("hidden")\n',
    }.items():
        (tmp_path / f"{name}.py").write_text(text)
    assert detectors._detector_modules(tmp_path) == ["logit", "alpha", "zeta"]
    assert detectors._detector_modules() == list(detectors._DOCUMENTED_ORDER)


def test_importing_the_detectors_imports_no_command_line_code():
    """Discovery imports the detector modules only (the CLI's start-up stays light)."""
    code = "import sys, oodbench.detectors; print(sorted(m for m in sys.modules if m.startswith(('typer', 'oodbench.detectors.cli', 'oodbench.detectors.testing'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT / "src")
    assert out.stdout.strip() == "[]"
