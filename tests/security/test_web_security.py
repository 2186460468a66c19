"""Security checks of a running `cpt serve`, over plain HTTP as an attacker
or a curious colleague would send them: one test per finding of the web
pages' security review (open redirect after sign-in, forced records on an
open collector's pages, security headers, cross-site posts, queries too
large for the store, names no page may write raw or link wrongly), the
force credential's replay, DNS rebinding and proxies (allowed hosts,
trusted proxies), JSON errors and limits of 0, and what an open collector
counts and reads of a gzip body.

Run by .ci/run after `cargo build -p cpt-collector --bin cpt`:

    python -m pytest tests/security

It needs target/debug/cpt (CPT_BIN_DIR to look elsewhere) and pytest; the
requests are made with the standard library (http.client), never following
a redirect, so each answer is checked as the server sent it.
"""

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("CPT_BIN_DIR", ROOT / "target" / "debug"))
TOKEN = "s3cret-read-token"
# The limit every route applies to a query's parameters (server::MAX_QUERY_PARAMS).
MAX_QUERY_PARAMS = 64

if not (BIN / "cpt").exists():
    if os.environ.get("CPT_REQUIRE_SECURITY") == "1":
        raise RuntimeError(f"CPT_REQUIRE_SECURITY=1 but {BIN / 'cpt'} is missing (cargo build -p cpt-collector --bin cpt)")
    pytest.skip(f"missing {BIN / 'cpt'}", allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A minute ago: within `cpt serve`'s retention.
START_NS = time.time_ns() - 60_000_000_000


def record(service, endpoint, request_id, trigger="sampled", labels=None, callee="B"):
    """A record of 9 ms: the entry frame 3 ms, a call to `callee` 6 ms."""
    return {
        "service": service, "endpoint": endpoint, "trigger": trigger,
        "latency_ns": 9_000_000, "start_unix_nanos": START_NS,
        "request_id": request_id, "labels": labels or {},
        "path": [{"stack": ["handle"], "ns": 3_000_000},
                 {"stack": ["handle", {"name": "work", "service": callee}], "ns": 6_000_000}],
    }


# The forced records: a customer's request, forced by an operator. What
# only they hold (their ids, their label, their callee) must never be shown
# to a caller without the read token.
FORCED = [record("gateway", "GET /quote/{item}", f"forced-{i}", "forced",
                 {"ticket": f"INC-{i}", "customer": "ACME-7"}, callee="billing-secret")
          for i in range(3)]
FORCED_MARKS = ["forced-0", "forced-1", "forced-2", "ACME-7", "billing-secret"]
SAMPLED = [record("gateway", "GET /quote/{item}", f"sampled-{i}", labels={"arm": "a"}) for i in range(20)]
# A NUL byte and a space in service names, as a service may send them.
ODD = [record("edge\u0000gw", "GET /x", "odd-0", callee="quote service")]


class Collector:
    """A `cpt serve` on a free port, holding the records above."""

    def __init__(self, work, token, extra=(), records=FORCED + SAMPLED + ODD):
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        args = [BIN / "cpt", "serve", "--store", work / "store.db", "--grpc", "off",
                "--http", self.host, "--durability", "normal", *extra]
        if token:
            (work / "token").write_text(token + "\n")
            args += ["--read-token-file", work / "token"]
        self.token = token
        self.log = (work / "serve.log").open("w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("cpt serve did not start: " + (work / "serve.log").read_text())
            time.sleep(0.2)
        body = "".join(json.dumps(r) + "\n" for r in records)
        status, _, answer = self.request("POST", "/v1/records", body,
                                         {"Content-Type": "application/x-ndjson"})
        assert status == 200, answer

    def request(self, method, target, body=None, headers=None):
        """(status, headers with lowercase names, body text) of one request."""
        c = http.client.HTTPConnection(self.host, timeout=60)
        try:
            c.request(method, target, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            if data[:2] == b"\x1f\x8b":
                import gzip
                data = gzip.decompress(data)
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data.decode("utf-8", "replace")
        finally:
            c.close()

    def get(self, target, headers=None):
        return self.request("GET", target, headers=headers)

    def post_form(self, target, form, headers=None):
        h = {"Content-Type": "application/x-www-form-urlencoded"}
        h.update(headers or {})
        return self.request("POST", target, form, h)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def start(token, extra=(), records=FORCED + SAMPLED + ODD):
    work = Path(tempfile.mkdtemp(prefix="cpt-security-"))
    c = Collector(work, token, extra, records)
    return c, work


@contextlib.contextmanager
def serving(token, extra=(), records=FORCED + SAMPLED + ODD):
    """A collector for one test: started, then stopped and removed."""
    c, work = start(token, extra, records)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def open_collector():
    c, work = start(None)
    yield c
    c.stop()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def token_collector():
    c, work = start(TOKEN)
    yield c
    c.stop()
    shutil.rmtree(work, ignore_errors=True)


SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


# 1. Open redirect after sign-in ------------------------------------------------------------

# `next` as a form posts it (percent-encoded), and where the browser must go.
NEXT_CASES = [
    ("%2Fui%2Fprofile%3Fservice%3DA", "/ui/profile?service=A"),
    ("%2F%09%2Fevil.example", "/"),          # the review's finding: a tab browsers drop
    ("%2F%0A%2Fevil.example", "/"),
    ("%2F%0D%2Fevil.example", "/"),
    ("%2F%20%2Fevil.example", "/"),
    ("%2F+%2Fevil.example", "/"),
    ("%2F%00%2Fevil.example", "/"),
    ("%2F%C2%A0%2Fevil.example", "/"),
    ("%2F%2Fevil.example", "/"),
    ("%2F%5Cevil.example", "/"),
    ("%5C%5Cevil.example", "/"),
    ("https%3A%2F%2Fevil.example%2F", "/"),
    ("%252F%252Fevil.example", "/"),
    ("evil.example", "/"),
]


@pytest.mark.parametrize("next_value,want", NEXT_CASES)
def test_1_sign_in_sends_the_browser_only_to_a_path_on_this_site(token_collector, next_value, want):
    status, headers, _ = token_collector.post_form(
        "/ui/login", f"token={TOKEN}&next={next_value}", SAME_ORIGIN)
    assert status == 303
    assert headers["location"] == want


# 2. Forced records on an open collector's pages --------------------------------------------

OPEN_PROBES = [
    "/", "/?last=7d",
    "/ui/request?id=forced-1",
    "/ui/request?id=forced-1&wait=1s",
    "/ui/profile?service=gateway&trigger=forced",
    "/ui/profile?label=ticket%3DINC-1&trigger=all",
    "/ui/profile?service=gateway&trigger=all&sample=all",
    "/ui/flame.svg?request_id=forced-1",
    "/ui/flame.svg?service=gateway&trigger=all",
    "/ui/diff?base=trigger%3Dforced&test=trigger%3Dall",
    "/ui/diff.svg?base=request_id%3Dforced-1&test=trigger%3Dall",
    "/v1/records?trigger=all",
    "/v1/records?request_id=forced-1",
    "/profile?trigger=all",
    "/profile?request_id=forced-1",
]


@pytest.mark.parametrize("target", OPEN_PROBES)
def test_2_an_open_collector_shows_no_forced_record_on_any_page(open_collector, target):
    status, headers, body = open_collector.get(target)
    assert status in (200, 400, 403, 404), (status, body)
    shown = [m for m in FORCED_MARKS if m in body and m not in urllib.parse.unquote(target)]
    assert not shown, f"{target} shows {shown}:\n{body[:2000]}"
    assert headers.get("x-cpt-forced-records") == "withheld"


def test_2_the_read_token_shows_the_forced_records(token_collector):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, _, body = token_collector.get("/ui/request?id=forced-1", auth)
    assert status == 200 and "ACME-7" in body
    status, _, body = token_collector.get("/", auth)
    assert status == 200 and "forced-2" in body
    for target in OPEN_PROBES:
        status, _, body = token_collector.get(target)
        assert status == 401, target
        assert not [m for m in FORCED_MARKS + ["sampled-1"] if m in body]


# 3. Security headers -----------------------------------------------------------------------

PAGES = ["/", "/ui/profile?service=gateway", "/ui/request?id=sampled-1", "/ui/diff",
         "/ui/login", "/ui/style.css", "/ui/flame.svg?service=gateway", "/healthz",
         "/v1/records?service=gateway", "/profile?service=gateway", "/nope",
         # A target over the guard's limit (its 414), and one over the HTTP
         # parser's own (64 KiB: the parser's 414).
         "/ui/profile?service=" + "x" * 40_000, "/ui/profile?service=" + "x" * 70_000]


@pytest.mark.parametrize("target", PAGES)
def test_3_every_page_and_asset_carries_the_security_headers(open_collector, target):
    _, headers, _ = open_collector.get(target)
    csp = headers.get("content-security-policy", "")
    assert csp.startswith("default-src 'none'"), csp
    assert "unsafe-inline" not in csp and "*" not in csp, csp
    assert headers.get("x-content-type-options") == "nosniff"
    assert headers.get("referrer-policy") == "no-referrer"
    if target.startswith("/ui/flame.svg"):
        # Framed by the collector's own pages only; its script and style by hash.
        assert "frame-ancestors 'self'" in csp and headers.get("x-frame-options") == "SAMEORIGIN"
        assert "script-src 'sha256-" in csp and "style-src 'sha256-" in csp
    else:
        assert "frame-ancestors 'none'" in csp and headers.get("x-frame-options") == "DENY"


# 4. Cross-site posts -----------------------------------------------------------------------

CROSS_SITE = [
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "same-site"},
    {},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
@pytest.mark.parametrize("path", ["/ui/login", "/ui/logout"])
def test_4_a_post_from_another_site_neither_signs_in_nor_out(token_collector, path, headers):
    status, answer_headers, _ = token_collector.post_form(path, f"token={TOKEN}&next=%2F", headers)
    assert status == 403
    assert "set-cookie" not in answer_headers


def test_4_the_collectors_own_form_still_signs_in(token_collector):
    for headers in (SAME_ORIGIN, {"Origin": f"http://{token_collector.host}"}):
        status, answer_headers, _ = token_collector.post_form("/ui/login", f"token={TOKEN}&next=%2F", headers)
        assert status == 303 and "cpt_read_token=" in answer_headers["set-cookie"]


# 5. Queries too large for the store --------------------------------------------------------

LABELLED = ["/v1/records", "/ui/profile", "/ui/flame.svg", "/profile", "/", "/ui/request", "/ui/diff"]


@pytest.mark.parametrize("path", LABELLED)
def test_5_a_thousand_labels_are_a_400_naming_the_limit(open_collector, path):
    query = "&".join(f"label=k{i}%3Dv" for i in range(1000))
    status, _, body = open_collector.get(f"{path}?{query}")
    assert status == 400, body
    assert f"over the limit of {MAX_QUERY_PARAMS}" in body, body


def test_5_a_thousand_labels_inside_one_arm_are_a_400_too(open_collector):
    arm = urllib.parse.quote("&".join(f"label=k{i}=v" for i in range(1000)), safe="")
    status, _, body = open_collector.get(f"/ui/diff?base={arm}&test=service%3Dgateway")
    assert status == 400 and f"over the limit of {MAX_QUERY_PARAMS}" in body


# 6. Names no page may write raw or link wrongly --------------------------------------------

def test_6_a_nul_in_a_name_never_reaches_the_page_raw(open_collector):
    for target in ("/", "/ui/request?id=odd-0", "/ui/profile?service=edge%00gw"):
        status, _, body = open_collector.get(target)
        assert status == 200, (target, body)
        assert "\u0000" not in body, target
        assert "edge\u2400gw" in body, target


def test_6_a_service_with_a_space_links_to_its_own_profile(open_collector):
    _, _, body = open_collector.get("/")
    link = 'href="/ui/profile?service=edge%00gw&amp;endpoint=GET+%2Fx"'
    assert body.count(link) >= 3, body
    assert '<tr data-service="quote service">' in body
    status, _, profile = open_collector.get("/ui/profile?service=edge%00gw&endpoint=GET+%2Fx")
    assert status == 200 and "all 1 matching requests" in profile


# 7. Force credential replay ----------------------------------------------------------------

# The label a forced record carries with its credential's nonce (set by the
# service that accepted the credential), and the label the collector adds
# to a forced record whose nonce an earlier forced request carried
# (cpt_sdk::force::{NONCE_LABEL, REPLAYED_LABEL}).
NONCE_LABEL = "cpt.force.nonce"
REPLAYED_LABEL = "cpt.force.replayed"


def forced_with_nonce(request_id, nonce, start_ns):
    r = record("gateway", "GET /x", request_id, "forced", {NONCE_LABEL: nonce})
    r["start_unix_nanos"] = start_ns
    return r


def post_one(c, r):
    status, _, body = c.request("POST", "/v1/records", json.dumps(r) + "\n",
                                {"Content-Type": "application/x-ndjson"})
    assert status == 200, body


def labels_of(c, request_id):
    _, _, body = c.get(f"/v1/records?request_id={request_id}", {"Authorization": f"Bearer {TOKEN}"})
    return json.loads(body)["labels"]


def test_7_a_second_forced_request_with_the_same_nonce_is_labelled_replayed_across_a_restart():
    """The same credential forcing a second request, before and after the
    collector restarts (within the credential's lifetime), is labelled so an
    operator sees the replay; the first use is not."""
    work = Path(tempfile.mkdtemp(prefix="cpt-security-replay-"))
    now = time.time_ns()
    try:
        c = Collector(work, TOKEN)
        post_one(c, forced_with_nonce("replay-1", "n-42", now))
        post_one(c, forced_with_nonce("replay-2", "n-42", now + 1_000_000))
        assert REPLAYED_LABEL not in labels_of(c, "replay-1")
        assert labels_of(c, "replay-2").get(REPLAYED_LABEL) == "true"
        c.stop()
        # The same store after a restart still knows the nonce.
        c = Collector(work, TOKEN)
        post_one(c, forced_with_nonce("replay-3", "n-42", now + 2_000_000))
        assert labels_of(c, "replay-3").get(REPLAYED_LABEL) == "true"
        post_one(c, forced_with_nonce("fresh-1", "n-43", now + 3_000_000))
        assert REPLAYED_LABEL not in labels_of(c, "fresh-1")
        c.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


# 8. DNS rebinding, allowed hosts and trusted proxies ---------------------------------------

REBOUND = "rebind.attacker.example"


def test_8_a_page_that_rebinds_its_name_to_the_collector_reads_and_sends_nothing(open_collector):
    c = open_collector
    # What the attacker's page makes the browser send, once its name resolves to 127.0.0.1.
    rebound = {"Host": f"{REBOUND}:{c.port}", "Origin": f"http://{REBOUND}:{c.port}",
               "Sec-Fetch-Site": "same-origin"}
    for target in ("/", "/ui/profile?service=gateway", "/v1/records?service=gateway", "/healthz"):
        status, headers, body = c.get(target, rebound)
        assert status == 421, (target, status, body)
        assert headers["content-type"] == "application/json"
        assert "--allowed-host" in json.loads(body)["error"]
        assert "sampled-1" not in body
        assert headers.get("x-content-type-options") == "nosniff"
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", "")
    sent = record("gateway", "GET /quote/{item}", "rebound-0")
    status, _, body = c.request("POST", "/v1/records", json.dumps(sent) + "\n",
                                {**rebound, "Content-Type": "application/x-ndjson"})
    assert status == 421, body
    status, _, body = c.get("/v1/records?request_id=rebound-0")
    assert status == 200 and body == "", body


def test_8_the_collector_answers_to_its_address_localhost_and_allowed_names():
    with serving(None, ["--allowed-host", "cpt.example.com"], records=SAMPLED) as c:
        for host in (c.host, f"localhost:{c.port}", f"cpt.example.com:{c.port}", "cpt.example.com",
                     f"[::1]:{c.port}"):
            status, _, body = c.get("/v1/records?request_id=sampled-1", {"Host": host})
            assert status == 200 and "sampled-1" in body, (host, status, body)
        for host in (REBOUND, f"other.example.com:{c.port}", f"cpt.example.com.{REBOUND}"):
            status, _, _ = c.get("/healthz", {"Host": host})
            assert status == 421, host


# What a TLS-terminating proxy in front of the collector sends for a browser's sign-in at
# https://cpt.example.com (a browser without Fetch Metadata: Origin only).
PROXIED = {"X-Forwarded-Host": "cpt.example.com", "X-Forwarded-Proto": "https",
           "Origin": "https://cpt.example.com"}
PROXIED_RFC7239 = {"Forwarded": 'for=192.0.2.1;host="cpt.example.com";proto=https',
                   "Origin": "https://cpt.example.com"}


def test_8_behind_a_trusted_proxy_the_forwarded_host_signs_in():
    with serving(TOKEN, ["--allowed-host", "cpt.example.com", "--trusted-proxy", "127.0.0.1"],
                 records=SAMPLED) as c:
        for headers in (PROXIED, PROXIED_RFC7239):
            status, answer, body = c.post_form("/ui/login", f"token={TOKEN}&next=%2F", headers)
            assert status == 303, (headers, status, body)
            # The browser is on HTTPS: the cookie never travels in clear.
            assert "cpt_read_token=" in answer["set-cookie"] and "; Secure" in answer["set-cookie"]
        # The proxy forwards a rebound name: refused like one in Host.
        status, _, _ = c.get("/healthz", {"X-Forwarded-Host": REBOUND})
        assert status == 421


def test_8_from_an_untrusted_peer_the_forwarded_headers_are_ignored():
    # The proxy is trusted, but the request comes from this test's address, not the proxy's.
    with serving(TOKEN, ["--allowed-host", "cpt.example.com", "--trusted-proxy", "192.0.2.7"],
                 records=SAMPLED) as c:
        for headers in (PROXIED, PROXIED_RFC7239):
            status, answer, _ = c.post_form("/ui/login", f"token={TOKEN}&next=%2F", headers)
            assert status == 403, headers
            assert "set-cookie" not in answer
        # A forwarded rebound name is ignored too: the request's own Host counts.
        status, _, _ = c.get("/healthz", {"X-Forwarded-Host": REBOUND})
        assert status == 200


# 9. Every error is JSON, and every limit is at least 1 -------------------------------------

ERRORS = [
    ("GET", "/nope", 404),
    ("DELETE", "/v1/records", 405),
    ("GET", "/v1/records?" + "&".join(f"label=k{i}%3Dv" for i in range(100)), 400),
    ("GET", "/v1/trend", 400),
    ("GET", "/v1/trend?service=gateway&last=soon", 400),
    ("GET", "/ui/profile?service=" + "x" * 40_000, 414),
]


@pytest.mark.parametrize("method,target,want", ERRORS)
def test_9_every_error_of_the_api_and_the_guard_is_json(open_collector, method, target, want):
    status, headers, body = open_collector.request(method, target)
    assert status == want, body
    assert headers["content-type"] == "application/json", headers
    assert json.loads(body)["error"]


LIMIT_FLAGS = ["--max-batch-bytes", "--max-pending-batches", "--max-receiving-bodies",
               "--max-streams-per-connection", "--body-timeout", "--idle-timeout",
               "--header-read-timeout"]


@pytest.mark.parametrize("flag", LIMIT_FLAGS)
def test_9_a_limit_of_0_is_refused_naming_the_flag(flag, tmp_path):
    value = "0s" if flag.endswith("timeout") else "0"
    run = subprocess.run(
        [BIN / "cpt", "serve", "--store", tmp_path / "store.db", "--grpc", "off",
         "--http", f"127.0.0.1:{free_port()}", flag, value],
        capture_output=True, text=True, timeout=30)
    assert run.returncode != 0, f"{flag} {value} started: {run.stderr}"
    assert flag in run.stderr and "0" in run.stderr, run.stderr


# 10. Counts and bodies an open collector answers truly ---------------------------------------

def stats(c, headers=None):
    status, _, body = c.get("/v1/stats", headers)
    assert status == 200, body
    return json.loads(body)


def test_10_an_open_collector_counts_no_forced_record_in_its_stats():
    forced = [record("gateway", "GET /x", f"f-{i}", "forced") for i in range(2)]
    sampled = [record("gateway", "GET /x", f"s-{i}") for i in range(3)]
    with serving(None, records=forced + sampled) as c:
        s = stats(c)
        assert s["accepted_records"] == 3, s
    with serving(TOKEN, records=forced + sampled) as c:
        s = stats(c, {"Authorization": f"Bearer {TOKEN}"})
        assert s["accepted_records"] == 5, s


def test_10_a_gzip_body_of_two_members_is_read_whole(open_collector):
    import gzip
    members = b"".join(gzip.compress((json.dumps(record("gateway", "GET /x", f"gz-{i}")) + "\n").encode())
                       for i in range(2))
    status, _, body = open_collector.request(
        "POST", "/v1/records", members,
        {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})
    assert status == 200, body
    assert json.loads(body)["accepted_records"] == 2, body
    for i in range(2):
        _, _, found = open_collector.get(f"/v1/records?request_id=gz-{i}")
        assert f"gz-{i}" in found


def test_7_the_replay_is_the_use_that_started_later_whichever_arrives_first():
    """A long request that used the credential first ends, and so arrives,
    after its replay: the replay is labelled, in the store, not the
    original."""
    work = Path(tempfile.mkdtemp(prefix="cpt-security-replay-"))
    now = time.time_ns()
    try:
        c = Collector(work, TOKEN)
        post_one(c, forced_with_nonce("late-replay", "n-77", now + 5_000_000))
        post_one(c, forced_with_nonce("early-original", "n-77", now))
        assert REPLAYED_LABEL not in labels_of(c, "early-original")
        assert labels_of(c, "late-replay").get(REPLAYED_LABEL) == "true"
        # The same in one batch, the later first.
        body = "".join(json.dumps(forced_with_nonce(rid, "n-78", now + d)) + "\n"
                       for rid, d in (("batch-replay", 9_000_000), ("batch-original", 0)))
        status, _, answer = c.request("POST", "/v1/records", body,
                                      {"Content-Type": "application/x-ndjson"})
        assert status == 200, answer
        assert REPLAYED_LABEL not in labels_of(c, "batch-original")
        assert labels_of(c, "batch-replay").get(REPLAYED_LABEL) == "true"
        c.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
