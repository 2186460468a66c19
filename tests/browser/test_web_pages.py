"""The collector's web pages in a real browser (Chromium over WebDriver).

A `cpt serve` with a read token holds the CPT Figure 1 demo's records
(services A, B and C; A is the entry service, B and C are on its paths),
plus the same sampled requests twice more as two versions, `version=v1`
as they ran and `version=v2` with C1's own time 20 ms longer: the change
the comparison page must mark. Each test opens a page as a person would,
checks what it shows, and saves a screenshot into docs/src/img/ui-*.png.

Run by .ci/run (CPT_REQUIRE_BROWSER=1 there: a missing browser fails the
run instead of skipping it):

    python -m pytest tests/browser

It needs target/debug/cpt and target/debug/demo (cargo build -p
cpt-collector -p cpt-examples), Debian's chromium and chromium-driver, and
selenium.
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("CPT_BIN_DIR", ROOT / "target" / "debug"))
IMG = ROOT / "docs" / "src" / "img"
CHROMIUM = os.environ.get("CPT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CPT_CHROMEDRIVER", "/usr/bin/chromedriver")
TOKEN = "s3cret-read-token"
# The change injected into C1's own time in the version=v2 arm.
INJECTED_NS = 20_000_000

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # reported by the missing() check below
    webdriver = None


def missing():
    """What this machine lacks to run the tests, if anything."""
    lacks = []
    if webdriver is None:
        lacks.append("python selenium")
    for p in (CHROMIUM, CHROMEDRIVER, BIN / "cpt", BIN / "demo"):
        if not Path(p).exists():
            lacks.append(str(p))
    return lacks


if missing():
    if os.environ.get("CPT_REQUIRE_BROWSER") == "1":
        raise RuntimeError(
            "CPT_REQUIRE_BROWSER=1 but missing: " + ", ".join(missing())
            + " (apt-get install chromium chromium-driver; pip install selenium;"
            " cargo build -p cpt-collector -p cpt-examples)"
        )
    pytest.skip("missing: " + ", ".join(missing()), allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leaf_name(frame):
    return frame if isinstance(frame, str) else frame.get("name")


def with_slower_c1(record, extra_ns):
    """The record with `extra_ns` more busy time in C1 (spread over its C1
    segments) and the latency grown by as much: the path still sums to it."""
    r = json.loads(json.dumps(record))
    c1 = [s for s in r["path"] if leaf_name(s["stack"][-1]) == "C1" and "kind" not in s]
    assert c1, "every demo request runs C1 (CPT Figure 1: A2, B2 and C2 call it)"
    c1[0]["ns"] += extra_ns
    r["latency_ns"] += extra_ns
    return r


def post(base, records):
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    req = urllib.request.Request(
        base + "/v1/records", data=body, method="POST",
        headers={"Content-Type": "application/x-ndjson"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200, resp.read()


def start_serve(c, work, *extra):
    """Start `cpt serve` on a free port with the read token and `extra`
    flags, its store and log in `work`; set `c.port`, `c.base`, `c.log` and
    `c.proc`, and return once it answers."""
    (work / "token").write_text(TOKEN + "\n")
    c.port = free_port()
    c.base = f"http://127.0.0.1:{c.port}"
    c.log = (work / "serve.log").open("w")
    c.proc = subprocess.Popen(
        [BIN / "cpt", "serve", "--store", work / "store.db", "--grpc", "off",
         "--http", f"127.0.0.1:{c.port}", "--read-token-file", work / "token",
         "--durability", "normal", *extra],
        stdout=c.log, stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(c.base + "/healthz", timeout=2)
            return
        except OSError:
            if time.time() > deadline or c.proc.poll() is not None:
                raise RuntimeError("cpt serve did not start: " + (work / "serve.log").read_text())
            time.sleep(0.2)


class Collector:
    def __init__(self, work):
        self.work = work
        demo_out = work / "demo"
        subprocess.run(
            [BIN / "demo", "--requests", "60", "--sample-rate", "1.0", "--forced", "4",
             "--no-collector", "--out", demo_out],
            check=True, stdout=subprocess.DEVNULL, timeout=300,
        )
        self.records = [json.loads(line) for line in (demo_out / "records.jsonl").open() if line.strip()]
        self.forced_ids = [r["request_id"] for r in self.records if r["trigger"] == "forced"]
        assert len(self.forced_ids) == 4
        start_serve(self, work)
        arms = []
        for r in self.records:
            if r["trigger"] != "sampled":
                continue
            for version, extra in (("v1", 0), ("v2", INJECTED_NS)):
                a = with_slower_c1(r, extra) if extra else json.loads(json.dumps(r))
                a["labels"]["version"] = version
                a["request_id"] = f"{version}-{r['request_id']}"
                arms.append(a)
        post(self.base, self.records)
        post(self.base, arms)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def collector():
    work = Path(tempfile.mkdtemp(prefix="cpt-web-"))
    c = Collector(work)
    yield c
    c.stop()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="cpt-chromium-")
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000",
              "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    # The console, to see what the pages' Content-Security-Policy refused.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The Debian driver, never a download (the machine may be offline).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name, height=None):
    """Save the page (its whole height, up to `height`) as docs/src/img/NAME."""
    IMG.mkdir(parents=True, exist_ok=True)
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(full, 600), height or 1600))
    driver.save_screenshot(str(IMG / name))
    driver.set_window_size(1400, 1000)


def signed_in(driver, collector):
    driver.get(collector.base + "/")
    if "/ui/login" in driver.current_url:
        driver.find_element(By.NAME, "token").send_keys(TOKEN)
        driver.find_element(By.CSS_SELECTOR, "form.login button").click()
        WebDriverWait(driver, 10).until(lambda d: "/ui/login" not in d.current_url)


def test_pages_need_the_read_token_and_hide_forced_ids_without_it(collector, browser):
    browser.delete_all_cookies()
    browser.get(collector.base + "/")
    assert "/ui/login?next=" in browser.current_url
    for fid in collector.forced_ids:
        assert fid not in browser.page_source
    # A program without the token gets 401, not the page.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(collector.base + "/ui/request?id=" + collector.forced_ids[0])
    assert e.value.code == 401
    browser.find_element(By.NAME, "token").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    # The click returns once the form is sent, not once the answer is shown.
    error = WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "login-error"))
    assert "not this collector's read token" in error[0].text
    assert browser.get_cookie("cpt_read_token") is None
    shot(browser, "ui-login.png", 700)
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    WebDriverWait(browser, 10).until(lambda d: "/ui/login" not in d.current_url)
    assert browser.current_url == collector.base + "/"
    cookie = browser.get_cookie("cpt_read_token")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict", cookie
    assert not browser.execute_script("return document.cookie"), "HttpOnly: no script sees it"
    for fid in collector.forced_ids:
        assert fid in browser.page_source


def test_index_lists_services_a_b_c(collector, browser):
    signed_in(browser, collector)
    browser.get(collector.base + "/")
    entry = [tr.get_attribute("data-service") for tr in browser.find_elements(By.CSS_SELECTOR, "#endpoints tbody tr")]
    assert entry == ["A"], "A is the Figure 1 system's entry service"
    on_paths = {tr.get_attribute("data-service") for tr in browser.find_elements(By.CSS_SELECTOR, "#on-paths tbody tr")}
    assert {"A", "B", "C"} <= on_paths, on_paths
    row = browser.find_element(By.CSS_SELECTOR, "#endpoints tbody tr")
    # 56 sampled requests as they ran, 56 in each of the two versions.
    assert row.find_elements(By.TAG_NAME, "td")[2].text.strip() == str(56 * 3)
    forced = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#forced tbody a")]
    assert sorted(forced) == sorted(collector.forced_ids)
    shot(browser, "ui-index.png")


def flame_titles(driver):
    return [t.get_attribute("textContent") for t in driver.find_elements(By.CSS_SELECTOR, "#frames g title")]


def test_profile_of_a_shows_its_frames_in_a_zoomable_flame_graph(collector, browser):
    signed_in(browser, collector)
    browser.get(collector.base + "/ui/profile?service=A&label=version%3Dv1")
    assert browser.find_element(By.ID, "requests").text == "56"
    stacks = browser.find_elements(By.CSS_SELECTOR, "#stacks tbody tr")
    assert len(stacks) > 5
    pprof = browser.find_element(By.ID, "pprof").get_attribute("href")
    assert "/profile?service=A" in pprof
    shot(browser, "ui-profile.png", 1500)
    browser.switch_to.frame(browser.find_element(By.ID, "flame"))
    titles = flame_titles(browser)
    for frame in ("/cpt.example.ServiceA/Run (A)", "A1 (A)", "B1 (B)", "C1 (C)"):
        assert any(t.startswith(frame) for t in titles), (frame, titles[:10])
    # Clicking a frame zooms into it: the "Reset Zoom" control appears.
    unzoom = browser.find_element(By.ID, "unzoom")
    assert "hide" in (unzoom.get_attribute("class") or "")
    a1 = next(g for g in browser.find_elements(By.CSS_SELECTOR, "#frames g")
              if g.find_element(By.TAG_NAME, "title").get_attribute("textContent").startswith("A1 (A)"))
    a1.find_element(By.TAG_NAME, "rect").click()
    WebDriverWait(browser, 5).until(lambda d: "hide" not in (d.find_element(By.ID, "unzoom").get_attribute("class") or ""))
    browser.switch_to.default_content()


def test_forced_request_shows_its_tree_and_its_leaves_sum_to_the_latency(collector, browser):
    signed_in(browser, collector)
    browser.get(collector.base + "/")
    browser.find_element(By.CSS_SELECTOR, "#forced tbody a").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "tree"))
    assert "/ui/request?id=" in browser.current_url
    latency = int(browser.find_element(By.ID, "latency").get_attribute("data-ns"))
    leaves = sum(int(tr.get_attribute("data-leaf-ns")) for tr in browser.find_elements(By.CSS_SELECTOR, "#tree tbody tr"))
    assert leaves == latency > 0
    assert int(browser.find_element(By.ID, "leaf-sum").get_attribute("data-ns")) == latency
    frames = browser.find_element(By.ID, "tree").text
    for name in ("/cpt.example.ServiceA/Run", "A1", "B1", "C1", "[network]", "★ slowest #1"):
        assert name in frames, name
    assert "forced" in browser.page_source
    shot(browser, "ui-request.png", 1500)


def test_request_page_waits_until_the_record_arrives(collector, browser):
    signed_in(browser, collector)
    browser.get(collector.base + "/ui/request?id=late-request&wait=60s")
    assert browser.find_elements(By.ID, "waiting")
    late = json.loads(json.dumps(next(r for r in collector.records if r["trigger"] == "forced")))
    late["request_id"] = "late-request"
    post(collector.base, [late])
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "tree"))
    assert int(browser.find_element(By.ID, "latency").get_attribute("data-ns")) == late["latency_ns"]


def test_diff_marks_the_injected_c1_change(collector, browser):
    signed_in(browser, collector)
    q = urllib.parse.urlencode({"base": "service=A&label=version=v1", "test": "service=A&label=version=v2"})
    browser.get(collector.base + "/ui/diff?" + q)
    flagged = browser.find_elements(By.CSS_SELECTOR, "#changes tr.flagged")
    assert flagged, "the injected change is larger than noise"
    for tr in flagged:
        stack = tr.get_attribute("data-stack")
        assert stack.endswith("C1 (C)"), stack
        assert "up" in tr.get_attribute("class") and "slower" in tr.text
    # Nothing else changed: every other stack is within noise.
    others = browser.find_elements(By.CSS_SELECTOR, "#changes tbody tr:not(.flagged)")
    assert all("within noise" in tr.text for tr in others)
    assert browser.find_element(By.ID, "total-change").text.startswith("+20.00ms")
    shot(browser, "ui-diff.png", 1500)
    browser.switch_to.frame(browser.find_element(By.ID, "flame"))
    assert any(t.startswith("C1 (C)") and "+" in t for t in flame_titles(browser))
    browser.switch_to.default_content()


def test_pages_follow_dark_mode(collector, browser):
    signed_in(browser, collector)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        browser.get(collector.base + "/ui/profile?service=A&label=version%3Dv1")
        bg = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        r, g, b = (int(x) for x in bg[bg.index("(") + 1:bg.index(")")].split(",")[:3])
        assert max(r, g, b) < 60, bg
        shot(browser, "ui-profile-dark.png", 1000)
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def policy_violations(driver):
    """Console messages since the last call that report a refused load or script."""
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]


def test_pages_and_the_flame_graph_run_under_their_policy_without_violations(collector, browser):
    signed_in(browser, collector)
    policy_violations(browser)
    q = urllib.parse.urlencode({"base": "service=A&label=version=v1", "test": "service=A&label=version=v2"})
    for target in ("/", "/ui/profile?service=A&label=version%3Dv1", "/ui/diff?" + q,
                   "/ui/request?id=" + collector.forced_ids[0], "/ui/flame.svg?service=A"):
        browser.get(collector.base + target)
        time.sleep(0.5)
        assert policy_violations(browser) == [], target
    # The flame graph's own script ran (allowed by its hash): it sized the frames.
    browser.get(collector.base + "/ui/flame.svg?service=A")
    WebDriverWait(browser, 5).until(lambda d: d.execute_script("return typeof init === 'function' && !!frames"))


def test_sign_in_with_a_tab_in_next_stays_on_the_collector(collector, browser):
    browser.delete_all_cookies()
    elsewhere = free_port()
    # `/<TAB>/127.0.0.1:PORT/x`: a browser drops the tab and would go to //127.0.0.1:PORT/x.
    browser.get(collector.base + f"/ui/login?next=%2F%09%2F127.0.0.1%3A{elsewhere}%2Fx")
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    WebDriverWait(browser, 10).until(lambda d: "/ui/login" not in d.current_url)
    assert browser.current_url == collector.base + "/", browser.current_url


def test_another_site_cannot_frame_the_sign_in_form(collector, browser):
    site = Path(tempfile.mkdtemp(prefix="cpt-other-site-"))
    (site / "frame.html").write_text(
        f'<!doctype html><iframe id="f" src="{collector.base}/ui/login" width="600" height="400"></iframe>')
    port = free_port()
    server = subprocess.Popen(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/frame.html", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        policy_violations(browser)
        browser.get(f"http://127.0.0.1:{port}/frame.html")
        refused = WebDriverWait(browser, 10).until(lambda d: policy_violations(d))
        assert any("frame-ancestors" in m for m in refused), refused
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(site, ignore_errors=True)
