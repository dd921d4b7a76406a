"""A full round in a real browser: two annotators disagree, three resolve it in Stage 3, export."""

from __future__ import annotations

import csv
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from .helpers import PASSWORD, build_project

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


@contextmanager
def serving(project):
    """Serve a project's app by uvicorn on a random loopback port; yields its URL."""
    uvicorn = pytest.importorskip("uvicorn")
    from oodbench.annotate.web import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(project), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        project.close()


@pytest.fixture
def served(tmp_path):
    """The app of a one-image project with accounts ann1..ann3."""
    project = build_project(tmp_path, n_images=1)
    for name in ("ann1", "ann2", "ann3"):
        project.store().add_user(name, PASSWORD)
    with serving(project) as url:
        yield project, url


@contextmanager
def chromium():
    """A headless Debian Chromium driven by Playwright."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_for_focus(page, element_id: str) -> None:
    """Wait until the browser has applied `autofocus`: Chromium does so after the load event, later under load,
    and a key pressed before it lands nowhere (a keyboard user sees the focus ring before pressing)."""
    page.wait_for_function(f"document.activeElement && document.activeElement.id === {element_id!r}")


def test_disagreement_resolved_in_stage3_reaches_the_export(served, tmp_path):
    project, url = served
    with chromium() as browser:
        pages = {}
        for name in ("ann1", "ann2", "ann3"):
            page = browser.new_context().new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{url}/login")
            page.fill("#username", name)
            page.fill("#password", PASSWORD)
            page.click("#login")
            page.wait_for_selector("text=Hello, " + name)
            pages[name] = page

        # Stage 1, annotator 1: keyboard only. F flags fine-grained, O selects OOD and focuses the label.
        a = pages["ann1"]
        a.goto(f"{url}/annotate")  # a GET claims nothing: the page offers the next image
        wait_for_focus(a, "claim")
        a.keyboard.press("Enter")  # the focused "Take the next image" button (a POST)
        a.wait_for_url("**/annotate/*")
        assert a.eval_on_selector("#subject", "img => img.complete && img.naturalWidth") == 16
        a.keyboard.press("f")
        a.keyboard.press("o")
        assert a.evaluate("document.activeElement.id") == "label"
        a.keyboard.type("Hot-air balloon")
        a.keyboard.press("Enter")
        a.wait_for_selector("#queue-empty")

        # Annotator 2 disagrees: takes the original label from the evidence panel (ID).
        b = pages["ann2"]
        b.goto(f"{url}/annotate")
        b.click("#claim")
        b.wait_for_url("**/annotate/*")
        assert "Hot-air balloon" not in b.content()  # Stage 1 is blind
        b.click("#evidence-original button.pick")
        assert b.input_value("#class") == "0: class-0" and b.is_checked("#v-id")
        b.keyboard.press("Enter")
        b.wait_for_selector("#queue-empty")

        # Stage 3: all three review together and agree on the OOD label.
        for name, label in (("ann1", "hot air balloon"), ("ann2", "Hot air balloon"), ("ann3", "hot-air balloon")):
            page = pages[name]
            page.goto(f"{url}/stage3")
            page.click("a.review-link")
            page.wait_for_selector("text=Stage 1 verdicts")
            assert "Hot-air balloon" in page.content() and "class-0" in page.content()
            page.keyboard.press("o")
            page.keyboard.type(label)
            page.keyboard.press("Enter")
            page.wait_for_selector("#panel")
        pages["ann3"].wait_for_selector("#final")
        assert "hot air balloon" in pages["ann3"].inner_text("#final").lower()

    from oodbench.annotate.export import export

    manifest = export(project, tmp_path / "bench")
    assert manifest["counts"]["ood"] == 1
    with open(tmp_path / "bench" / "ood_manifest.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["key"], row["ood_concept"], row["decided_in"], row["annotators"]) == (
        "img000.png",
        "hot air balloon",
        "3",
        "ann1;ann2;ann3",
    )
    with open(tmp_path / "bench" / "ood.csv", newline="") as handle:
        assert list(csv.DictReader(handle)) == [
            {"path": str(project.root("images") / "sub0" / "img000.png"), "label": ""}
        ]
    # The Stage 1 fine-grained flag of annotator 1 is on record in the event log.
    first = project.store().events()[0]
    assert (first["annotator"], first["verdict"], first["label"], first["fine_grained"]) == (
        "ann1",
        "ood",
        "Hot-air balloon",
        True,
    )


def test_one_annotator_works_through_a_queue_with_the_keyboard_only(tmp_path):
    project = build_project(tmp_path, n_images=3, examples=True)
    project.store().add_user("ann1", PASSWORD)
    with serving(project) as url, chromium() as browser:
        page = browser.new_context().new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{url}/login")  # the one navigation; from here on only keys are pressed
        keys = page.keyboard
        wait_for_focus(page, "username")
        keys.type("ann1")  # the name field has the focus
        keys.press("Tab")
        keys.type(PASSWORD)
        keys.press("Enter")
        page.wait_for_selector("text=Hello, ann1")
        wait_for_focus(page, "start")
        keys.press("Enter")  # "Continue with my queue" has the focus: claims the first image
        page.wait_for_url("**/annotate/*")
        assert "Your verdict no. 1 · 2 more image(s)" in page.inner_text("#queue-status")

        # An example image enlarges from the keyboard: Tab to it, Enter.
        for _ in range(60):
            keys.press("Tab")
            if page.evaluate("!!document.activeElement.closest('.thumbs')"):
                break
        else:
            pytest.fail("no example image is reachable with Tab")
        small = page.evaluate("document.activeElement.getBoundingClientRect().height")
        keys.press("Enter")
        assert page.evaluate("document.activeElement.getBoundingClientRect().height") > 4 * small
        assert "/annotate/" in page.url  # Enter on a thumbnail did not submit the form

        # Image 1: fine-grained OOD, label typed, Enter.
        first = page.url
        keys.press("f")
        keys.press("o")
        keys.type("Snow globe")
        keys.press("Enter")
        page.wait_for_url(lambda u: u != first and "/annotate/" in u)

        # Image 2: a misspelt class is refused, the form stays as typed with a suggestion; I retypes it.
        second = page.url
        keys.press("i")
        keys.type("clas-2")
        keys.press("Enter")
        page.wait_for_selector(".error")
        assert "did you mean “2: class-2”" in page.inner_text(".error")
        assert page.input_value("#class") == "clas-2" and page.is_checked("#v-id")
        keys.press("i")  # focuses the class field with its text selected
        keys.type("2")
        keys.press("Enter")
        page.wait_for_url(lambda u: u != second and "/annotate/" in u)

        # Image 3: ambiguous, a reason picked in the dropdown by typing, Enter submits from the dropdown.
        keys.press("a")
        assert page.evaluate("document.activeElement.id") == "reason"
        keys.type("d")  # "degraded"
        keys.press("Enter")
        page.wait_for_selector("#queue-empty")

    events = project.store().events()
    assert [(e["verdict"], e["label"], e["class_index"], e["reason"], e["fine_grained"]) for e in events] == [
        ("ood", "Snow globe", None, None, True),
        ("id", None, 2, None, False),
        ("ambiguous", None, None, "degraded", False),
    ]


# The line boxes of an element's text: 1 when every word of it sits on one line.
TEXT_LINES = """e => {
  const range = document.createRange();
  range.selectNodeContents(e);
  return new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top))).size;
}"""


def test_the_header_keeps_each_link_on_one_line_at_phone_width(tmp_path):
    # Before: at 390 px "Stage 1 queue" took 3 lines and "Log out" 2, squeezed beside the title.
    project = build_project(tmp_path, n_images=1)
    project.store().add_user("annotator.with-a-long-name", PASSWORD, is_admin=True)
    with serving(project) as url, chromium() as browser:
        page = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True).new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{url}/login")
        page.fill("#username", "annotator.with-a-long-name")
        page.fill("#password", PASSWORD)
        page.click("#login")
        page.wait_for_selector("text=Hello, annotator.with-a-long-name")
        items = page.locator("header.top .brand, header.top nav a, header.top .who, header.top button")
        texts = [items.nth(i).inner_text() for i in range(items.count())]
        assert {"Stage 1 queue", "My verdicts", "Stage 3 review", "Admin", "Log out"} <= set(texts)
        lines = {text: items.nth(i).evaluate(TEXT_LINES) for i, text in enumerate(texts)}
        assert all(count == 1 for count in lines.values()), lines
        for i in range(items.count()):
            box = items.nth(i).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (texts[i], box)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
