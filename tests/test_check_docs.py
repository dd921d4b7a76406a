"""tools/check_docs.py, which `make docs` runs: unfinished text, the project's issue numbers, links from disk."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / "tools" / "check_docs.py")
check_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_docs)


def findings(tmp_path: Path, text: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return list(check_docs.source_findings(page))


@pytest.mark.parametrize(
    "line",
    [
        "*To be completed: the report command.*",
        "Section 7 (to be completed).",
        "TODO: measure this",
        "The figure is TBD.",
        "FIXME the ratio",
    ],
)
def test_unfinished_text_is_found(tmp_path, line):
    found = findings(tmp_path, f"# Title\n\n{line}\n")
    assert len(found) == 1 and found[0].startswith(f"{tmp_path / 'page.md'}:3:") and "unfinished text" in found[0]


@pytest.mark.parametrize(
    "line",
    [
        "took about 2.5 s idle (issue 12), most of it",
        "issue 17's target ≤ 1.5×",
        "**Issue-17 run, second round**",
        "fixed in issue #5",
        "see PR 7 and pull request #9",
        "issues 3 and 4",
    ],
)
def test_the_projects_own_issue_numbers_are_found(tmp_path, line):
    found = findings(tmp_path, line + "\n")
    assert found and all("not its history" in f for f in found)
    assert len(findings(tmp_path, "see PR 7 and pull request #9\n")) == 2


@pytest.mark.parametrize(
    "line",
    [
        "That is a different number (see [OpenOOD issue #308](https://github.com/Jingkang50/OpenOOD/issues/308)).",
        "Raw link: https://github.com/Jingkang50/OpenOOD/issues/308",
        "The tissue 5 samples; AUPR 95; the issue of scale; 12 issues; a todos-free page; TBDX",
        "```\nkey = value  # a sample\n```",
    ],
)
def test_ordinary_text_and_links_to_other_trackers_pass(tmp_path, line):
    assert findings(tmp_path, line + "\n") == []


def test_an_own_issue_beside_an_external_link_is_still_found(tmp_path):
    line = "[OpenOOD issue #308](https://github.com/Jingkang50/OpenOOD/issues/308), fixed here in issue 12\n"
    found = findings(tmp_path, line)
    assert len(found) == 1 and "'issue 12'" in found[0]


@pytest.mark.parametrize(
    ("line", "phrase"),
    [
        ("(1.57× at the start of this round, before the one-trmm whitening)", "this round"),
        ("| the same six, first round | float32 | 716 |", "first round"),
        ("Scoring took 26 s in the Last Round.", "Last Round"),
        ("As in the previous round, the fit streams.", "previous round"),
        ("**Earlier run** (the all-float64 search)", "Earlier run"),
        ("Two earlier runs gave 1.08×.", "earlier runs"),
        ("the earlier code: separate fits", "earlier code"),
        ("an earlier version rounded differently", "earlier version"),
        ("600 s with the final code", "the final code"),
        ("These figures predate the shared whitener.", "predate"),
        ("measured on the commit after the merge", "the commit after"),
    ],
)
def test_history_narration_is_found_with_file_and_line(tmp_path, line, phrase):
    found = findings(tmp_path, f"# Benchmarks\n\n{line}\n")
    assert len(found) == 1
    assert found[0].startswith(f"{tmp_path / 'page.md'}:3: {phrase!r}:") and "not its history" in found[0]


@pytest.mark.parametrize(
    "line",
    [
        "a full round of requests, then one more round trip per verdict",
        "`k = max(1, round(N / 1000))`; P(unknown) rounds to 0 or 1; every built-in round-trips",
        "Measured 2026-12-01 20:05 UTC on the 2 cores otherwise idle: fit 600 s.",
        "The figure in parentheses is a second run of the same benchmark, as a measure of run-to-run noise.",
        "The fit runs earlier than the scoring; the code is final once saved; a round-robin of runs.",
    ],
)
def test_ordinary_benchmark_prose_is_not_history(tmp_path, line):
    assert findings(tmp_path, line + "\n") == []


def test_main_exit_status_and_messages(tmp_path, capsys):
    docs = tmp_path / "docs"
    (docs / "api").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\nAll done.\n", encoding="utf-8")
    (docs / "api" / "core.md").write_text("# Core\n", encoding="utf-8")
    assert check_docs.main([str(docs)]) == 0
    assert "2 Markdown files clean" in capsys.readouterr().out
    (docs / "api" / "core.md").write_text("# Core\n\nTODO\n\nAs of issue 3.\n", encoding="utf-8")
    assert check_docs.main([str(docs)]) == 1
    err = capsys.readouterr().err
    assert "core.md:3: 'TODO'" in err and "core.md:5: 'issue 3'" in err and "2 problem(s) in 2 Markdown files" in err
    assert check_docs.main([str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert check_docs.main([]) == 2 and check_docs.main(["--site", str(tmp_path / "nowhere")]) == 2


def test_site_links_that_fail_from_disk_are_found(tmp_path):
    site = tmp_path / "site"
    (site / "guide").mkdir(parents=True)
    (site / "guide" / "index.html").write_text("<p>ok</p>", encoding="utf-8")
    (site / "other.html").write_text("<p>ok</p>", encoding="utf-8")
    (site / "style.css").write_text("", encoding="utf-8")
    (site / "index.html").write_text(
        '<a href="guide/">dir</a> <a href="/other.html">root</a> <a href="gone.html">gone</a>'
        '<a href="other.html#part">ok</a> <a href="guide/index.html?x=1">ok</a> <link href=\'style.css\'>'
        '<a href="https://example.org/">ext</a> <a href="#top">anchor</a> <img src="data:image/png;base64,AA">'
        '<a href="mailto:a@b.c">mail</a> <a href="">self</a>',
        encoding="utf-8",
    )
    (site / "404.html").write_text('<a href="/index.html">home</a>', encoding="utf-8")  # exempt
    found = list(check_docs.site_findings(site))
    assert len(found) == 3
    assert "'guide/' leads to a folder" in found[0]
    assert "'/other.html' starts at the root" in found[1]
    assert "'gone.html' leads to nothing" in found[2]
    (site / "index.html").write_text('<a href="guide/index.html">ok</a>', encoding="utf-8")
    assert check_docs.main(["--site", str(site)]) == 0


@pytest.mark.slow
def test_the_built_site_navigates_from_disk(tmp_path):
    """The real mkdocs.yml builds pages as files, and every link of every page leads to a file."""
    pytest.importorskip("mkdocs", reason="the docs tools come with the 'docs' extra")
    pytest.importorskip("material", reason="the docs theme comes with the 'docs' extra")
    # A copy of the sources, so the build leaves no site/ in the checkout.
    for name in ("docs", "src"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(tmp_path / "src")}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", "site"]
    done = subprocess.run(build, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "detectors.html").is_file() and not (site / "detectors").exists()
    assert list(check_docs.site_findings(site)) == []
    assert 'href="concepts.html"' in (site / "index.html").read_text(encoding="utf-8")


def test_site_resources_from_the_network_are_found(tmp_path):
    # Before: the offline plugin's worker shim from a CDN passed: search never started from disk offline.
    site = tmp_path / "site"
    site.mkdir()
    (site / "local.js").write_text("", encoding="utf-8")
    (site / "index.html").write_text(
        '<script src="https://unpkg.com/iframe-worker/shim"></script>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        "<img src=//cdn.example.org/a.png>"
        '<script src="local.js"></script><a href="https://arxiv.org/abs/1">a paper</a>'
        '<link rel="canonical" href="https://example.org/index.html">',
        encoding="utf-8",
    )
    found = list(check_docs.site_findings(site))
    assert len(found) == 3, found
    assert "loads 'https://unpkg.com/iframe-worker/shim' from the network" in found[0]
    assert "fonts.googleapis.com" in found[1] and "//cdn.example.org/a.png" in found[2]
