"""/ui/trend in a real browser: an endpoint's mean and p99 over three weeks
from the collector's roll-ups, with raw records kept two days only.

The CPT Figure 1 demo's sampled requests are sent again as if they had run
four times a day for 21 days, C1's own time 10 ms longer in the last seven
(a release that made C1 slower). Most of them are older than the raw
window (`--retain-for 2d`), so only the roll-ups hold them: the page must
show the step, link each point to its period's profile, and compare the
last week with the one before.
"""

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from test_web_pages import BIN, TOKEN, By, WebDriverWait, browser, post, shot, signed_in, start_serve, with_slower_c1  # noqa: F401 (browser: the fixture)

ENDPOINT = "/cpt.example.ServiceA/Run"
SLOWER_NS = 10_000_000
HOUR_NS = 3_600_000_000_000
DAY_NS = 24 * HOUR_NS


def read(base, path):
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


class TrendCollector:
    def __init__(self, work):
        demo_out = work / "demo"
        subprocess.run(
            [BIN / "demo", "--requests", "30", "--sample-rate", "1.0", "--no-collector", "--out", demo_out],
            check=True, stdout=subprocess.DEVNULL, timeout=300,
        )
        sampled = [json.loads(line) for line in (demo_out / "records.jsonl").open()
                   if line.strip() and json.loads(line)["trigger"] == "sampled"]
        start_serve(self, work, "--retain-for", "2d", "--retention-interval", "1s")
        now = time.time_ns()
        self.sent = 0
        for day in range(21):
            batch = []
            for hour in (1, 7, 13, 19):
                for i, r in enumerate(sampled):
                    a = with_slower_c1(r, SLOWER_NS) if day < 7 else json.loads(json.dumps(r))
                    a["start_unix_nanos"] = now - day * DAY_NS - hour * HOUR_NS - i * 1_000_000
                    a["request_id"] = f"d{day}h{hour}-{r['request_id']}"
                    batch.append(a)
            post(self.base, batch)
            self.sent += len(batch)
        # Rolled up within a second or two of their commit.
        deadline = time.time() + 30
        while "cpt_rollup_backlog_records 0\n" not in read(self.base, "/metrics"):
            assert time.time() < deadline, read(self.base, "/metrics")
            time.sleep(0.3)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def trend_collector():
    work = Path(tempfile.mkdtemp(prefix="cpt-trend-"))
    c = TrendCollector(work)
    yield c
    c.stop()
    shutil.rmtree(work, ignore_errors=True)


def trend_rows(collector):
    csv = read(collector.base, "/v1/trend?service=A&endpoint=" + urllib.parse.quote(ENDPOINT, safe="") + "&last=22d")
    head, *rows = [line.split(",") for line in csv.strip().splitlines()]
    return [dict(zip(head, r)) for r in rows]


def test_trend_shows_three_weeks_from_rollups_and_the_step_of_the_last_week(trend_collector, browser):
    c = trend_collector
    rows = trend_rows(c)
    assert sum(int(r["requests"]) for r in rows) == c.sent, "every request, raw or rolled up"
    assert {r["resolution_s"] for r in rows} == {"3600", "86400"}, "hours, then days past 14"
    now = time.time_ns()

    def age_days(r):
        t = time.strptime(r["start"][:19], "%Y-%m-%dT%H:%M:%S")
        return (now / 1e9 - time.mktime(t) + time.timezone) / 86400

    recent = [int(r["mean_ns"]) for r in rows if age_days(r) < 6.5]
    older = [int(r["mean_ns"]) for r in rows if 8 < age_days(r) < 13]
    step = sum(recent) / len(recent) - sum(older) / len(older)
    assert abs(step - SLOWER_NS) < 1_000_000, step

    signed_in(browser, c)
    browser.get(c.base + "/ui/trend?" + urllib.parse.urlencode({"service": "A", "endpoint": ENDPOINT, "last": "22d"}))
    points = browser.find_elements(By.CSS_SELECTOR, "figure.trend a circle")
    assert len(points) == 2 * len(rows), "a mean and a p99 point per period"
    legend = browser.find_element(By.CSS_SELECTOR, "figure.trend .legend").text
    assert "C1 (C)" in legend, legend
    shot(browser, "ui-trend.png", 1100)

    # A point opens its period's profile: the oldest hour, long past the
    # raw window, answered by the roll-ups.
    hours = [tr for tr in browser.find_elements(By.CSS_SELECTOR, "table.data tbody tr")
             if tr.find_elements(By.TAG_NAME, "td")[0].text.endswith("hour")]
    oldest = hours[-1]
    requests = oldest.find_elements(By.TAG_NAME, "td")[1].text
    browser.get(oldest.find_element(By.TAG_NAME, "a").get_attribute("href"))
    assert browser.find_element(By.ID, "requests").text == requests

    # The week-over-week comparison marks C1.
    browser.get(c.base + "/ui/trend?" + urllib.parse.urlencode({"service": "A", "endpoint": ENDPOINT, "last": "22d"}))
    browser.find_element(By.PARTIAL_LINK_TEXT, "Compare the last week").click()
    WebDriverWait(browser, 30).until(lambda d: "/ui/diff" in d.current_url)
    flagged = browser.find_elements(By.CSS_SELECTOR, "#changes tr.flagged")
    assert flagged and all(tr.get_attribute("data-stack").endswith("C1 (C)") for tr in flagged), \
        [tr.get_attribute("data-stack") for tr in flagged]
