"""The built docs in a real browser opened from disk (file://) with the network off: the search box finds pages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium (/usr/bin/chromium) is not installed"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built by the real mkdocs.yml from a copy of the sources."""
    pytest.importorskip("mkdocs", reason="the docs tools come with the 'docs' extra")
    pytest.importorskip("material", reason="the docs theme comes with the 'docs' extra")
    root = tmp_path_factory.mktemp("docs")
    for name in ("docs", "src"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(root / "src")}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", "site"]
    done = subprocess.run(build, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "site"


@pytest.mark.parametrize("page", ["index.html", "api/core.html"])
def test_search_works_from_disk_with_the_network_off(site: Path, page: str) -> None:
    # Before: the offline plugin loaded its worker shim from unpkg.com; offline the box said "Initializing search"
    # forever. Every request that is not a file is refused and recorded, so any resource from elsewhere fails it.
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            context = browser.new_context(offline=True)
            remote: list[str] = []

            def only_files(route) -> None:  # noqa: ANN001 - playwright's Route
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    remote.append(route.request.url)
                    route.abort()

            context.route("**/*", only_files)
            tab = context.new_page()
            tab.set_default_timeout(15_000)
            errors: list[str] = []
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.goto((site / page).as_uri())
            tab.keyboard.press("/")  # the theme's shortcut: focus the search box
            tab.wait_for_function("document.activeElement && document.activeElement.matches('.md-search__input')")
            tab.keyboard.type("mahalanobis")
            tab.wait_for_selector(".md-search-result__item")
            meta = tab.inner_text(".md-search-result__meta")
            assert "matching document" in meta, meta
            first = tab.get_attribute(".md-search-result__item a", "href")
            assert first and not first.startswith(("http:", "https:")), first
            assert remote == [] and errors == [], (remote, errors)
        finally:
            browser.close()
