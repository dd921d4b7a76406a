"""The self-contained HTML report: content, no external resources, and a real render in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodbench.core.results import write_rows
from oodbench.report.html_report import write_html_report

from .helpers import VOCABULARIES

FAST = dict(draws=200, curve_draws=40, curve_points=4, resamples=200)


@pytest.fixture(scope="module")
def report(two_runs, tmp_path_factory) -> Path:
    # One model here (the figures dominate the time); the CLI test covers a two-model report.
    out = tmp_path_factory.mktemp("html") / "report.html"
    return write_html_report(two_runs[0], out, **FAST)


def test_report_holds_tables_figures_and_provenance(report, two_runs) -> None:
    html = report.read_text(encoding="utf-8")
    for key in ("table1", "tableA1", "tableA2", "tableA6", "intervals", "delong", "detectors-toy-a"):
        assert f'data-table="{key}"' in html, key
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    # Fig. 1 and Fig. A4, then ROC curves and histograms per OOD set.
    assert len(images) == 2 + 3 * 2
    for encoded in images[:3]:
        with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
            assert image.format == "PNG" and image.size[0] > 200
    run = json.loads((two_runs[0] / "run.json").read_text())
    for _dataset, entry in run["entries"].items():
        assert entry["item_hash"] in html
    assert run["entries"]["far"]["provenance"]["checkpoint"] in html
    assert "numpy" in html and "matplotlib" in html


def test_report_loads_nothing_from_outside(report) -> None:
    html = report.read_text(encoding="utf-8")
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert not re.search(r"(src|href)=\"(?!data:|#)", html)
    assert not re.search(r"url\(", html)
    assert "default-src 'none'" in html


def test_zero_shot_rows_give_table2_and_the_vocabulary_sweep(zeroshot_rows, tmp_path) -> None:
    run = tmp_path / "zs-run"
    write_rows(zeroshot_rows, run / "results.parquet")
    (run / "run.json").write_text(json.dumps({"model": "clip-b16", "vocabularies": VOCABULARIES}))
    html = write_html_report(run, tmp_path / "zs.html", **FAST).read_text(encoding="utf-8")
    assert 'data-table="table2"' in html and "LLM siblings (20,000)" in html
    assert 'id="figA1-vocabulary-sweep"' in html
    # Zero-shot models feed Table 2 and the sweep only: no supervised tables, no subsampling of their rows.
    for key in ("table1", "tableA1", "tableA2", "tableA6", "detectors-clip-b16"):
        assert f'data-table="{key}"' not in html, key
    assert "appear in Table 2 and the vocabulary-size figure only" in html


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run_chromium(binary: str, args: list[str], profile: Path) -> subprocess.CompletedProcess:
    base = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path) -> None:
    binary = _chromium()
    url = report.resolve().as_uri()
    dom = _run_chromium(binary, ["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    for key in ("table1", "tableA6", "intervals"):
        assert f'data-table="{key}"' in dom.stdout
    # The DOM holds the parsed table rows, not just the source text.
    assert len(re.findall(r"<tr", dom.stdout)) > 40
    shot = tmp_path / "shot.png"
    result = _run_chromium(binary, [f"--screenshot={shot}", "--window-size=1280,2000", url], tmp_path / "profile-shot")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.shape == (2000, 1280)
    assert pixels.std() > 20  # not a blank page
    assert (pixels < 128).mean() > 0.01  # text, rules and plots drawn in dark ink


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium (/usr/bin/chromium) is not installed")
def test_provenance_values_stay_inside_a_1400px_window(two_runs, tmp_path) -> None:
    """A 579-character head description (as the demo's) must neither push the values off-screen nor clip the table."""
    sync_api = pytest.importorskip("playwright.sync_api")
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    info = json.loads((run / "run.json").read_text())
    info.setdefault("head", {}).setdefault("provenance", {})["description"] = "linear head " + "x" * 567
    (run / "run.json").write_text(json.dumps(info))
    out = write_html_report(run, tmp_path / "report.html", score_figures=False, **FAST)
    width = 1400
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(out.resolve().as_uri())
        checked = 0
        for selector in ('table[data-table^="prov-"] td', 'table[data-table^="entries-"] td'):
            cells = page.locator(selector)
            assert cells.count() > 0, selector
            for index in range(cells.count()):
                box = cells.nth(index).bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (selector, index, box)
                checked += 1
        # Values read from the left edge of their column, next to their label.
        value = page.locator('table[data-table^="prov-"] td:nth-child(2)').first
        assert value.evaluate("e => getComputedStyle(e).textAlign") in ("left", "start")
        browser.close()
    assert checked > 10


DEMO_HEAD = {  # the shape of the demo's head provenance: nested mappings
    "checkpoint": "2675b7726d87d9882d3a4bc69e39d2aa95218d39517c1a8b5dcb8d1aeeec21a5",
    "demo": {"epochs": 40, "sizes": {"digits-fit": 650, "noise": 300}, "torch": "2.14.1"},
    "preprocessing": {"input": "8x8 grey levels scaled to [0, 1]", "normalisation": "none"},
}

# The words of the element's text that occupy 2 or more lines (broken inside). A break after a hyphen, as
# in "SHA-" / "256", is ordinary typography: the parts around a hyphen count as words of their own.
SPLIT_WORDS = """e => {
  const split = [];
  const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.data.matchAll(/[^\\s-]+/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (tops.size > 1) split.push(m[0]);
    }
  }
  return split;
}"""


def test_provenance_shows_no_python_dict(two_runs, tmp_path) -> None:
    from oodbench.analysis.rundata import load_run
    from oodbench.report.build import plain_text, provenance_tables

    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    info = json.loads((run / "run.json").read_text())
    info.setdefault("head", {})["provenance"] = DEMO_HEAD
    for meta in info["entries"].values():
        meta["provenance"]["preprocessing"] = DEMO_HEAD["preprocessing"]
    (run / "run.json").write_text(json.dumps(info))
    text = " ".join(c.text for t in provenance_tables(load_run(run)) for row in t.rows for c in row)
    assert "{" not in text and "'" not in text
    assert "preprocessing: input: 8x8 grey levels scaled to [0, 1], normalisation: none" not in text
    assert "demo: (epochs: 40, sizes: (digits-fit: 650, noise: 300), torch: 2.14.1)" in text
    assert "input: 8x8 grey levels scaled to [0, 1]; normalisation: none" in text
    assert plain_text({"a": [1, 2], "b": None, "c": {}}) == "a: 1, 2; b: –; c: –"


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium (/usr/bin/chromium) is not installed")
@pytest.mark.parametrize("width", [1400, 420])
def test_provenance_keys_and_headings_keep_their_words_whole(two_runs, tmp_path, width) -> None:
    """Keys ("run directory", "complete") and headings never break inside a word, while long values still wrap."""
    sync_api = pytest.importorskip("playwright.sync_api")
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    info = json.loads((run / "run.json").read_text())
    info.setdefault("head", {})["provenance"] = {**DEMO_HEAD, "description": "linear head " + "x" * 567}
    (run / "run.json").write_text(json.dumps(info))
    out = write_html_report(run, tmp_path / "report.html", score_figures=False, **FAST)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(out.resolve().as_uri())
        keys = page.locator("table.wrap td:first-child, table.wrap th")
        assert keys.count() > 15
        broken = {keys.nth(i).inner_text(): keys.nth(i).evaluate(SPLIT_WORDS) for i in range(keys.count())}
        assert {k: v for k, v in broken.items() if v} == {}
        assert "run directory" in broken and "complete" in broken
        # The long value still wraps inside the window instead of widening the table.
        value = page.locator('table[data-table^="prov-"] td:nth-child(2)', has_text="linear head").first
        box = value.bounding_box()
        assert box is not None and box["x"] + box["width"] <= width
        browser.close()


def test_intro_becomes_a_context_section_first(two_runs, tmp_path) -> None:
    from oodbench.core.tabular import Cell, Table

    datasets = Table("demo-datasets", "The datasets", ("set", "images"), ((Cell("near"), Cell("300")),))
    html = write_html_report(
        two_runs[0], tmp_path / "r.html", intro=("First paragraph.", "Second paragraph.", datasets), **FAST
    ).read_text(encoding="utf-8")
    context = html.index('<section id="context">')
    assert context < html.index('<section id="overview">')
    assert "<p>First paragraph.</p>" in html and "<p>Second paragraph.</p>" in html
    assert 'data-table="demo-datasets"' in html


# The strip of the scroll container's edge, text and rules hidden: only the container's own background is seen.
HIDE_CONTENT = (
    "table.oodb *, figure.table figcaption { color: transparent !important; border-color: transparent !important; }"
)


def _edge_darkness(figure, side: str) -> float:
    """How much darker than white the 4 px at one edge of `figure` are, at their darkest (0: no shadow)."""
    shot = Image.open(io.BytesIO(figure.screenshot())).convert("L")
    width, height = shot.size
    strip = shot.crop((0, 0, 4, height) if side == "left" else (width - 4, 0, width, height))
    return 255 - strip.getextrema()[0]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium (/usr/bin/chromium) is not installed")
def test_per_model_mean_table_scrolls_with_a_visible_cue_at_390px(tmp_path) -> None:
    """Phone width: the page itself never scrolls sideways; Table A1 scrolls inside its figure, and a shadow marks
    each edge with more columns beyond it (before: the columns past the edge were cut with nothing to say so)."""
    from ..analysis.helpers import make_run

    sync_api = pytest.importorskip("playwright.sync_api")
    runs = [make_run(tmp_path, "tf_efficientnet_lite0.in1k", 0), make_run(tmp_path, "convnext_base.fb_in22k", 1)]
    out = write_html_report(runs, tmp_path / "report.html", score_figures=False, **FAST)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
        page.goto(out.resolve().as_uri())
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        figure = page.locator("figure#tableA1")
        figure.scroll_into_view_if_needed()
        scroll_width, client_width = figure.evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert scroll_width > client_width  # wider than the phone: it scrolls
        page.add_style_tag(content=HIDE_CONTENT)
        at_start = (_edge_darkness(figure, "left"), _edge_darkness(figure, "right"))
        figure.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
        at_end = (_edge_darkness(figure, "left"), _edge_darkness(figure, "right"))
        # Row bands are 11 grey levels below white at most; a shadow is well beyond that.
        assert at_start[1] > 30 and at_start[0] <= 12, at_start
        assert at_end[0] > 30 and at_end[1] <= 12, at_end
        last = page.locator('table[data-table="tableA1"] thead th').last.bounding_box()
        assert last is not None and last["x"] + last["width"] <= 390 + 1  # the last model's column is reachable
        browser.close()
