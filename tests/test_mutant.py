"""The end-to-end tests check numbers, not only plumbing: under the constant-score mutant each of them fails.

The mutant (`tests/fakes/constant_scores.py`) makes every detector score every row 0.0; exit codes, file names and
echoed arguments stay as they were. An end-to-end test that still passed under it could not catch a detector, a
metric or a table that reports wrong numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
