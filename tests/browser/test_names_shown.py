"""Names a service sends are shown safely in a real browser (Chromium over
WebDriver): frame and service names holding control characters (NUL, ESC,
DEL, a line feed), a right-to-left override, a line separator and a
zero-width space. Every page and flame graph must still parse (an SVG with
a raw NUL is an XML parse error for every reader) and show each character
as its visible stand-in: `␀`, `␛`, `␡`, `␊`, `⟨U+202E⟩`, `⟨U+2028⟩`,
`⟨U+200B⟩`.

Run by .ci/run with the other browser tests (CPT_REQUIRE_BROWSER=1 there),
whose browser it shares (test_web_pages.py says what they need):

    python -m pytest tests/browser/test_names_shown.py
"""

import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from test_web_pages import BIN, browser, free_port, post  # noqa: F401 (browser: the fixture)

# Each class of character, in a frame name, and how a reader must see it.
FRAMES = [
    ("nul\u0000x", "nul\u2400x"),
    ("esc\u001b[31mx", "esc\u241b[31mx"),
    ("del\u007fx", "del\u2421x"),
    ("lf\nx", "lf\u240ax"),
    ("rlo\u202ex", "rlo\u27e8U+202E\u27e9x"),
    ("ls\u2028x", "ls\u27e8U+2028\u27e9x"),
    ("zw\u200bx", "zw\u27e8U+200B\u27e9x"),
]
SERVICE = ("edge\u200bgw", "edge\u27e8U+200B\u27e9gw")
RAW = ["\u0000", "\u001b", "\u007f", "\u202e", "\u2028", "\u200b"]
START_NS = time.time_ns() - 60_000_000_000


def record(i, arm):
    """A request through every odd frame, 1 ms each (2 ms in arm b)."""
    ns = 1_000_000 if arm == "a" else 2_000_000
    path = [{"stack": ["handle"], "ns": ns}]
    path += [{"stack": ["handle", raw], "ns": ns} for raw, _ in FRAMES]
    return {
        "service": SERVICE[0], "endpoint": "GET /x", "trigger": "sampled",
        "latency_ns": ns * len(path), "start_unix_nanos": START_NS + i,
        "request_id": f"names-{arm}-{i}", "labels": {"arm": arm}, "path": path,
    }


@pytest.fixture(scope="module")
def base():
    work = Path(tempfile.mkdtemp(prefix="cpt-names-"))
    port = free_port()
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen(
        [BIN / "cpt", "serve", "--store", work / "store.db", "--grpc", "off",
         "--http", f"127.0.0.1:{port}", "--durability", "normal"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("cpt serve did not start: " + (work / "serve.log").read_text())
            time.sleep(0.2)
    post(url, [record(i, arm) for arm in "ab" for i in range(5)])
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()
    shutil.rmtree(work, ignore_errors=True)


SEL = "service=" + urllib.parse.quote(SERVICE[0], safe="")
ARMS = "base=" + urllib.parse.quote(SEL + "&label=arm=a", safe="") + \
    "&test=" + urllib.parse.quote(SEL + "&label=arm=b", safe="")

# (page, whether it shows the frame names, whether it frames a flame graph)
PAGES = [
    ("/", False, False),
    ("/ui/profile?" + SEL, True, True),
    ("/ui/request?id=names-a-0", True, True),
    ("/ui/diff?" + ARMS, False, True),
    ("/ui/flame.svg?" + SEL, True, False),
    ("/ui/diff.svg?" + ARMS, True, False),
]


def document_text(driver):
    """The shown document's text, after checking it parsed: an XML parse
    error is a `parsererror` element in Chromium."""
    errors = driver.execute_script(
        "return Array.from(document.getElementsByTagName('parsererror')).map(e => e.textContent)")
    assert not errors, errors
    return driver.execute_script("return document.documentElement.textContent")


def check_shown(text, where, frames):
    raw = [repr(c) for c in RAW if c in text]
    assert not raw, f"{where} holds {raw} raw"
    assert SERVICE[1] in text, f"{where} lacks {SERVICE[1]}"
    if frames:
        lacking = [shown for _, shown in FRAMES if shown not in text]
        assert not lacking, f"{where} lacks {lacking}"


@pytest.mark.parametrize("page,frames,graph", PAGES)
def test_every_page_parses_and_shows_each_odd_character_visibly(base, browser, page, frames, graph):
    browser.get(base + page)
    if page.endswith(".svg") or ".svg?" in page:
        assert browser.execute_script("return document.documentElement.localName") == "svg"
    check_shown(document_text(browser), page, frames)
    if graph:
        frame = browser.find_element("css selector", "iframe")
        browser.switch_to.frame(frame)
        try:
            assert browser.execute_script("return document.documentElement.localName") == "svg"
            check_shown(document_text(browser), f"{page} (its flame graph)", True)
        finally:
            browser.switch_to.default_content()
