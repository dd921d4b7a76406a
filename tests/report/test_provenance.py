"""The typed provenance record: what run.json records, and the one way an unrecorded value is shown."""

from __future__ import annotations

from pathlib import Path

from oodbench.analysis.rundata import RunData
from oodbench.core.tabular import render_markdown
from oodbench.report.provenance import MISSING, RunProvenance, provenance_tables


def _run(info: dict) -> RunData:
    return RunData(Path("/runs/r1"), info, [])


def _items(info: dict) -> dict[str, str]:
    table = provenance_tables(_run(info))[0]
    return {row[0].text: row[1].text for row in table.rows}


def test_unrecorded_values_show_as_missing_and_recorded_falsy_ones_as_themselves() -> None:
    items = _items({"model": "m", "store": None, "fit_dataset": "", "complete": False, "ood_datasets": []})
    assert items["store"] == items["fit set"] == items["ID test set"] == items["OOD sets"] == MISSING
    assert items["head"] == items["detectors"] == MISSING
    assert items["complete"] == "False"  # recorded: an unfinished run, not an unknown one
    assert items["kind"] == "supervised" and items["run directory"] == str(Path("/runs/r1"))


def test_entries_rows_and_the_union_of_library_versions() -> None:
    info = {
        "model": "m",
        "head": {"provenance": {"checkpoint": "c1"}, "versions": {"torch": "2.1"}},
        "entries": {
            "near": {"num_rows": 0, "item_hash": "", "versions": {"torch": "2.2", "numpy": "1.26"}},
            "far": None,
        },
        "detectors": {"msp": {}, "energy": {"temperature": 2}},
        "skipped_detectors": {"knn": "no features"},
    }
    record = RunProvenance.from_run(_run(info))
    assert record.library_versions() == {"numpy": ["1.26"], "torch": ["2.1", "2.2"]}
    assert record.detector_text() == "msp, energy(temperature=2)"
    run_table, entries, versions = provenance_tables(_run(info))
    assert {r[0].text: r[1].text for r in run_table.rows}["skipped knn"] == "no features"
    # 0 rows is a recorded count; an empty hash and an entry without metadata are not recorded.
    assert [[c.text for c in row] for row in entries.rows] == [
        ["near", "0", MISSING, MISSING, MISSING, MISSING, MISSING],
        ["far", MISSING, MISSING, MISSING, MISSING, MISSING, MISSING],
    ]
    assert "| torch | 2.1, 2.2 |" in render_markdown(versions)


def test_settings_compare_runs_field_by_field() -> None:
    record = RunProvenance.from_run(
        _run({"detectors": {"knn": {"k": 5, "a": 1}}, "head": {"provenance": {"z": 1, "b": 2}}})
    )
    assert record.settings() == {"knn": "a=1, k=5", "fit set": "", "head": "b: 2; z: 1", "store": ""}


def test_a_run_without_run_json_says_so() -> None:
    (table,) = provenance_tables(_run({}))
    assert [[c.text for c in row] for row in table.rows] == [["run.json", "absent: no provenance recorded"]]
